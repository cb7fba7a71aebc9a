package virtio

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/nic"
	qcore "github.com/vfnic/vfnic/nic/internal/queue"
)

// bindTest binds a rig's queue to a new CQ the way Device.BindCQ does,
// without a device (its Close then has no vector to rewire).
func bindTest(t *testing.T, q *queue, pq any, f cq.Format) *cq.CQ {
	t.Helper()
	c, err := cq.New(cq.Attr{Format: f, WaitObj: cq.WaitFD}, cq.Limits{})
	require.NoError(t, err)
	var v qcore.Device
	require.NoError(t, v.Bind(c, []*qcore.Queue{&q.Queue}, func(s *qcore.Source) error { return v.Unbind(s, false) }))
	t.Cleanup(func() {
		v.UnbindAll() // as the device's close does
		require.NoError(t, c.Close())
	})
	return c
}

func TestCQReceive(t *testing.T) {
	forRings(t, func(t *testing.T, packed bool) {
		r := newRig(t, 8, packed, true, 64<<10)
		rx := r.rxQueue(t, 16, 2048, true)
		c := bindTest(t, &rx.queue, rx, cq.FormatData)
		ctx := postN(t, rx, 8)
		var comps [4]nic.Completion
		require.Equal(t, 1, rx.Poll(comps[:]), "a bound queue's own Poll says it is bound")
		require.ErrorIs(t, comps[0].Err, nic.ErrBound)
		require.ErrorIs(t, comps[0].Err, nic.ErrInvalid)
		_, err := rx.SRead(context.Background(), comps[:], 1, time.Second)
		require.ErrorIs(t, err, nic.ErrBound)
		require.ErrorIs(t, rx.WaitInterrupt(context.Background(), time.Now()), nic.ErrBound)
		ents := make([]cq.Entry, 8)
		_, err = c.Read(ents)
		require.ErrorIs(t, err, cq.ErrAgain)
		for i := range 5 {
			deliver(t, r.dev, frameFor(i, 64+i*100), 1)
		}
		_, err = c.Read(nil)
		require.NoError(t, err, "a zero-count read sees completions waiting")
		n, err := c.Read(ents)
		require.NoError(t, err)
		require.Equal(t, 5, n)
		for i, e := range ents[:n] {
			require.Equal(t, &ctx[i], e.Context)
			require.Equal(t, cq.FlagRecv|cq.FlagMsg, e.Flags)
			require.Equal(t, 64+i*100, e.Len)
			require.Equal(t, uint32(3), e.Queue, "the virtqueue index")
			f, err := rx.Frame(e.Buf, e.Len)
			require.NoError(t, err)
			require.Equal(t, frameFor(i, 64+i*100), f)
			require.NoError(t, rx.Repost(e.Buf, nil))
		}
		_, err = rx.Frame(ents[0].Buf, ents[0].Len)
		require.ErrorIs(t, err, nic.ErrBadBuffer, "a reposted frame is no longer lent")
	})
}

func TestCQErrorsInOrder(t *testing.T) {
	forRings(t, func(t *testing.T, packed bool) {
		r := newRig(t, 8, packed, true, 64<<10)
		rx := r.rxQueue(t, 16, 2048, true)
		c := bindTest(t, &rx.queue, rx, cq.FormatData)
		ctx := postN(t, rx, 6)
		d := r.dev
		tk := d.takeN(5)
		d.complete(tk[0].id, writeFrame(tk[0], frameFor(0, 64), 1), 1)
		d.complete(tk[1].id, 9000, 1)                                  // too long
		d.complete(tk[2].id, writeFrame(tk[2], frameFor(2, 64), 2), 1) // a frame in two buffers
		d.complete(tk[3].id, 100, 1)                                   // its continuation
		d.complete(tk[4].id, writeFrame(tk[4], frameFor(4, 64), 1), 1)
		ents := make([]cq.Entry, 8)
		n, err := c.Read(ents)
		require.NoError(t, err)
		require.Equal(t, 1, n, "the success before the first error")
		_, err = c.Read(ents)
		require.ErrorIs(t, err, cq.ErrAvail)
		var ee cq.ErrEntry
		require.NoError(t, c.ReadErr(&ee))
		require.Equal(t, cq.ProvBadLen, ee.ProvErrno)
		require.Equal(t, cq.EIO, ee.Err)
		require.Equal(t, &ctx[1], ee.Context)
		t.Logf("%s: %s", c.StrError(ee.ProvErrno, ee.ErrData), ee.ErrData)
		for range 2 {
			_, err = c.Read(ents)
			require.ErrorIs(t, err, cq.ErrAvail)
			require.NoError(t, c.ReadErr(&ee))
			require.Equal(t, cq.ProvMultiBuffer, ee.ProvErrno)
			require.Equal(t, cq.ETRUNC, ee.Err)
			require.Contains(t, c.StrError(ee.ProvErrno, ee.ErrData), "several receive buffers")
		}
		n, err = c.Read(ents)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Equal(t, &ctx[4], ents[0].Context)

		// A device that completes an id it was never given.
		d.complete(7, 100, 1)
		_, err = c.Read(nil)
		require.ErrorIs(t, err, cq.ErrAvail, "a zero-count read sees an error at the head")
		require.NoError(t, c.ReadErr(&ee), "ReadErr takes it")
		require.Equal(t, cq.ProvBadID, ee.ProvErrno)
		t.Logf("%s", c.StrError(ee.ProvErrno, ee.ErrData))
	})
}

func TestCQReadErrKeepsSuccess(t *testing.T) {
	r := newRig(t, 8, true, true, 64<<10)
	rx := r.rxQueue(t, 16, 2048, true)
	c := bindTest(t, &rx.queue, rx, cq.FormatData)
	postN(t, rx, 4)
	deliver(t, r.dev, frameFor(9, 64), 1)
	var ee cq.ErrEntry
	require.ErrorIs(t, c.ReadErr(&ee), cq.ErrAgain, "the head is a success")
	_, err := c.Read(nil)
	require.NoError(t, err)
	ents := make([]cq.Entry, 4)
	n, err := c.Read(ents)
	require.NoError(t, err)
	require.Equal(t, 1, n, "the entry ReadErr looked at is not lost")
	f, err := rx.Frame(ents[0].Buf, ents[0].Len)
	require.NoError(t, err)
	require.Equal(t, frameFor(9, 64), f)
}

func TestCQSendAndFormats(t *testing.T) {
	r := newRig(t, 8, false, true, 64<<10)
	tx := r.txQueue(t, 1500)
	c := bindTest(t, &tx.queue, tx, cq.FormatContext)
	ctx := new(int)
	require.NoError(t, tx.Send(frameFor(1, 200), ctx))
	require.NoError(t, tx.Flush())
	x, _ := r.dev.take()
	r.dev.complete(x.id, 0, 1)
	ents := make([]cq.Entry, 4)
	addrs := make([]cq.Addr, 4)
	n, err := c.ReadFrom(ents, addrs)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, cq.Entry{Context: ctx, Queue: 3}, ents[0], "FormatContext reports the context (and queue) only")
	require.Equal(t, cq.AddrNotAvail, addrs[0])
}

func TestCQSRead(t *testing.T) {
	forRings(t, func(t *testing.T, packed bool) {
		r := newRig(t, 8, packed, true, 64<<10)
		rx := r.rxQueue(t, 16, 2048, true)
		c := bindTest(t, &rx.queue, rx, cq.FormatData)
		postN(t, rx, 8)
		ents := make([]cq.Entry, 4)
		_, err := c.SRead(context.Background(), ents, 0, 30*time.Millisecond)
		require.ErrorIs(t, err, cq.ErrTimeout)
		require.True(t, rx.vq.armed, "a blocking read arms the ring")
		go func() {
			time.Sleep(20 * time.Millisecond)
			if x, ok := r.dev.take(); ok {
				r.dev.complete(x.id, writeFrame(x, frameFor(5, 64), 1), 1)
			}
			_ = c.Driver().Interrupt().Add(1) // what the MSI-X vector does once rewired
		}()
		n, err := c.SRead(context.Background(), ents, 0, 5*time.Second)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.True(t, rx.vq.armed, "a queue that feeds a CQ stays armed until the device fires: reading does not cancel a request-notify")
	})
}

func TestCQReadNoAllocations(t *testing.T) {
	r := newRig(t, 64, true, true, 512<<10)
	rx := r.rxQueue(t, 128, 2048, true)
	c := bindTest(t, &rx.queue, rx, cq.FormatData)
	postN(t, rx, 64)
	f := frameFor(1, 64)
	ents := make([]cq.Entry, 32)
	allocs := testing.AllocsPerRun(100, func() {
		for range 32 {
			x, _ := r.dev.take()
			r.dev.complete(x.id, writeFrame(x, f, 1), 1)
		}
		n, _ := c.Read(ents)
		for _, e := range ents[:n] {
			_ = rx.Repost(e.Buf, nil)
		}
		_ = rx.Flush()
	})
	require.Zero(t, allocs)
}

// TestUsedRingsTakeTheBatchLoop: the used ring of either direction, packed
// or split, takes the ring reader's batch loop (NextBatch), not the
// generic read of each entry; a change to PackedLayout or SplitLayout
// that this test catches needs cq/ring's batchPlan to take it.
func TestUsedRingsTakeTheBatchLoop(t *testing.T) {
	for _, packed := range []bool{true, false} {
		r := newRig(t, 256, packed, false, 256*2048+64<<10)
		require.True(t, r.rxQueue(t, 256, 2048, false).vq.rd.Batched(), "receive, packed=%v", packed)
	}
	for _, packed := range []bool{true, false} {
		r := newRig(t, 256, packed, false, 256*2048+64<<10)
		require.True(t, r.txQueue(t, 1500).vq.rd.Batched(), "transmit, packed=%v", packed)
	}
}
