package verbs_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/cq/qpsim"
	"github.com/vfnic/vfnic/verbs"
	"github.com/vfnic/vfnic/verbs/simverbs"
)

// env is a software device with its verbs provider.
type env struct {
	t   testing.TB
	d   *qpsim.Device
	p   *simverbs.Provider
	mem *qpsim.Memory
	off int
}

func newEnv(t testing.TB) *env {
	t.Helper()
	d, err := qpsim.New(qpsim.Config{})
	require.NoError(t, err)
	mem, err := d.Alloc(1 << 20)
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	return &env{t: t, d: d, p: simverbs.New(d), mem: mem}
}

// cq creates a CQ, destroyed at cleanup (after the device's QPs close).
func (e *env) cq(attr verbs.CQInitAttr) *verbs.CQ {
	e.t.Helper()
	c, err := verbs.CreateCQ(e.p, attr)
	require.NoError(e.t, err)
	return c
}

// qp makes a queue pair reporting to c (send and receive).
func (e *env) qp(c *verbs.CQ, flush bool) *qpsim.QP {
	e.t.Helper()
	q, err := e.d.NewQP(qpsim.QPConfig{SendCQ: c.FI(), RecvCQ: c.FI(), Source: true, FlushOnClose: flush})
	require.NoError(e.t, err)
	return q
}

// recv posts a 2 KiB receive buffer with id wrid.
func (e *env) recv(q *qpsim.QP, wrid uint64) {
	e.t.Helper()
	b := e.mem.Bytes()[e.off : e.off+2048 : e.off+2048]
	e.off = (e.off + 2048) % len(e.mem.Bytes())
	require.NoError(e.t, q.PostRecv(wrid, b, qpsim.RecvOpts{}))
}

// send posts one send of n bytes with id wrid to dest and waits until the
// device has written its completions.
func (e *env) send(q *qpsim.QP, dest *qpsim.QP, wrid uint64, n int, o qpsim.SendOpts) {
	e.t.Helper()
	require.NoError(e.t, q.Send(dest.Addr(), wrid, make([]byte, n), o))
	require.NoError(e.t, q.Flush(context.Background()))
	require.NoError(e.t, e.d.Sync(context.Background()))
}

// nowhere is an address no QP has: the send completes, the frame is
// dropped.
func nowhere(q *qpsim.QP) *qpsim.QP { return q }

// noEvent checks that no event arrives on ch within d.
func noEvent(t *testing.T, ch *verbs.CompChannel, d time.Duration) {
	t.Helper()
	time.Sleep(d)
	_, _, err := ch.TryGetEvent()
	require.ErrorIs(t, err, verbs.ErrNoEvent)
}

// getEvent waits up to 5 s for an event.
func getEvent(t *testing.T, ch *verbs.CompChannel) (*verbs.CQ, any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, cctx, err := ch.GetEvent(ctx)
	require.NoError(t, err)
	return c, cctx
}

// drain polls c until it is empty and returns the completions.
func drain(t testing.TB, c *verbs.CQ) []verbs.WC {
	t.Helper()
	var out []verbs.WC
	wcs := make([]verbs.WC, 16)
	for {
		n, err := c.Poll(wcs)
		require.NoError(t, err)
		if n == 0 {
			return out
		}
		out = append(out, wcs[:n]...)
	}
}

func newProvider(d *qpsim.Device) *simverbs.Provider { return simverbs.New(d) }
