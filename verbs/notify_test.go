package verbs_test

import (
	"context"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/cq/qpsim"
	"github.com/vfnic/vfnic/verbs"
	"golang.org/x/sys/unix"
)

// chEnv is a CQ on a channel with a QP that reports to it.
func chEnv(t *testing.T) (*env, *verbs.CompChannel, *verbs.CQ, *qpsim.QP) {
	e := newEnv(t)
	ch, err := verbs.NewCompChannel()
	require.NoError(t, err)
	c := e.cq(verbs.CQInitAttr{CQE: 64, Channel: ch, Context: "cq-ctx"})
	a := e.qp(c, false)
	t.Cleanup(func() {
		_ = a.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = c.Destroy(ctx) // a failed test may leave events unacknowledged
		_ = ch.Close()
	})
	return e, ch, c, a
}

// An arm gives one event for the next completion, returned with the CQ
// and its context.
func TestReqNotifyNext(t *testing.T) {
	e, ch, c, a := chEnv(t)
	present, err := c.ReqNotify(false)
	require.NoError(t, err)
	require.False(t, present)
	noEvent(t, ch, 10*time.Millisecond)
	e.send(a, nowhere(a), 1, 10, qpsim.SendOpts{})
	got, ctx := getEvent(t, ch)
	require.Same(t, c, got)
	require.Equal(t, "cq-ctx", ctx)
	c.AckEvents(1)
	require.Len(t, drain(t, c), 1)
	// One-shot: no arm, no event.
	e.send(a, nowhere(a), 2, 10, qpsim.SendOpts{})
	noEvent(t, ch, 20*time.Millisecond)
}

// Completions already in the CQ at the arm raise no event, and the arm
// reports them; a later one does.
func TestReqNotifyPresentEntries(t *testing.T) {
	e, ch, c, a := chEnv(t)
	e.send(a, nowhere(a), 1, 10, qpsim.SendOpts{})
	present, err := c.ReqNotify(false)
	require.NoError(t, err)
	require.True(t, present)
	noEvent(t, ch, 30*time.Millisecond)
	// The arm is pending: a completion after it fires.
	e.send(a, nowhere(a), 2, 10, qpsim.SendOpts{})
	getEvent(t, ch)
	c.AckEvents(1)
	// Entries taken into the iterator's buffer and not consumed count.
	require.NoError(t, c.StartPoll())
	c.EndPoll() // consumes 1; 2 stays buffered
	present, err = c.ReqNotify(false)
	require.NoError(t, err)
	require.True(t, present)
	noEvent(t, ch, 20*time.Millisecond)
	require.Len(t, drain(t, c), 1)
	e.send(a, nowhere(a), 3, 10, qpsim.SendOpts{})
	getEvent(t, ch)
	c.AckEvents(1)
}

// Arming again before the event gives one event.
func TestReqNotifyRepeated(t *testing.T) {
	e, ch, c, a := chEnv(t)
	for range 3 {
		_, err := c.ReqNotify(false)
		require.NoError(t, err)
	}
	_, err := c.ReqNotify(true)
	require.NoError(t, err)
	for i := range 3 {
		e.send(a, nowhere(a), uint64(i), 10, qpsim.SendOpts{})
	}
	getEvent(t, ch)
	noEvent(t, ch, 30*time.Millisecond)
	c.AckEvents(1)
}

// A device interrupt that is lost costs one event, not every later one:
// each ReqNotify arms the device again, even while an arm is pending.
func TestReqNotifyAfterLostInterrupt(t *testing.T) {
	e, ch, c, a := chEnv(t)
	require.NoError(t, e.d.Inject(c.FI(), qpsim.Fault{Kind: qpsim.FaultLostIRQ}))
	_, err := c.ReqNotify(false)
	require.NoError(t, err)
	e.send(a, nowhere(a), 1, 10, qpsim.SendOpts{})
	noEvent(t, ch, 30*time.Millisecond) // lost, as injected
	require.Len(t, drain(t, c), 1)
	for i := range 3 {
		present, err := c.ReqNotify(i%2 == 1) // solicited on a pending next stays next
		require.NoError(t, err)
		require.False(t, present)
		e.send(a, nowhere(a), uint64(2+i), 10, qpsim.SendOpts{})
		getEvent(t, ch)
		c.AckEvents(1)
		noEvent(t, ch, 10*time.Millisecond)
		require.Len(t, drain(t, c), 1)
		if i == 0 {
			// Lose the next one while an arm is pending, then arm again.
			require.NoError(t, e.d.Inject(c.FI(), qpsim.Fault{Kind: qpsim.FaultLostIRQ}))
			_, err := c.ReqNotify(false)
			require.NoError(t, err)
			e.send(a, nowhere(a), 100, 10, qpsim.SendOpts{})
			noEvent(t, ch, 30*time.Millisecond)
			require.Len(t, drain(t, c), 1)
			_, err = c.ReqNotify(false)
			require.NoError(t, err)
		}
	}
}

// Solicited-only fires for a solicited receive or an error, not for other
// completions; a "next" arm takes precedence over a solicited one.
func TestReqNotifySolicited(t *testing.T) {
	e, ch, c, a := chEnv(t)
	_, err := c.ReqNotify(true)
	require.NoError(t, err)
	e.recv(a, 100)
	e.send(a, a, 1, 10, qpsim.SendOpts{}) // a receive and a send, unsolicited
	noEvent(t, ch, 30*time.Millisecond)
	e.recv(a, 101)
	e.send(a, a, 2, 10, qpsim.SendOpts{Solicited: true})
	getEvent(t, ch)
	c.AckEvents(1)
	require.Len(t, drain(t, c), 4)

	// An error completion is solicited.
	_, err = c.ReqNotify(true)
	require.NoError(t, err)
	require.NoError(t, e.d.Inject(c.FI(), qpsim.Fault{Kind: qpsim.FaultErrorStatus, Status: qpsim.StatusGeneralErr}))
	e.send(a, nowhere(a), 3, 10, qpsim.SendOpts{})
	getEvent(t, ch)
	c.AckEvents(1)
	wcs := drain(t, c)
	require.Len(t, wcs, 1)
	require.Equal(t, verbs.WCGeneralErr, wcs[0].Status)

	// Solicited, then next: an unsolicited completion fires.
	_, err = c.ReqNotify(true)
	require.NoError(t, err)
	_, err = c.ReqNotify(false)
	require.NoError(t, err)
	e.send(a, nowhere(a), 4, 10, qpsim.SendOpts{})
	getEvent(t, ch)
	c.AckEvents(1)
	// Next, then solicited: still next.
	require.Len(t, drain(t, c), 1)
	_, err = c.ReqNotify(false)
	require.NoError(t, err)
	_, err = c.ReqNotify(true)
	require.NoError(t, err)
	e.send(a, nowhere(a), 5, 10, qpsim.SendOpts{})
	getEvent(t, ch)
	c.AckEvents(1)
}

// One channel serves several CQs, each event naming its CQ and context.
func TestChannelSeveralCQs(t *testing.T) {
	e := newEnv(t)
	ch, err := verbs.NewCompChannel()
	require.NoError(t, err)
	c1 := e.cq(verbs.CQInitAttr{CQE: 16, Channel: ch, Context: 1})
	c2 := e.cq(verbs.CQInitAttr{CQE: 16, Channel: ch, Context: 2})
	q1, q2 := e.qp(c1, false), e.qp(c2, false)
	for _, c := range []*verbs.CQ{c1, c2} {
		_, err := c.ReqNotify(false)
		require.NoError(t, err)
	}
	e.send(q2, nowhere(q2), 1, 10, qpsim.SendOpts{})
	got, ctx := getEvent(t, ch)
	require.Same(t, c2, got)
	require.Equal(t, 2, ctx)
	e.send(q1, nowhere(q1), 1, 10, qpsim.SendOpts{})
	got, ctx = getEvent(t, ch)
	require.Same(t, c1, got)
	require.Equal(t, 1, ctx)
	c1.AckEvents(1)
	c2.AckEvents(1)
	// A channel still used is busy.
	require.ErrorIs(t, ch.Close(), cq.ErrBusy)
	require.NoError(t, q1.Close())
	require.NoError(t, q2.Close())
	require.NoError(t, c1.Close())
	require.ErrorIs(t, ch.Close(), cq.ErrBusy)
	require.NoError(t, c2.Close())
	require.NoError(t, ch.Close())
	require.Equal(t, -1, ch.Fd())
	_, err = verbs.CreateCQ(e.p, verbs.CQInitAttr{CQE: 1, Channel: ch})
	require.ErrorIs(t, err, os.ErrClosed)
}

// A channel still used by CQs is busy: the error says so in its own words
// and matches both cq.ErrBusy and EBUSY. So is a CQ with a queue bound.
func TestChannelCloseBusy(t *testing.T) {
	e := newEnv(t)
	ch, err := verbs.NewCompChannel()
	require.NoError(t, err)
	c1 := e.cq(verbs.CQInitAttr{CQE: 8, Channel: ch})
	c2 := e.cq(verbs.CQInitAttr{CQE: 8, Channel: ch})
	err = ch.Close()
	require.ErrorIs(t, err, cq.ErrBusy)
	require.ErrorIs(t, err, syscall.EBUSY)
	require.EqualError(t, err, "verbs: completion channel used by 2 CQs")
	require.NoError(t, c1.Close())
	err = ch.Close()
	require.ErrorIs(t, err, syscall.EBUSY)
	require.EqualError(t, err, "verbs: completion channel used by 1 CQ")

	a := e.qp(c2, false)
	err = c2.Close()
	require.ErrorIs(t, err, cq.ErrBusy)
	require.ErrorIs(t, err, syscall.EBUSY)
	require.NoError(t, a.Close())
	require.NoError(t, c2.Close())
	require.NoError(t, ch.Close())
}

// The channel's descriptor works with epoll: readable while an event is
// queued, not after it is taken.
func TestChannelEpoll(t *testing.T) {
	e, ch, c, a := chEnv(t)
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	require.NoError(t, err)
	defer unix.Close(ep)
	require.NoError(t, unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, ch.Fd(), &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(ch.Fd())}))
	evs := make([]unix.EpollEvent, 1)
	wait := func(ms int) int {
		for {
			n, err := unix.EpollWait(ep, evs, ms)
			if err == unix.EINTR {
				continue
			}
			require.NoError(t, err)
			return n
		}
	}
	_, err = c.ReqNotify(false)
	require.NoError(t, err)
	require.Zero(t, wait(10))
	e.send(a, nowhere(a), 1, 10, qpsim.SendOpts{})
	require.Equal(t, 1, wait(5000))
	got, _, err := ch.TryGetEvent()
	require.NoError(t, err)
	require.Same(t, c, got)
	require.Zero(t, wait(0))
	c.AckEvents(1)
}

// GetEvent ends with its context; Close wakes it with os.ErrClosed.
func TestGetEventContextAndClose(t *testing.T) {
	ch, err := verbs.NewCompChannel()
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, _, err = ch.GetEvent(ctx)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	//nolint:staticcheck // a nil context is refused, not a panic
	_, _, err = ch.GetEvent(nil)
	require.ErrorIs(t, err, os.ErrInvalid)
	done := make(chan error, 1)
	go func() { _, _, err := ch.GetEvent(context.Background()); done <- err }()
	time.Sleep(10 * time.Millisecond)
	require.NoError(t, ch.Close())
	select {
	case err := <-done:
		require.ErrorIs(t, err, os.ErrClosed)
	case <-time.After(5 * time.Second):
		t.Fatal("GetEvent not woken by Close")
	}
}

// Destroy waits for unacknowledged events, or reports them at its
// deadline and leaves the CQ usable; it is busy while a QP is bound.
func TestDestroyUnackedEvents(t *testing.T) {
	e := newEnv(t)
	ch, err := verbs.NewCompChannel()
	require.NoError(t, err)
	c := e.cq(verbs.CQInitAttr{CQE: 16, Channel: ch})
	a := e.qp(c, false)
	_, err = c.ReqNotify(false)
	require.NoError(t, err)
	e.send(a, nowhere(a), 1, 10, qpsim.SendOpts{})
	getEvent(t, ch)
	require.ErrorIs(t, c.Close(), cq.ErrBusy)
	require.NoError(t, a.Close())

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err = c.Destroy(ctx)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	require.Contains(t, err.Error(), "1 unacknowledged event")
	require.Len(t, drain(t, c), 1) // still usable

	go func() {
		time.Sleep(20 * time.Millisecond)
		c.AckEvents(1)
	}()
	t0 := time.Now()
	require.NoError(t, c.Destroy(context.Background()))
	require.GreaterOrEqual(t, time.Since(t0), 15*time.Millisecond)
	require.NoError(t, c.Destroy(context.Background())) // idempotent
	require.NoError(t, ch.Close())
}

// A Destroy waiting for another, which waits for an acknowledgment, ends
// with its context; Resize does not wait for that Destroy (the goroutine
// that would acknowledge may be the one resizing).
func TestDestroyContextWhileAnotherWaits(t *testing.T) {
	e := newEnv(t)
	ch, err := verbs.NewCompChannel()
	require.NoError(t, err)
	c := e.cq(verbs.CQInitAttr{CQE: 16, Channel: ch})
	a := e.qp(c, false)
	_, err = c.ReqNotify(false)
	require.NoError(t, err)
	e.send(a, nowhere(a), 1, 10, qpsim.SendOpts{})
	getEvent(t, ch)
	require.NoError(t, a.Close())
	first := make(chan error, 1)
	go func() { first <- c.Destroy(context.Background()) }() // waits for the ack
	time.Sleep(20 * time.Millisecond)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	second := make(chan error, 1)
	go func() { second <- c.Destroy(ctx) }()
	select {
	case err := <-second:
		require.ErrorIs(t, err, os.ErrDeadlineExceeded)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Contains(t, err.Error(), "another Destroy")
	case <-time.After(5 * time.Second):
		t.Fatal("a second Destroy blocked past its deadline")
	}
	cctx, ccancel := context.WithCancel(context.Background())
	ccancel()
	err = c.Destroy(cctx)
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, os.ErrDeadlineExceeded)

	resized := make(chan error, 1)
	go func() { resized <- c.Resize(32) }()
	select {
	case err := <-resized:
		require.NoError(t, err)
		require.GreaterOrEqual(t, c.CQE(), 32)
	case <-time.After(5 * time.Second):
		t.Fatal("Resize blocked while Destroy waits for an acknowledgment")
	}
	require.Len(t, drain(t, c), 1) // still usable

	c.AckEvents(1)
	select {
	case err := <-first:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Destroy not done after the acknowledgment")
	}
	require.ErrorIs(t, c.Resize(16), os.ErrClosed)
	require.NoError(t, ch.Close())
}

// A Destroy waiting for another goroutine's open batch ends with its
// context and leaves the CQ usable.
func TestDestroyContextWhileBatchOpen(t *testing.T) {
	e := newEnv(t)
	c := e.cq(verbs.CQInitAttr{CQE: 16})
	a := e.qp(c, false)
	e.send(a, nowhere(a), 1, 10, qpsim.SendOpts{})
	e.send(a, nowhere(a), 2, 10, qpsim.SendOpts{})
	require.NoError(t, a.Close())
	require.NoError(t, c.StartPoll())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Destroy(ctx) }()
	select {
	case err := <-done:
		require.ErrorIs(t, err, os.ErrDeadlineExceeded)
		require.Contains(t, err.Error(), "batch")
	case <-time.After(5 * time.Second):
		c.EndPoll()
		t.Fatal("Destroy blocked past its deadline on an open batch")
	}
	require.Equal(t, uint64(1), c.WRID())
	c.EndPoll()
	wcs := drain(t, c)
	require.Len(t, wcs, 1)
	require.Equal(t, uint64(2), wcs[0].WRID)

	// Cancelled while the batch is open: the context's error.
	require.NoError(t, c.Close()) // nothing open: fine
	c = e.cq(verbs.CQInitAttr{CQE: 16})
	a = e.qp(c, false)
	e.send(a, nowhere(a), 3, 10, qpsim.SendOpts{})
	require.NoError(t, a.Close())
	require.NoError(t, c.StartPoll())
	cctx, ccancel := context.WithCancel(context.Background())
	go func() { done <- c.Destroy(cctx) }()
	time.Sleep(10 * time.Millisecond)
	ccancel()
	select {
	case err := <-done:
		require.ErrorIs(t, err, context.Canceled)
		require.NotErrorIs(t, err, os.ErrDeadlineExceeded)
	case <-time.After(5 * time.Second):
		c.EndPoll()
		t.Fatal("Destroy blocked past its cancellation on an open batch")
	}
	c.EndPoll()
	require.NoError(t, c.Close())
}

// A Destroy that fails after it stopped GetEvent returning the CQ (its
// events acknowledged, it waits for an open batch, then a queue bound
// meanwhile makes it busy) loses none of the CQ's events: one the device
// raised meanwhile, and one queued before that GetEvent passed over.
func TestDestroyFailureKeepsEvents(t *testing.T) {
	// failing starts a Destroy that will fail: it passes the bound check
	// and its acknowledgments, then waits for the batch the caller holds;
	// bind makes it busy. It returns Destroy's result and the new QP.
	failing := func(t *testing.T, e *env, c *verbs.CQ) (<-chan error, *qpsim.QP) {
		done := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			done <- c.Destroy(ctx)
		}()
		time.Sleep(20 * time.Millisecond) // past the bound check
		return done, e.qp(c, false)
	}
	end := func(t *testing.T, ch *verbs.CompChannel, c *verbs.CQ, done <-chan error, b *qpsim.QP) {
		c.EndPoll()
		err := <-done
		require.ErrorIs(t, err, cq.ErrBusy)
		require.ErrorIs(t, err, syscall.EBUSY)
		got, _ := getEvent(t, ch)
		require.Same(t, c, got)
		c.AckEvents(1)
		require.NoError(t, b.Close())
	}

	t.Run("raised", func(t *testing.T) {
		e, ch, c, a := chEnv(t)
		_, err := c.ReqNotify(false)
		require.NoError(t, err)
		e.send(a, nowhere(a), 1, 10, qpsim.SendOpts{})
		getEvent(t, ch) // acknowledged once Destroy waits
		present, err := c.ReqNotify(false)
		require.NoError(t, err)
		require.True(t, present)
		require.NoError(t, a.Close())
		require.NoError(t, c.StartPoll())
		done, b := failing(t, e, c)
		c.AckEvents(1) // Destroy goes on, to the batch
		time.Sleep(20 * time.Millisecond)
		e.send(b, nowhere(b), 2, 10, qpsim.SendOpts{}) // fires the arm
		time.Sleep(20 * time.Millisecond)
		_, _, err = ch.TryGetEvent()
		require.ErrorIs(t, err, verbs.ErrNoEvent, "a CQ being destroyed has no events to get")
		end(t, ch, c, done, b)
	})

	t.Run("queued", func(t *testing.T) {
		e, ch, c, a := chEnv(t)
		_, err := c.ReqNotify(false)
		require.NoError(t, err)
		e.send(a, nowhere(a), 1, 10, qpsim.SendOpts{})
		time.Sleep(20 * time.Millisecond) // the event is queued
		require.NoError(t, a.Close())
		require.NoError(t, c.StartPoll())
		done, b := failing(t, e, c) // nothing to acknowledge: on to the batch
		_, _, err = ch.TryGetEvent()
		require.ErrorIs(t, err, verbs.ErrNoEvent, "a CQ being destroyed has no events to get")
		end(t, ch, c, done, b)
	})
}

// A CQ not made by CreateCQ is refused, not waited on for ever.
func TestDestroyZeroCQ(t *testing.T) {
	require.ErrorIs(t, new(verbs.CQ).Close(), os.ErrInvalid)
}

// Events queued and not taken do not hold up Destroy, and are dropped.
func TestDestroyDropsQueuedEvents(t *testing.T) {
	e := newEnv(t)
	ch, err := verbs.NewCompChannel()
	require.NoError(t, err)
	c1 := e.cq(verbs.CQInitAttr{CQE: 16, Channel: ch})
	c2 := e.cq(verbs.CQInitAttr{CQE: 16, Channel: ch})
	q1, q2 := e.qp(c1, false), e.qp(c2, false)
	for _, c := range []*verbs.CQ{c1, c2} {
		_, err := c.ReqNotify(false)
		require.NoError(t, err)
	}
	e.send(q1, nowhere(q1), 1, 10, qpsim.SendOpts{})
	time.Sleep(20 * time.Millisecond) // c1's event is queued
	e.send(q2, nowhere(q2), 1, 10, qpsim.SendOpts{})
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, q1.Close())
	require.NoError(t, c1.Close())
	got, _ := getEvent(t, ch)
	require.Same(t, c2, got)
	c2.AckEvents(1)
	_, _, err = ch.TryGetEvent()
	require.ErrorIs(t, err, verbs.ErrNoEvent)
	require.NoError(t, q2.Close())
	require.NoError(t, c2.Close())
	require.NoError(t, ch.Close())
}
