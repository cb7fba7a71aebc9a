package verbs_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/cq/qpsim"
	"github.com/vfnic/vfnic/verbs"
)

// nicLike is the software device as a provider whose device does not
// filter solicited-only arms (as a NIC's, which interrupts on every
// completion): embedding the interface hides simverbs' NotifiesSolicited,
// so the verbs layer filters.
type nicLike struct{ verbs.Provider }

func (p nicLike) ResizeCQ(c *cq.CQ, entries, held int) (int, error) {
	return p.Provider.(verbs.Resizer).ResizeCQ(c, entries, held)
}

// swEnv is chEnv on a provider that leaves solicited filtering to verbs.
func swEnv(t *testing.T, flags verbs.CreateFlags) (*env, *verbs.CompChannel, *verbs.CQ, *qpsim.QP) {
	e := newEnv(t)
	ch, err := verbs.NewCompChannel()
	require.NoError(t, err)
	c, err := verbs.CreateCQ(nicLike{e.p}, verbs.CQInitAttr{CQE: 64, Channel: ch, Flags: flags})
	require.NoError(t, err)
	a := e.qp(c, false)
	t.Cleanup(func() {
		_ = a.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = c.Destroy(ctx)
		_ = ch.Close()
	})
	return e, ch, c, a
}

// On a device that interrupts on every completion, a solicited-only arm
// fires for an error and for nothing else (no messaging layer carries a
// solicited bit); the completions the CQ looked at while it waited are
// read afterwards in order, none lost.
func TestReqNotifySolicitedFilteredInSoftware(t *testing.T) {
	e, ch, c, a := swEnv(t, 0)
	present, err := c.ReqNotify(true)
	require.NoError(t, err)
	require.False(t, present)
	e.recv(a, 100)
	e.send(a, a, 1, 10, qpsim.SendOpts{})                         // a receive and a send
	e.send(a, nowhere(a), 2, 10, qpsim.SendOpts{Solicited: true}) // solicited success: not an error
	noEvent(t, ch, 50*time.Millisecond)

	require.NoError(t, e.d.Inject(c.FI(), qpsim.Fault{Kind: qpsim.FaultErrorStatus, Status: qpsim.StatusGeneralErr}))
	e.send(a, nowhere(a), 3, 10, qpsim.SendOpts{})
	got, _ := getEvent(t, ch)
	require.Same(t, c, got)
	c.AckEvents(1)
	e.send(a, nowhere(a), 4, 10, qpsim.SendOpts{}) // after the event: stays in the ring
	wcs := drain(t, c)
	require.Len(t, wcs, 5)
	ids := []uint64{}
	for _, w := range wcs {
		ids = append(ids, w.WRID)
	}
	require.ElementsMatch(t, []uint64{100, 1, 2, 3, 4}, ids)
	require.Equal(t, uint64(3), wcs[3].WRID, "the error in its place: %v", ids)
	require.Equal(t, verbs.WCGeneralErr, wcs[3].Status)
	require.Equal(t, uint64(4), wcs[4].WRID)
	for _, i := range []int{0, 1, 2, 4} {
		require.Equal(t, verbs.WCSuccess, wcs[i].Status)
	}
}

// An error already in the CQ at a solicited-only arm raises no event (the
// arm reports it present), nor does it later when successes arrive; the
// next error does.
func TestReqNotifySolicitedPresentError(t *testing.T) {
	e, ch, c, a := swEnv(t, 0)
	require.NoError(t, e.d.Inject(c.FI(), qpsim.Fault{Kind: qpsim.FaultErrorStatus, Status: qpsim.StatusGeneralErr}))
	e.send(a, nowhere(a), 1, 10, qpsim.SendOpts{})
	present, err := c.ReqNotify(true)
	require.NoError(t, err)
	require.True(t, present)
	e.send(a, nowhere(a), 2, 10, qpsim.SendOpts{})
	noEvent(t, ch, 50*time.Millisecond)
	// Arming again while the arm is pending changes nothing.
	present, err = c.ReqNotify(true)
	require.NoError(t, err)
	require.True(t, present)
	noEvent(t, ch, 20*time.Millisecond)

	require.NoError(t, e.d.Inject(c.FI(), qpsim.Fault{Kind: qpsim.FaultErrorStatus, Status: qpsim.StatusLocalLenErr}))
	e.send(a, nowhere(a), 3, 10, qpsim.SendOpts{})
	getEvent(t, ch)
	c.AckEvents(1)
	wcs := drain(t, c)
	require.Len(t, wcs, 3)
	for i, w := range wcs {
		require.Equal(t, uint64(i+1), w.WRID)
	}
	require.Equal(t, verbs.WCGeneralErr, wcs[0].Status)
	require.Equal(t, verbs.WCSuccess, wcs[1].Status)
	require.NotEqual(t, verbs.WCSuccess, wcs[2].Status)

	// Next takes precedence over a pending solicited-only arm.
	_, err = c.ReqNotify(true)
	require.NoError(t, err)
	_, err = c.ReqNotify(false)
	require.NoError(t, err)
	e.send(a, nowhere(a), 4, 10, qpsim.SendOpts{})
	getEvent(t, ch)
	c.AckEvents(1)
	require.Len(t, drain(t, c), 1)
}

// Completions the CQ holds for the filter count towards a resize: a size
// below them fails and loses nothing.
func TestResizeCountsFilteredCompletions(t *testing.T) {
	e, ch, c, a := swEnv(t, 0)
	_ = ch
	_, err := c.ReqNotify(true)
	require.NoError(t, err)
	for i := range 6 {
		e.send(a, nowhere(a), uint64(i), 10, qpsim.SendOpts{})
	}
	noEvent(t, ch, 50*time.Millisecond) // the handler has taken them by now
	err = c.Resize(4)
	if errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("resize: %v", err)
	}
	require.Error(t, err, "6 completions held")
	require.NoError(t, c.Resize(8))
	wcs := drain(t, c)
	require.Len(t, wcs, 6)
	for i, w := range wcs {
		require.Equal(t, uint64(i), w.WRID)
	}
}

// A SingleThreaded CQ takes no lock, so its ring cannot be read by the
// interrupt handler: a solicited-only arm that the device does not filter
// is refused there; a "next" arm works.
func TestReqNotifySolicitedSingleThreaded(t *testing.T) {
	e, ch, c, a := swEnv(t, verbs.SingleThreaded)
	_, err := c.ReqNotify(true)
	require.ErrorIs(t, err, errors.ErrUnsupported)
	_, err = c.ReqNotify(false)
	require.NoError(t, err)
	e.send(a, nowhere(a), 1, 10, qpsim.SendOpts{})
	getEvent(t, ch)
	c.AckEvents(1)
}
