package igb

import (
	"context"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/tests/leakcheck"
	"github.com/vfnic/vfnic/verbs"
)

// newCQ opens a CQ with an eventfd wait object.
func newCQ(t *testing.T) *cq.CQ {
	t.Helper()
	c, err := cq.New(cq.Attr{Size: 64, Format: cq.FormatData, WaitObj: cq.WaitFD}, cq.Limits{})
	require.NoError(t, err)
	return c
}

// readFlushed reads want as flushed error completions of queue qnum, one
// ReadErr each, then checks the CQ is empty.
func readFlushed(t *testing.T, c *cq.CQ, qnum uint32, flags cq.Flags, want []any) {
	t.Helper()
	ents := make([]cq.Entry, 8)
	for i, w := range want {
		_, err := c.Read(ents)
		require.ErrorIs(t, err, cq.ErrAvail, "flushed %d of %d", i+1, len(want))
		var ee cq.ErrEntry
		require.NoError(t, c.ReadErr(&ee))
		require.Equal(t, w, ee.Context, "flushed %d: posting order", i+1)
		require.Equal(t, cq.ECANCELED, ee.Err)
		require.ErrorIs(t, ee.Err, syscall.ECANCELED)
		require.Equal(t, verbs.WCWRFlushErr, verbs.StatusOf(&ee))
		require.Equal(t, qnum, ee.Queue, "the queue's number, as its completions carry")
		require.Equal(t, flags, ee.Flags)
		require.Zero(t, ee.Len)
		require.Zero(t, ee.ProvErrno)
		require.Contains(t, c.StrError(ee.ProvErrno, ee.ErrData), "flushed")
	}
	_, err := c.Read(ents)
	require.ErrorIs(t, err, cq.ErrAgain, "nothing after the flushed ones")
	var ee cq.ErrEntry
	require.ErrorIs(t, c.ReadErr(&ee), cq.ErrAgain)
	_, err = c.Read(nil)
	require.ErrorIs(t, err, cq.ErrAgain)
}

// readOK reads n successful completions and returns their contexts.
func readOK(t *testing.T, c *cq.CQ, n int) []any {
	t.Helper()
	ents := make([]cq.Entry, n)
	got, err := c.Read(ents)
	require.NoError(t, err)
	require.Equal(t, n, got)
	ctxs := make([]any, n)
	for i, e := range ents {
		ctxs[i] = e.Context
	}
	return ctxs
}

// TestCloseFlushesToCQ: closing the device (Close, or the kernel taking it
// back) completes every operation still outstanding on a queue that feeds
// a CQ with a flushed error completion in that CQ, in posting order
// across the end of the ring, after the successes the CQ read before; a
// descriptor written back but unread is flushed too (close does not read
// the ring), and a context descriptor, the queue's own, is not reported.
// Receive buffers go back to the pool; the CQ then closes.
func TestCloseFlushesToCQ(t *testing.T) {
	for _, why := range []error{nic.ErrClosed, nic.ErrRemovedClosed} {
		name := map[error]string{nic.ErrClosed: "Close", nic.ErrRemovedClosed: "removed"}[why]
		t.Run(name, func(t *testing.T) { testCloseFlushes(t, why) })
	}
}

func testCloseFlushes(t *testing.T, why error) {
	d, f := newFakeDevice(t, Config{Config: nic.Config{QueueSize: 16, RxBuffers: 32}})
	dev := newFakeNIC(t, d, f)
	crx, ctx := newCQ(t), newCQ(t)
	require.NoError(t, d.BindCQ(crx, 0, nic.Recv))
	require.NoError(t, d.BindCQ(ctx, 0, nic.Send))
	rx, tx := d.rx[0], d.tx[0]

	// A first lap moves both rings' heads to position 11, so that what
	// follows wraps past the end.
	for i := range 11 {
		require.NoError(t, rx.PostRecv("warm"))
		require.NoError(t, tx.Send(frameOf(i, 64), "warm"))
	}
	require.NoError(t, rx.Flush())
	require.NoError(t, tx.Flush())
	for i := range 11 {
		dev.receive(frameOf(i, 64))
	}
	dev.transmit()
	ents := make([]cq.Entry, 16)
	n, err := crx.Read(ents)
	require.NoError(t, err)
	require.Equal(t, 11, n)
	for _, e := range ents[:n] {
		require.NoError(t, rx.Release(e.Buf))
	}
	n, err = ctx.Read(ents)
	require.NoError(t, err)
	require.Equal(t, 11, n)

	// Receive: 8 posted at 11..15, 0..2; two complete and are read, a
	// third completes unread.
	rctx := []any{"r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7"}
	for _, c := range rctx {
		require.NoError(t, rx.PostRecv(c))
	}
	require.NoError(t, rx.Flush())
	dev.receive(frameOf(1, 64))
	dev.receive(frameOf(2, 64))
	require.Equal(t, []any{"r0", "r1"}, readOK(t, crx, 2))
	dev.receive(frameOf(3, 64))

	// Transmit: two sent and read; then one with a checksum context
	// descriptor and four more, never handed to the device.
	require.NoError(t, tx.Send(frameOf(1, 64), "t0"))
	require.NoError(t, tx.Send(frameOf(2, 64), "t1"))
	require.NoError(t, tx.Flush())
	dev.transmit()
	require.Equal(t, []any{"t0", "t1"}, readOK(t, ctx, 2))
	sent, _, _ := csumFrame(t, false, false, 0, 0)
	tail := tx.tail
	require.NoError(t, tx.SendChecksum(sent, "t2", TxIPv4|TxL4))
	require.EqualValues(t, 2, (tx.tail+tx.n-tail)%tx.n, "a context descriptor and the frame's")
	tctx := []any{"t2", "t3", "t4", "t5", "t6"}
	for i, c := range tctx[1:] {
		require.NoError(t, tx.Send(frameOf(i, 64), c))
	}
	require.Less(t, tx.tail, uint32(13), "the transmit run wraps")

	require.NoError(t, d.close(why))
	posted, lent := rx.bufs.Counts()
	require.Equal(t, [2]int{0, 2}, [2]int{posted, lent}, "the posted buffers went back to the pool, the two read stay lent")
	require.Equal(t, rx.bufs.Cap()-2, rx.bufs.Free())
	comps := make([]nic.Completion, 4)
	require.Zero(t, rx.Poll(comps))
	require.Zero(t, tx.Poll(comps))

	readFlushed(t, crx, 0, cq.FlagRecv|cq.FlagMsg, rctx[2:])
	readFlushed(t, ctx, 1, cq.FlagSend|cq.FlagMsg, tctx)
	require.NoError(t, crx.Close())
	require.NoError(t, ctx.Close())
	require.ErrorIs(t, rx.PostRecv(nil), nic.ErrClosed)
	require.NoError(t, d.Close(), "Close is idempotent")
}

// TestCloseFlushWakesSRead: a reader asleep on the CQ (no timeout) wakes
// when the device closes, to read the flushed operations.
func TestCloseFlushWakesSRead(t *testing.T) {
	d, _ := newFakeDevice(t, Config{Config: nic.Config{QueueSize: 16}})
	c := newCQ(t)
	require.NoError(t, d.BindCQ(c, 0, nic.Recv))
	require.NoError(t, d.rx[0].PostRecv("a"))
	require.NoError(t, d.rx[0].Flush())
	done := make(chan error, 1)
	go func() {
		_, err := c.SRead(context.Background(), make([]cq.Entry, 4), 0, -1)
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, d.Close())
	select {
	case err := <-done:
		require.ErrorIs(t, err, cq.ErrAvail)
	case <-time.After(5 * time.Second):
		t.Fatal("the blocked reader was not woken")
	}
	readFlushed(t, c, 0, cq.FlagRecv|cq.FlagMsg, []any{"a"})
	require.NoError(t, c.Close())
}

// TestCloseFlushUnread: closing the CQ before reading the flushed
// operations drops them, and a device and CQ closed that way leave
// nothing behind: no fd, no mapping, no goroutine.
func TestCloseFlushUnread(t *testing.T) {
	before, err := leakcheck.Snapshot()
	require.NoError(t, err)
	gs := runtime.NumGoroutine()
	t.Run("run", func(t *testing.T) {
		d, _ := newFakeDevice(t, Config{Config: nic.Config{QueueSize: 16}})
		c := newCQ(t)
		require.NoError(t, d.BindCQ(c, 0, nic.Recv|nic.Send))
		fill(t, d.rx[0])
		require.NoError(t, d.tx[0].Send(frameOf(1, 64), nil))
		require.NoError(t, d.Close())
		_, err := c.Read(nil)
		require.ErrorIs(t, err, cq.ErrAvail)
		require.NoError(t, c.Close())
		comps := make([]nic.Completion, 4)
		require.Zero(t, d.rx[0].Poll(comps))
		require.Zero(t, d.tx[0].Poll(comps))
	})
	after, err := leakcheck.Snapshot()
	require.NoError(t, err)
	require.Equal(t, before, after, "before %v, after %v", before, after)
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > gs && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	require.LessOrEqual(t, runtime.NumGoroutine(), gs, "no goroutine left")
}

// TestUnboundBeforeCloseFlushesNothing: a queue unbound from its CQ before
// the device closes reports nothing into that CQ; its own Poll reports
// nothing after Close, and each operation canceled after a removal (as
// every driver on the shared queue core does, nic.ErrCanceled).
func TestUnboundBeforeCloseFlushesNothing(t *testing.T) {
	for _, why := range []error{nic.ErrClosed, nic.ErrRemovedClosed} {
		d, _ := newFakeDevice(t, Config{Config: nic.Config{QueueSize: 16}})
		c := newCQ(t)
		require.NoError(t, d.BindCQ(c, 0, nic.Recv|nic.Send))
		rx, tx := d.rx[0], d.tx[0]
		fill(t, rx)
		require.NoError(t, tx.Send(frameOf(1, 64), nil))
		posted := rx.Outstanding()
		require.NoError(t, rx.Src.Unbind()) // what the CQ's Close does
		require.NoError(t, tx.Src.Unbind())
		require.NoError(t, d.close(why))
		_, err := c.Read(make([]cq.Entry, 4))
		require.ErrorIs(t, err, cq.ErrAgain, "%v: nothing in the CQ", why)
		comps := make([]nic.Completion, 4)
		canceled := func(q nic.Queue) int {
			n := 0
			for q.Poll(comps) == 1 {
				require.ErrorIs(t, comps[0].Err, nic.ErrCanceled)
				require.ErrorIs(t, comps[0].Err, nic.ErrRemoved)
				n++
			}
			return n
		}
		if why == nic.ErrClosed {
			require.Zero(t, canceled(rx), "a plain Close reports none")
			require.Zero(t, canceled(tx))
		} else {
			require.Equal(t, posted, canceled(rx), "a removal cancels each, for Poll")
			require.Equal(t, 1, canceled(tx))
		}
		require.NoError(t, c.Close())
	}
}
