package virtio

import (
	"context"
	"fmt"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/nic"
	qcore "github.com/vfnic/vfnic/nic/internal/queue"
	"github.com/vfnic/vfnic/tests/leakcheck"
	"github.com/vfnic/vfnic/verbs"
)

// pairDevice is a Device around a receive and a transmit queue on rigs,
// numbered as a device's pair 0 (virtqueues 0 and 1), with no transport,
// VFIO or DMA space: its BindCQ and Close run as on hardware, less the
// register writes and the unmapping (the rigs' memory outlives Close).
func pairDevice(t *testing.T, packed bool, size int) (*Device, *rig, *rig) {
	t.Helper()
	rr := newRig(t, size, packed, true, 64<<10)
	tr := newRig(t, size, packed, true, 64<<10)
	rr.v.qidx, tr.v.qidx = 0, 1 // the rig's ring is queue 3 otherwise
	rx := rr.rxQueue(t, 2*size, 2048, true)
	tx := tr.txQueue(t, 1500)
	return &Device{name: "test", rx: []*RxQueue{rx}, tx: []*TxQueue{tx},
		core: qcore.Device{Name: "test", Rx: []*qcore.Queue{&rx.Queue}, Tx: []*qcore.Queue{&tx.Queue}}}, rr, tr
}

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

// TestCloseFlushesToCQ: closing a device (Close, or the kernel taking it
// back) completes every operation still outstanding on a queue that feeds
// a CQ with a flushed error completion in that CQ, after the successes
// the CQ read before; an operation the device finished but the CQ had not
// read is flushed too (close does not read the ring). Receive buffers go
// back to the pool; the CQ then closes.
func TestCloseFlushesToCQ(t *testing.T) {
	for _, why := range []error{nil, nic.ErrRemovedClosed} {
		name := "Close"
		if why != nil {
			name = "removed"
		}
		t.Run(name, func(t *testing.T) {
			forRings(t, func(t *testing.T, packed bool) { testCloseFlushes(t, packed, why) })
		})
	}
}

func testCloseFlushes(t *testing.T, packed bool, why error) {
	d, rr, tr := pairDevice(t, packed, 8)
	crx, ctx := newCQ(t), newCQ(t)
	require.NoError(t, d.BindCQ(crx, 0, nic.Recv))
	require.NoError(t, d.BindCQ(ctx, 0, nic.Send))
	rx, tx := d.rx[0], d.tx[0]

	rctx := []any{"r0", "r1", "r2", "r3", "r4", "r5"}
	for _, c := range rctx {
		require.NoError(t, rx.PostRecv(c))
	}
	require.NoError(t, rx.Flush())
	tctx := []any{"t0", "t1", "t2", "t3", "t4"}
	for i, c := range tctx {
		require.NoError(t, tx.Send(frameFor(i, 64), c))
	}
	require.NoError(t, tx.Flush())

	// Two of each complete and are read; a third completes unread.
	for i := range 3 {
		deliver(t, rr.dev, frameFor(i, 64), 1)
		x, ok := tr.dev.take()
		require.True(t, ok)
		tr.dev.complete(x.id, 0, x.ndesc)
		if i == 1 {
			ents := make([]cq.Entry, 2)
			n, err := crx.Read(ents)
			require.NoError(t, err)
			require.Equal(t, 2, n)
			require.Equal(t, []any{"r0", "r1"}, []any{ents[0].Context, ents[1].Context})
			n, err = ctx.Read(ents)
			require.NoError(t, err)
			require.Equal(t, 2, n)
			require.Equal(t, []any{"t0", "t1"}, []any{ents[0].Context, ents[1].Context})
		}
	}

	if why == nil {
		require.NoError(t, d.Close())
	} else {
		require.NoError(t, d.close(why))
	}
	posted, lent := rx.bufs.Counts()
	require.Equal(t, [2]int{0, 2}, [2]int{posted, lent}, "the posted buffers went back to the pool, the two read stay lent")
	require.Equal(t, rx.bufs.Cap()-2, rx.bufs.Free())
	var comps [4]nic.Completion
	require.Zero(t, rx.Poll(comps[:]), "the flushed ones are the CQ's")
	require.Zero(t, tx.Poll(comps[:]))

	readFlushed(t, crx, 0, cq.FlagRecv|cq.FlagMsg, rctx[2:])
	readFlushed(t, ctx, 1, cq.FlagSend|cq.FlagMsg, tctx[2:])
	require.NoError(t, crx.Close())
	require.NoError(t, ctx.Close())
	require.Zero(t, rx.Poll(comps[:]), "nothing for Poll after the CQ closed")
	require.ErrorIs(t, rx.PostRecv(nil), nic.ErrClosed)
	require.NoError(t, d.Close(), "Close is idempotent")
}

// TestCloseFlushesInPostingOrder: operations completed out of order free
// their buffer ids out of order, and the ids go to later posts; the
// operations still outstanding at close come out in the order they were
// posted, not in buffer-id order, into the CQ the queue feeds (flushed)
// and through Poll after a removal (canceled) alike.
func TestCloseFlushesInPostingOrder(t *testing.T) {
	forRings(t, func(t *testing.T, packed bool) {
		for _, viaCQ := range []bool{true, false} {
			d, _, tr := pairDevice(t, packed, 8)
			tx := d.tx[0]
			var c *cq.CQ
			if viaCQ {
				c = newCQ(t)
				require.NoError(t, d.BindCQ(c, 0, nic.Send))
			}
			for i := range 8 {
				require.NoError(t, tx.Send(frameFor(i, 64), fmt.Sprintf("t%d", i)))
			}
			require.NoError(t, tx.Flush())
			tk := tr.dev.takeN(8)
			tr.dev.complete(tk[3].id, 0, tk[3].ndesc)
			tr.dev.complete(tk[1].id, 0, tk[1].ndesc)
			if viaCQ {
				require.Equal(t, []any{"t3", "t1"}, readOK(t, c, 2))
			} else {
				var comps [4]nic.Completion
				require.Equal(t, 2, tx.Poll(comps[:]))
				require.Equal(t, []any{"t3", "t1"}, []any{comps[0].Context, comps[1].Context})
			}
			require.NoError(t, tx.Send(frameFor(8, 64), "t8")) // on a freed id, below those of t4..t7
			require.NoError(t, tx.Send(frameFor(9, 64), "t9"))
			want := []any{"t0", "t2", "t4", "t5", "t6", "t7", "t8", "t9"}
			if viaCQ {
				require.NoError(t, d.Close())
				readFlushed(t, c, 1, cq.FlagSend|cq.FlagMsg, want)
				require.NoError(t, c.Close())
				continue
			}
			require.NoError(t, d.close(nic.ErrRemovedClosed))
			var got []any
			var comps [4]nic.Completion
			for tx.Poll(comps[:]) == 1 {
				require.ErrorIs(t, comps[0].Err, nic.ErrCanceled)
				got = append(got, comps[0].Context)
			}
			require.Equal(t, want, got, "posting order")
		}
	})
}

// readOK reads n successful completions from c and returns their
// contexts.
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

// TestCloseFlushWakesSRead: a reader asleep on the CQ (no timeout) wakes
// when the device closes, to read the flushed operations.
func TestCloseFlushWakesSRead(t *testing.T) {
	forRings(t, func(t *testing.T, packed bool) {
		d, _, _ := pairDevice(t, packed, 8)
		c := newCQ(t)
		require.NoError(t, d.BindCQ(c, 0, nic.Send))
		require.NoError(t, d.tx[0].Send(frameFor(1, 64), "a"))
		require.NoError(t, d.tx[0].Flush())
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
		readFlushed(t, c, 1, cq.FlagSend|cq.FlagMsg, []any{"a"})
		require.NoError(t, c.Close())
	})
}

// TestCloseFlushUnread: closing the CQ before reading the flushed
// operations drops them, and leaves nothing behind: no fd, no mapping, no
// goroutine.
func TestCloseFlushUnread(t *testing.T) {
	before, err := leakcheck.Snapshot()
	require.NoError(t, err)
	gs := runtime.NumGoroutine()
	t.Run("run", func(t *testing.T) {
		forRings(t, func(t *testing.T, packed bool) {
			d, _, _ := pairDevice(t, packed, 8)
			c := newCQ(t)
			require.NoError(t, d.BindCQ(c, 0, nic.Recv|nic.Send))
			postN(t, d.rx[0], 4)
			require.NoError(t, d.tx[0].Send(frameFor(1, 64), nil))
			require.NoError(t, d.Close())
			_, err := c.Read(nil)
			require.ErrorIs(t, err, cq.ErrAvail)
			require.NoError(t, c.Close())
			var comps [4]nic.Completion
			require.Zero(t, d.rx[0].Poll(comps[:]))
			require.Zero(t, d.tx[0].Poll(comps[:]))
		})
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
// the device closes reports nothing into that CQ; its own Poll keeps
// today's behaviour (nothing after Close, ErrCanceled after a removal).
func TestUnboundBeforeCloseFlushesNothing(t *testing.T) {
	for _, removed := range []bool{false, true} {
		name := map[bool]string{false: "Close", true: "removed"}[removed]
		t.Run(name, func(t *testing.T) {
			forRings(t, func(t *testing.T, packed bool) {
				d, _, _ := pairDevice(t, packed, 8)
				c := newCQ(t)
				require.NoError(t, d.BindCQ(c, 0, nic.Recv))
				rx := d.rx[0]
				postN(t, rx, 3)
				require.NoError(t, rx.Src.Unbind()) // what the CQ's Close does
				if removed {
					require.NoError(t, d.close(nic.ErrRemovedClosed))
				} else {
					require.NoError(t, d.Close())
				}
				ents := make([]cq.Entry, 4)
				_, err := c.Read(ents)
				require.ErrorIs(t, err, cq.ErrAgain, "nothing in the CQ")
				var comps [4]nic.Completion
				n := 0
				for rx.Poll(comps[:]) == 1 {
					require.ErrorIs(t, comps[0].Err, nic.ErrCanceled)
					require.ErrorIs(t, comps[0].Err, nic.ErrRemoved)
					n++
				}
				if removed {
					require.Equal(t, 3, n, "a removal cancels each, for Poll")
				} else {
					require.Zero(t, n, "a plain Close reports none")
				}
				require.NoError(t, c.Close())
			})
		})
	}
}
