package virtio

import (
	"context"
	"encoding/binary"
	"github.com/vfnic/vfnic/cq"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/nic"
)

// These tests play a device that writes used entries the driver never
// posted: each bad entry must come back as an error completion (always
// the last of its batch), the driver's bookkeeping must stay consistent
// (buffers recycled, ids reusable), and nothing may panic or touch memory
// outside the ring and the posted buffers.

// postN posts n receive buffers with contexts 0..n-1 and publishes them.
func postN(t *testing.T, rx *RxQueue, n int) []int {
	t.Helper()
	ctx := make([]int, n)
	for i := range ctx {
		ctx[i] = i
		require.NoError(t, rx.PostRecv(&ctx[i]))
	}
	require.NoError(t, rx.Flush())
	return ctx
}

// writeFrame puts a valid header (num_buffers nb) and frame in the
// buffer the device took.
func writeFrame(tk taken, frame []byte, nb uint16) uint32 {
	b := tk.data(0)
	clear(b[:netHdrLen])
	binary.LittleEndian.PutUint16(b[netHdrNumBuffers:], nb)
	copy(b[netHdrLen:], frame)
	return uint32(netHdrLen + len(frame))
}

// accounted checks that every receive buffer is free, posted or lent, and
// that the ring's outstanding count matches the posted ones.
func accounted(t *testing.T, rx *RxQueue, lent int) {
	t.Helper()
	posted, lentNow := rx.bufs.Counts()
	require.Equal(t, lent, lentNow, "lent buffers")
	require.Equal(t, rx.bufs.Cap(), rx.bufs.Free()+posted+lent, "pool accounting")
	require.Equal(t, posted, rx.vq.nbufs, "posted buffers are the outstanding ones")
}

// misbehaveRx is a misbehaving-device case's start: a receive queue of
// a ring of size (packed, with merged buffers; or split, without), with
// posted buffers posted and flushed, and its fake device.
func misbehaveRx(t *testing.T, size int, packed bool, posted int) (*RxQueue, *fakeDev) {
	r := newRig(t, size, packed, true, 64<<10)
	rx := r.rxQueue(t, 16, 2048, packed)
	postN(t, rx, posted)
	return rx, r.dev
}

func TestMisbehavingPackedDevice(t *testing.T) {
	const size = 8
	var comps [8]nic.Completion
	good := frameFor(1, 64)

	t.Run("bad-ids", func(t *testing.T) {
		rx, d := misbehaveRx(t, size, true, 4)
		tk := d.takeN(4)
		// Position 0: an id far outside the ring; position 1: an id inside
		// it that was never posted; then the device "completes" id 2 twice.
		d.writeUsed(0, 0x7fff, 100, true, true)
		d.writeUsed(1, 6, 100, true, true)
		d.writeUsed(2, tk[2].id, writeFrame(tk[2], good, 1), true, true)
		d.writeUsed(3, tk[2].id, writeFrame(tk[2], good, 1), true, true)
		n := rx.Poll(comps[:])
		require.Equal(t, 1, n, "an error ends the batch")
		require.ErrorIs(t, comps[0].Err, cq.ProvBadID)
		require.Nil(t, comps[0].Context)
		require.Zero(t, comps[0].Buf)
		require.Nil(t, comps[0].Data)
		t.Logf("bad id: %v", comps[0].Err)
		require.Equal(t, 1, rx.Poll(comps[:]))
		require.ErrorIs(t, comps[0].Err, cq.ProvBadID)
		n = rx.Poll(comps[:])
		require.Equal(t, 2, n, "the good completion, then the duplicate")
		require.NoError(t, comps[0].Err)
		require.Equal(t, good, comps[0].Data)
		require.Equal(t, 2, *comps[0].Context.(*int))
		require.ErrorIs(t, comps[1].Err, cq.ProvBadID, "the same id completed twice")
		require.Zero(t, rx.Poll(comps[:]))
		accounted(t, rx, 1)
		require.Equal(t, uint64(3), rx.Stats().Errors)
		require.Equal(t, uint64(1), rx.Stats().Packets)
	})

	t.Run("bad-lengths", func(t *testing.T) {
		rx, d := misbehaveRx(t, size, true, 4)
		tk := d.takeN(4)
		writeFrame(tk[0], good, 1)
		d.complete(tk[0].id, 4096, 1) // beyond the 2048-byte buffer
		d.complete(tk[1].id, netHdrLen+5, 1)
		d.complete(tk[2].id, 0xffffffff, 1)
		d.complete(tk[3].id, writeFrame(tk[3], good, 1), 1)
		for i := range 3 {
			require.Equal(t, 1, rx.Poll(comps[:]))
			require.ErrorIs(t, comps[0].Err, cq.ProvBadLen)
			require.Equal(t, i, *comps[0].Context.(*int), "the context of the refused buffer comes back")
			require.Zero(t, comps[0].Buf, "its buffer is recycled, not lent")
			t.Logf("bad length: %v", comps[0].Err)
		}
		require.Equal(t, 1, rx.Poll(comps[:]))
		require.NoError(t, comps[0].Err)
		accounted(t, rx, 1)
		require.Equal(t, 15, rx.bufs.Free(), "three refused buffers went back to the pool")
	})

	t.Run("out-of-phase", func(t *testing.T) {
		rx, d := misbehaveRx(t, size, true, 2)
		x, _ := d.take()
		// USED set to the wrap counter while AVAIL is not: never written
		// by a correct device.
		d.writeUsed(0, x.id, writeFrame(x, good, 1), false, true)
		require.Equal(t, 1, rx.Poll(comps[:]))
		require.ErrorIs(t, comps[0].Err, cq.ProvBadPhase)
		t.Logf("phase: %v", comps[0].Err)
		// A descriptor left from the previous lap (both bits clear on lap
		// 1) is not a completion at all.
		d.writeUsed(1, 0, 100, false, false)
		require.Zero(t, rx.Poll(comps[:]))
		// And a posted but unused descriptor (AVAIL set, USED clear) waits.
		d.writeUsed(1, 1, 100, true, false)
		require.Zero(t, rx.Poll(comps[:]))
	})

	t.Run("multi-buffer-claim-beyond-posted", func(t *testing.T) {
		// A header claiming more buffers than the device holds: the
		// frame is bounded by the buffers outstanding when its first
		// entry was taken (5 posted: that one and 4 more), counted the
		// same whether the rest come in the same batch or later.
		rx, d := misbehaveRx(t, size, true, 5)
		tk := d.takeN(4)
		d.complete(tk[0].id, writeFrame(tk[0], good, 200), 1)
		for _, x := range tk[1:] {
			d.complete(x.id, 100, 1)
		}
		for i := range 4 {
			require.Equal(t, 1, rx.Poll(comps[:]))
			var mb *nic.MultiBufferError
			require.ErrorAs(t, comps[0].Err, &mb)
			require.Equal(t, 5, mb.Buffers, "entry %d", i)
			require.Equal(t, i, mb.Buffer)
		}
	})

	t.Run("multi-buffer", func(t *testing.T) {
		rx, d := misbehaveRx(t, size, true, 5)
		tk := d.takeN(4)
		d.complete(tk[0].id, writeFrame(tk[0], good, 3), 1) // a frame in 3 buffers
		d.complete(tk[1].id, 2048, 1)
		d.complete(tk[2].id, 500, 1)
		d.complete(tk[3].id, writeFrame(tk[3], good, 1), 1)
		// Each buffer says where it sits in the frame and how much it
		// holds, so that a caller can count the frame and its length.
		for i, n := range []int{len(good), 2048, 500} { // one header, in the first
			require.Equal(t, 1, rx.Poll(comps[:]))
			require.ErrorIs(t, comps[0].Err, cq.ProvMultiBuffer)
			var mb *nic.MultiBufferError
			require.ErrorAs(t, comps[0].Err, &mb)
			require.Equal(t, nic.MultiBufferError{Queue: mb.Queue, Buffer: i, Buffers: 3, Bytes: n}, *mb)
		}
		require.Equal(t, 1, rx.Poll(comps[:]))
		require.NoError(t, comps[0].Err)
		require.Equal(t, good, comps[0].Data)
		accounted(t, rx, 1)
	})
}

func TestMisbehavingSplitDevice(t *testing.T) {
	const size = 8
	var comps [8]nic.Completion
	good := frameFor(2, 80)
	usedEntry := func(d *fakeDev, i uint16, id, length uint32) {
		e := unsafe.Pointer(&d.mem.device[4+8*int(i&(size-1))])
		*(*uint32)(e) = id
		*(*uint32)(unsafe.Add(e, 4)) = length
	}

	t.Run("bad-ids-and-lengths", func(t *testing.T) {
		rx, d := misbehaveRx(t, size, false, 4)
		tk := d.takeN(4)
		usedEntry(d, 0, 1<<31, 100)                                   // id far out of range
		usedEntry(d, 1, 7, 100)                                       // in range, never posted
		usedEntry(d, 2, uint32(tk[0].id), 9000)                       // length beyond the buffer
		usedEntry(d, 3, uint32(tk[1].id), writeFrame(tk[1], good, 1)) // good
		d.usedIdx = 4
		d.publishUsed()
		want := []error{cq.ProvBadID, cq.ProvBadID, cq.ProvBadLen}
		for _, w := range want {
			require.Equal(t, 1, rx.Poll(comps[:]))
			require.ErrorIs(t, comps[0].Err, w)
			t.Logf("%v", comps[0].Err)
		}
		require.Equal(t, 1, rx.Poll(comps[:]))
		require.NoError(t, comps[0].Err)
		require.Equal(t, good, comps[0].Data)
		accounted(t, rx, 1)
	})

	t.Run("index-beyond-posted", func(t *testing.T) {
		rx, d := misbehaveRx(t, size, false, 4)
		d.usedIdx = 1000 // claims 1000 used buffers with 4 outstanding
		d.publishUsed()
		require.Equal(t, 1, rx.Poll(comps[:]))
		require.ErrorIs(t, comps[0].Err, cq.ProvBadIndex)
		t.Logf("index: %v", comps[0].Err)
		require.Zero(t, rx.Poll(comps[:]), "a broken queue returns nothing more")
		require.ErrorIs(t, rx.PostRecv(nil), nic.ErrBroken)
		require.ErrorIs(t, rx.Flush(), nic.ErrBroken)
		_, err := rx.SRead(context.Background(), comps[:], 1, time.Second)
		require.ErrorIs(t, err, nic.ErrBroken, "a blocking read does not wait on a broken queue")
	})

	// A used index ahead of the buffers made available by less than a
	// ring: the entries it covers are last lap's, and the ids of those
	// posted again look valid (split ids carry no generation). One bad
	// index error, no completion of a buffer the device never used.
	t.Run("index-within-a-ring-beyond-available", func(t *testing.T) {
		rx, d := misbehaveRx(t, size, false, size)
		for _, tk := range d.takeN(size) {
			d.complete(tk.id, writeFrame(tk, frameFor(int(tk.id), 64), 1), 1)
		}
		for got := 0; got < size; {
			n := rx.Poll(comps[:])
			require.NotZero(t, n)
			for _, c := range comps[:n] {
				require.NoError(t, c.Err)
				require.NoError(t, rx.Release(c.Buf))
			}
			got += n
		}
		postN(t, rx, 2) // available index 10
		d.usedIdx = 16  // 8 more used: 2 buffers outstanding
		d.publishUsed()
		var errs []error
		for range 4 {
			n := rx.Poll(comps[:])
			for _, c := range comps[:n] {
				require.Error(t, c.Err, "a completion of a buffer the device never used (context %v)", c.Context)
				errs = append(errs, c.Err)
			}
		}
		require.Len(t, errs, 1)
		require.ErrorIs(t, errs[0], cq.ProvBadIndex)
		require.ErrorIs(t, rx.PostRecv(nil), nic.ErrBroken)
		require.Equal(t, 2, rx.Outstanding(), "the two posted are still the device's")
		accounted(t, rx, 0)
	})

	t.Run("transmit", func(t *testing.T) {
		r := newRig(t, size, false, true, 64<<10)
		tx := r.txQueue(t, 1500)
		require.NoError(t, tx.Send(good, nil))
		require.NoError(t, tx.Send(good, nil))
		require.NoError(t, tx.Flush())
		x, _ := r.dev.take()
		usedEntry(r.dev, 0, 5, 0)                // never sent
		usedEntry(r.dev, 1, uint32(x.id), 1<<30) // a transmit length is ignored
		r.dev.usedIdx = 2
		r.dev.publishUsed()
		require.Equal(t, 1, tx.Poll(comps[:]))
		require.ErrorIs(t, comps[0].Err, cq.ProvBadID)
		require.Equal(t, 1, tx.Poll(comps[:]))
		require.NoError(t, comps[0].Err)
		require.Equal(t, len(good), comps[0].Len)
		require.Equal(t, 1, tx.Outstanding())
	})
}

// TestRandomDeviceWrites fills the device-written parts of the rings with
// random bytes while buffers are outstanding and polls: whatever the
// device writes, the driver must not panic, must hand out only buffers it
// posted, and must keep its accounting.
func TestRandomDeviceWrites(t *testing.T) {
	forRings(t, func(t *testing.T, packed bool) {
		rng := rand.New(rand.NewPCG(1, uint64(len(t.Name()))))
		var comps [8]nic.Completion
		for round := range 300 {
			r := newRig(t, 8, packed, round%2 == 0, 64<<10)
			rx := r.rxQueue(t, 16, 2048, round%3 == 0)
			postN(t, rx, 1+rng.IntN(8))
			// Some legitimate traffic first, so the garbage lands mid-ring.
			for range rng.IntN(4) {
				if x, ok := r.dev.take(); ok {
					r.dev.complete(x.id, writeFrame(x, frameFor(0, 64), 1), x.ndesc)
				}
			}
			area := r.mem.device
			if packed {
				area = r.mem.desc
			}
			for range 1 + rng.IntN(16) {
				i := rng.IntN(len(area)/4) * 4
				atomic.StoreUint32((*uint32)(unsafe.Pointer(&area[i])), rng.Uint32())
			}
			lent := 0
			for range 20 {
				n := rx.Poll(comps[:])
				for _, c := range comps[:n] {
					if c.Err != nil {
						continue
					}
					require.GreaterOrEqual(t, c.Len, nic.MinFrame)
					require.LessOrEqual(t, c.Len, 2048-netHdrLen)
					_, err := rx.bufs.Lent(c.Buf)
					require.NoError(t, err, "a completion lends a buffer the queue posted")
					lent++
				}
			}
			accounted(t, rx, lent)
		}
	})
}
