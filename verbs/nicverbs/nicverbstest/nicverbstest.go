// Package nicverbstest runs the verbs CQ's behaviour tests (package
// verbs, through verbs/nicverbs) on a real NIC's transmit queue. Each VM
// suite (virtio, igb) calls Run in its guest with a device it opened, so
// that every provider is held to the same checks.
package nicverbstest

import (
	"context"
	"errors"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/verbs"
	"github.com/vfnic/vfnic/verbs/nicverbs"
)

// Rounds is the number of rounds of the lost-wake-up loop: 2000, or
// $VFNIC_VERBS_ROUNDS.
func Rounds(t testing.TB) int {
	s := os.Getenv("VFNIC_VERBS_ROUNDS")
	if s == "" {
		return 2000
	}
	n, err := strconv.Atoi(s)
	require.NoError(t, err, "VFNIC_VERBS_ROUNDS")
	return n
}

// Run checks the verbs CQ over dev's transmit queue 0, sending frame
// (which whoever is on the wire must ignore), and over its receive queue
// 0: creation limits as in rdma-core's test_cq.py (sizes 1, max/2 and
// max; max+1 and a vector out of range refused; an unsupported field
// refused; IgnoreOverrun honoured), the iterator over 64 real transmit
// completions, resize (3, 1, 7; not below the completions held; none
// lost), request-notify with a completion channel woken by the queue's
// MSI-X interrupt (entries present at the arm reported, two arms one
// event), rounds of the lost-wake-up loop against completions the device
// writes while the consumer polls and arms, a solicited-only arm that
// successful completions do not fire, the flush at close (posted receives
// complete flushed, which fires a solicited-only arm), and a destroy that
// reports an unacknowledged event. It closes dev; the caller checks that
// every resource came back.
func Run(t *testing.T, dev nic.Device, frame []byte, rounds int) {
	ctx := context.Background()
	p := nicverbs.New(dev)
	attr := p.QueryDevice()

	// Sizes as in rdma-core's test_cq.py: 1, max/2 and max open; max+1
	// and a vector out of range are refused.
	for _, n := range []int{1, attr.MaxCQE / 2, attr.MaxCQE} {
		c, err := verbs.CreateCQ(p, verbs.CQInitAttr{CQE: n})
		require.NoError(t, err, "CQE %d", n)
		require.GreaterOrEqual(t, c.CQE(), n)
		require.NoError(t, c.Destroy(ctx))
	}
	_, err := verbs.CreateCQ(p, verbs.CQInitAttr{CQE: attr.MaxCQE + 1})
	require.ErrorIs(t, err, os.ErrInvalid)
	_, err = verbs.CreateCQ(p, verbs.CQInitAttr{CQE: 8, CompVector: attr.NumCompVectors})
	require.ErrorIs(t, err, os.ErrInvalid)
	_, err = verbs.CreateCQ(p, verbs.CQInitAttr{CQE: 8, Fields: verbs.FieldCompletionTimestamp})
	require.ErrorIs(t, err, errors.ErrUnsupported)
	// A NIC queue cannot overrun its CQ: IgnoreOverrun is honoured.
	c, err := verbs.CreateCQ(p, verbs.CQInitAttr{CQE: 8, Flags: verbs.IgnoreOverrun})
	require.NoError(t, err)
	require.NoError(t, c.Destroy(ctx))

	ch, err := verbs.NewCompChannel()
	require.NoError(t, err)
	c, err = verbs.CreateCQ(p, verbs.CQInitAttr{CQE: 512, Channel: ch, Context: "cq0",
		Fields: verbs.FieldByteLen | verbs.FieldQPNum})
	require.NoError(t, err)
	require.NoError(t, dev.BindCQ(c.FI(), 0, nic.Send))
	tx, err := dev.Tx(0)
	require.NoError(t, err)
	ready, ok := tx.(interface{ Ready(max int) int })
	require.True(t, ok, "%T counts written completions (Ready)", tx)
	// getEvent waits up to d for an event on ch.
	getEvent := func(d time.Duration) (*verbs.CQ, any, error) {
		gctx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		return ch.GetEvent(gctx)
	}
	send := func(wrid uint64) {
		require.NoError(t, tx.Send(frame, wrid))
		require.NoError(t, tx.Flush())
	}

	// The iterator over 64 transmit completions, in order.
	for i := range 64 {
		require.NoError(t, tx.Send(frame, uint64(i)))
	}
	require.NoError(t, tx.Flush())
	next := uint64(0)
	deadline := time.Now().Add(10 * time.Second)
	for next < 64 && time.Now().Before(deadline) {
		err := c.StartPoll()
		if errors.Is(err, verbs.ErrEmpty) {
			continue // no EndPoll after a failed StartPoll
		}
		require.NoError(t, err)
		for ; err == nil; err = c.NextPoll() {
			require.Equal(t, verbs.WCSuccess, c.Status())
			require.Equal(t, verbs.WCSend, c.Opcode())
			require.Equal(t, next, c.WRID())
			require.Equal(t, uint32(len(frame)), c.ByteLen())
			require.Equal(t, uint32(0), c.QPNum())
			next++
		}
		require.ErrorIs(t, err, verbs.ErrEmpty)
		c.EndPoll()
	}
	require.Equal(t, uint64(64), next)

	wcs := make([]verbs.WC, 32)

	// Resize as rdma-core's test_cq.py does (3, 1, then 7), never below
	// the completions the CQ holds, with none lost or reordered, the
	// device writing meanwhile.
	for _, n := range []int{3, 1, 7} {
		require.NoError(t, c.Resize(n))
		require.Equal(t, n, c.CQE())
	}
	for i := range 4 {
		send(uint64(300 + i))
	}
	require.Eventually(t, func() bool { return ready.Ready(8) >= 4 }, 5*time.Second, time.Millisecond)
	require.ErrorIs(t, c.Resize(3), os.ErrInvalid, "4 completions held")
	require.Equal(t, 7, c.CQE())
	send(304)
	require.NoError(t, c.Resize(512))
	for got := uint64(300); got < 305; {
		n, err := c.Poll(wcs)
		require.NoError(t, err)
		for _, w := range wcs[:n] {
			require.Equal(t, got, w.WRID)
			got++
		}
	}

	// Request-notify: completions present at the arm raise no event and
	// are reported; the next one wakes GetEvent through MSI-X.
	send(100)
	require.Eventually(t, func() bool { return ready.Ready(8) > 0 }, 5*time.Second, time.Millisecond)
	present, err := c.ReqNotify(false)
	require.NoError(t, err)
	require.True(t, present, "an entry was there at the arm")
	n, err := c.Poll(wcs)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	present, err = c.ReqNotify(false)
	require.NoError(t, err)
	require.False(t, present)
	_, err = c.ReqNotify(false)
	require.NoError(t, err, "arming twice gives one event")
	send(101)
	got, cctx, err := getEvent(5 * time.Second)
	require.NoError(t, err)
	require.Same(t, c, got)
	require.Equal(t, "cq0", cctx)
	c.AckEvents(1)
	n, err = c.Poll(wcs)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, uint64(101), wcs[0].WRID)

	// The lost-wake-up loop: the consumer sends two frames, the second
	// after a delay that lands it between "poll finds nothing" and the
	// arm, or between the arm and the next poll, or later; it must always
	// get an event for what it has not read.
	sent, read, events := 0, 0, 0
	for r := range rounds {
		send(uint64(1000 + sent))
		sent++
		if r%3 == 0 {
			send(uint64(1000 + sent)) // lands before the arm
			sent++
		}
		for {
			n, err := c.Poll(wcs)
			require.NoError(t, err)
			read += n
			if n == 0 {
				break
			}
		}
		if r%3 == 1 {
			send(uint64(1000 + sent)) // lands between the empty poll and the arm
			sent++
		}
		if _, err := c.ReqNotify(false); err != nil {
			t.Fatal(err)
		}
		// poll once more after the arm, as the pattern requires
		n, err := c.Poll(wcs)
		require.NoError(t, err)
		read += n
		if read == sent {
			continue // nothing unread: no event to wait for
		}
		_, _, err = getEvent(5 * time.Second)
		require.NoError(t, err, "round %d: %d sent, %d read: the event was lost", r, sent, read)
		events++
		c.AckEvents(1)
	}
	for read < sent {
		n, err := c.Poll(wcs)
		require.NoError(t, err)
		read += n
	}
	t.Logf("verbs on %s %s: 64 completions through the iterator; notify woke GetEvent; %d rounds of the event loop, %d completions, %d events, none lost",
		dev.Info().Model, dev.Info().Address, rounds, sent, events)

	// Solicited-only: a NIC interrupts on every completion, so the verbs
	// layer filters: successful completions raise no event, and they are
	// read afterwards in order.
	// First the loop's last arm, if still pending, is used up (a "next"
	// arm would take precedence), and the events of rounds that needed
	// none are taken.
	takeStale := func() {
		for {
			_, _, err := ch.TryGetEvent()
			if errors.Is(err, verbs.ErrNoEvent) {
				return
			}
			require.NoError(t, err)
			c.AckEvents(1)
		}
	}
	takeStale()
	_, err = c.ReqNotify(false)
	require.NoError(t, err)
	send(199)
	_, _, err = getEvent(5 * time.Second)
	require.NoError(t, err)
	c.AckEvents(1)
	for got := 0; got < 1; {
		n, err := c.Poll(wcs)
		require.NoError(t, err)
		got += n
	}
	takeStale()
	present, err = c.ReqNotify(true)
	require.NoError(t, err)
	require.False(t, present)
	for i := range 3 {
		send(uint64(200 + i))
	}
	require.Eventually(t, func() bool { return ready.Ready(8) == 0 }, 5*time.Second, time.Millisecond,
		"the verbs layer takes the completions from the ring to look at them")
	_, _, err = getEvent(100 * time.Millisecond)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded, "successes are not solicited")
	n, err = c.Poll(wcs)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	for i := range 3 {
		require.Equal(t, uint64(200+i), wcs[i].WRID)
		require.Equal(t, verbs.WCSuccess, wcs[i].Status)
	}

	// Destroy with an unacknowledged event reports it at the deadline.
	_, err = c.ReqNotify(false)
	require.NoError(t, err)
	send(9999)
	_, _, err = getEvent(5 * time.Second)
	require.NoError(t, err)

	// The flush path: receives posted on a queue that feeds a CQ complete
	// as flushed when the device closes, and a flushed completion is an
	// error, so it fires a solicited-only arm (on the same channel).
	rc, err := verbs.CreateCQ(p, verbs.CQInitAttr{CQE: 256, Channel: ch, Context: "rx"})
	require.NoError(t, err)
	require.NoError(t, dev.BindCQ(rc.FI(), 0, nic.Recv))
	rx, err := dev.Rx(0)
	require.NoError(t, err)
	const posted = 32
	for i := range posted {
		require.NoError(t, rx.PostRecv(uint64(5000+i)))
	}
	require.NoError(t, rx.Flush())
	_, err = rc.ReqNotify(true)
	require.NoError(t, err)
	require.NoError(t, dev.Close(), "closing the device unbinds its queues")
	got, cctx, err = getEvent(5 * time.Second)
	require.NoError(t, err, "the flush fires the solicited-only arm")
	require.Same(t, rc, got)
	require.Equal(t, "rx", cctx)
	rc.AckEvents(1)
	seen, flushed := map[uint64]bool{}, 0
	for {
		n, err := rc.Poll(wcs)
		require.NoError(t, err)
		if n == 0 {
			break
		}
		for _, w := range wcs[:n] {
			require.False(t, seen[w.WRID], "wrid %d twice", w.WRID)
			seen[w.WRID] = true
			require.Equal(t, verbs.WCRecv, w.Opcode)
			if w.Status == verbs.WCWRFlushErr {
				flushed++
			} else {
				require.Equal(t, verbs.WCSuccess, w.Status, "wrid %d", w.WRID) // a frame from the wire
			}
		}
	}
	require.Len(t, seen, posted, "every posted receive comes back once")
	require.Positive(t, flushed)
	t.Logf("flush at close: %d of %d posted receives flushed, the rest received; the solicited-only arm fired", flushed, posted)
	require.NoError(t, rc.Destroy(ctx))

	dctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	err = c.Destroy(dctx)
	cancel()
	require.Error(t, err, "an event is not acknowledged")
	c.AckEvents(1)
	require.NoError(t, c.Destroy(ctx))
	require.NoError(t, ch.Close())
}
