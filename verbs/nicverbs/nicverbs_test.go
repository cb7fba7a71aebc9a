package nicverbs_test

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/cq/ring"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/verbs"
	"github.com/vfnic/vfnic/verbs/nicverbs"
)

// pairs is a nic.Device with 4 queue pairs; the provider calls nothing
// else of it here.
type pairs struct{ nic.Device }

func (pairs) QueuePairs() int { return 4 }

// queue is a device queue with n completions ready, as a bound queue's
// ring is read (nic.Device.BindCQ adds a ring.QueueSource over it).
type queue struct{ n int }

func (q *queue) ReadBatch(qs *ring.QueueSource, ents []cq.Entry, _ *ring.Completion) (int, bool) {
	k := min(q.n, len(ents))
	for i := range k {
		qs.Store(&ents[i], &ring.Completion{Context: uint64(i), Len: 64})
	}
	q.n -= k
	return k, false
}
func (q *queue) Pending(max int) int                        { return min(q.n, max) }
func (*queue) Arm(bool, int) error                          { return nil }
func (*queue) StrError(cq.ProvErrno, []byte) (string, bool) { return "", false }
func (*queue) Unbind() error                                { return nil }

// A NIC CQ honours IgnoreOverrun: it reads the queues' own rings, so more
// completions than its size are read, with no overrun.
func TestIgnoreOverrun(t *testing.T) {
	p := nicverbs.New(pairs{})
	require.NotZero(t, verbs.QueryDevice(p).Flags&verbs.IgnoreOverrun)
	c, err := verbs.CreateCQ(p, verbs.CQInitAttr{CQE: 4, Flags: verbs.IgnoreOverrun})
	require.NoError(t, err)
	q := &queue{n: 3*c.CQE() + 1}
	require.NoError(t, c.FI().Driver().Bind())
	require.NoError(t, c.FI().Driver().AddSource(ring.NewQueueSource(q, "tx0", 1)))
	wcs := make([]verbs.WC, 2)
	got := 0
	for {
		n, err := c.Poll(wcs)
		require.NoError(t, err)
		if n == 0 {
			break
		}
		got += n
	}
	require.Equal(t, 3*c.CQE()+1, got)
	present, err := c.ReqNotify(false)
	require.NoError(t, err)
	require.False(t, present)
	c.FI().Driver().Unbind()
	require.NoError(t, c.Close())
}

// A NIC CQ resizes as rdma-core's test_cq.py asks (3, then 1, then 7),
// never below the completions it holds (in the rings and in the verbs
// layer's buffer), and loses none of them.
func TestResize(t *testing.T) {
	p := nicverbs.New(pairs{})
	require.True(t, verbs.QueryDevice(p).Resize)
	c, err := verbs.CreateCQ(p, verbs.CQInitAttr{CQE: 3})
	require.NoError(t, err)
	for _, n := range []int{1, 7} {
		require.NoError(t, c.Resize(n))
		require.Equal(t, n, c.CQE())
	}
	q := &queue{n: 5}
	require.NoError(t, c.FI().Driver().Bind())
	require.NoError(t, c.FI().Driver().AddSource(ring.NewQueueSource(q, "tx0", 1)))
	require.ErrorIs(t, c.Resize(4), os.ErrInvalid, "5 held in the ring")
	require.Equal(t, 7, c.CQE())
	// One taken into the verbs buffer, 4 left in the ring: still 5.
	require.NoError(t, c.StartPoll())
	require.Equal(t, uint64(0), c.WRID())
	c.EndPoll()
	require.ErrorIs(t, c.Resize(3), os.ErrInvalid, "4 held")
	require.NoError(t, c.Resize(4))
	wcs := make([]verbs.WC, 8)
	n, err := c.Poll(wcs)
	require.NoError(t, err)
	require.Equal(t, 4, n)
	for i, w := range wcs[:n] {
		require.Equal(t, uint64(i+1), w.WRID)
	}
	require.ErrorIs(t, c.Resize(verbs.QueryDevice(p).MaxCQE+1), os.ErrInvalid)
	c.FI().Driver().Unbind()
	require.NoError(t, c.Close())
}

// closing is a queue that closes: then its arm fails, as a closed NIC
// queue's does, and it reads its outstanding operations as flushed.
type closing struct {
	queue
	closed  atomic.Bool // set by the test, read by the CQ's handler
	flushed []uint64
}

func (q *closing) ReadBatch(qs *ring.QueueSource, ents []cq.Entry, bad *ring.Completion) (int, bool) {
	if !q.closed.Load() || len(q.flushed) == 0 {
		return 0, false
	}
	*bad = ring.Completion{Context: q.flushed[0], Flags: cq.FlagRecv | cq.FlagMsg, Err: cq.ECANCELED}
	q.flushed = q.flushed[1:]
	return 0, true
}

func (q *closing) Pending(max int) int { return min(len(q.flushed), max) }

func (q *closing) Arm(bool, int) error {
	if q.closed.Load() {
		return fmt.Errorf("queue closed: %w", os.ErrClosed)
	}
	return nil
}

// A solicited-only arm, filtered by the verbs layer for a NIC, fires for
// the flushed completions of a queue that closed, although arming that
// queue again fails.
func TestSolicitedFiresOnFlushAtClose(t *testing.T) {
	p := nicverbs.New(pairs{})
	ch, err := verbs.NewCompChannel()
	require.NoError(t, err)
	c, err := verbs.CreateCQ(p, verbs.CQInitAttr{CQE: 8, Channel: ch})
	require.NoError(t, err)
	q := &closing{flushed: []uint64{7, 8}}
	require.NoError(t, c.FI().Driver().Bind())
	require.NoError(t, c.FI().Driver().AddSource(ring.NewQueueSource(q, "rx0", 0)))
	present, err := c.ReqNotify(true)
	require.NoError(t, err)
	require.False(t, present)
	q.closed.Store(true) // as the driver does at close, then it signals the CQ
	require.NoError(t, c.FI().Driver().Interrupt().Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	got, _, err := ch.GetEvent(ctx)
	cancel()
	require.NoError(t, err)
	require.Same(t, c, got)
	c.AckEvents(1)
	wcs := make([]verbs.WC, 4)
	n, err := c.Poll(wcs)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	for i, w := range wcs[:n] {
		require.Equal(t, uint64(7+i), w.WRID)
		require.Equal(t, verbs.WCWRFlushErr, w.Status)
		require.Equal(t, verbs.WCRecv, w.Opcode)
	}
	c.FI().Driver().Unbind()
	require.NoError(t, c.Close())
	require.NoError(t, ch.Close())
}
