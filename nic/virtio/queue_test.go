package virtio

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/nic"
)

func forRings(t *testing.T, fn func(t *testing.T, packed bool)) {
	for _, packed := range []bool{true, false} {
		name := "split"
		if packed {
			name = "packed"
		}
		t.Run(name, func(t *testing.T) { fn(t, packed) })
	}
}

// frameFor builds a recognisable frame of n bytes for sequence number seq.
func frameFor(seq, n int) []byte {
	b := make([]byte, n)
	copy(b, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0, 0, 1, 0x88, 0xb5})
	binary.BigEndian.PutUint32(b[14:], uint32(seq))
	for i := 18; i < n; i++ {
		b[i] = byte(seq + i)
	}
	return b
}

// deliver has the fake device fill one available receive buffer with frame.
func deliver(t *testing.T, d *fakeDev, frame []byte, numBuffers uint16) taken {
	t.Helper()
	tk, ok := d.take()
	require.True(t, ok, "a receive buffer is available")
	require.Equal(t, uint16(descWrite), tk.segs[0].flags, "receive buffers are device-writable")
	b := tk.data(0)
	clear(b[:netHdrLen])
	binary.LittleEndian.PutUint16(b[netHdrNumBuffers:], numBuffers)
	copy(b[netHdrLen:], frame)
	d.complete(tk.id, uint32(netHdrLen+len(frame)), tk.ndesc)
	return tk
}

func TestRxRoundTripManyWraps(t *testing.T) {
	forRings(t, func(t *testing.T, packed bool) {
		r := newRig(t, 8, packed, true, 64<<10)
		rx := r.rxQueue(t, 16, 2048, true)
		ctxs := make([]int, 16)
		for i := range ctxs {
			ctxs[i] = i
		}
		posted := 0
		for rx.PostRecv(&ctxs[posted%16]) == nil {
			posted++
		}
		require.Equal(t, 8, posted, "the ring takes as many buffers as descriptors")
		require.NoError(t, rx.Flush())
		require.Equal(t, uint16(3), r.notified(), "the doorbell carries the queue index")
		var comps [4]nic.Completion
		seq, got := 0, 0
		for got < 1000 {
			// The device fills a few buffers of varying sizes.
			k := 1 + seq%3
			for i := 0; i < k; i++ {
				deliver(t, r.dev, frameFor(seq+i, 60+(seq+i)*37%1455), 1)
			}
			seq += k
			for {
				n := rx.Poll(comps[:])
				if n == 0 {
					break
				}
				for _, c := range comps[:n] {
					require.NoError(t, c.Err)
					require.Equal(t, frameFor(got, 60+got*37%1455), c.Data, "frame %d", got)
					require.Equal(t, len(c.Data), c.Len)
					require.NotNil(t, c.Context)
					require.NoError(t, rx.Repost(c.Buf, c.Context))
					got++
				}
			}
			require.NoError(t, rx.Flush())
		}
		require.Equal(t, 8, rx.Outstanding())
		st := rx.Stats()
		require.Equal(t, uint64(got), st.Packets)
		require.Zero(t, st.Errors)
		t.Logf("%d frames, %d notifies, %d suppressed", got, st.Notifies, st.Suppressed)
	})
}

func TestTxRoundTripOutOfOrder(t *testing.T) {
	forRings(t, func(t *testing.T, packed bool) {
		r := newRig(t, 8, packed, true, 64<<10)
		tx := r.txQueue(t, 1500)
		var comps [8]nic.Completion
		ctx := make([]int, 3000)
		next, done := 0, 0
		for done < len(ctx) {
			for next < len(ctx) {
				ctx[next] = next
				if err := tx.Send(frameFor(next, 64+next%1450), &ctx[next]); err != nil {
					require.ErrorIs(t, err, nic.ErrFull)
					break
				}
				next++
			}
			require.NoError(t, tx.Flush())
			// The device reads everything available, then completes in
			// reverse order.
			var tks []taken
			for {
				tk, ok := r.dev.take()
				if !ok {
					break
				}
				require.Len(t, tk.segs, 1)
				require.Zero(t, tk.segs[0].flags, "transmit buffers are device-readable")
				b := tk.data(0)
				require.Equal(t, make([]byte, netHdrLen), b[:netHdrLen], "zero virtio-net header")
				tks = append(tks, tk)
			}
			require.NotEmpty(t, tks)
			for i := len(tks) - 1; i >= 0; i-- {
				r.dev.complete(tks[i].id, 0, tks[i].ndesc)
			}
			// Completions come back in the device's order; the frame each
			// one names was sent intact.
			want := next - 1
			for {
				n := tx.Poll(comps[:])
				if n == 0 {
					break
				}
				for _, c := range comps[:n] {
					require.NoError(t, c.Err)
					seq := *c.Context.(*int)
					require.Equal(t, want, seq)
					require.Equal(t, 64+seq%1450, c.Len)
					want--
					done++
				}
			}
			require.Equal(t, next-len(tks)-1, want)
		}
		require.Zero(t, tx.Outstanding())
	})
}

func TestTxBytesOnTheWire(t *testing.T) {
	forRings(t, func(t *testing.T, packed bool) {
		r := newRig(t, 4, packed, false, 64<<10)
		tx := r.txQueue(t, 1500)
		f := frameFor(7, 1514)
		require.NoError(t, tx.Send(f, nil))
		_, ok := r.dev.take()
		require.False(t, ok, "nothing is visible before Flush")
		require.NoError(t, tx.Flush())
		tk, ok := r.dev.take()
		require.True(t, ok)
		require.Equal(t, uint32(netHdrLen+1514), tk.segs[0].len)
		require.True(t, bytes.Equal(f, tk.data(0)[netHdrLen:]))
		require.ErrorIs(t, tx.Send(make([]byte, 13), nil), nic.ErrFrameSize)
		// Tagged full-size frames (802.1Q 1518, QinQ 1522) fit an MTU of
		// 1500; one byte more does not, and the error says by how much.
		require.Equal(t, 1522, tx.MaxFrame())
		require.NoError(t, tx.Send(frameFor(8, 1522), nil))
		err := tx.Send(make([]byte, 1523), nil)
		require.ErrorIs(t, err, nic.ErrFrameSize)
		require.ErrorContains(t, err, "frame of 1523 bytes outside [14, 1522]")
	})
}

func TestRxBufferHandles(t *testing.T) {
	r := newRig(t, 4, true, true, 64<<10)
	rx := r.rxQueue(t, 6, 2048, true)
	for range 4 {
		require.NoError(t, rx.PostRecv(nil))
	}
	require.ErrorIs(t, rx.PostRecv(nil), nic.ErrFull, "ring full")
	require.NoError(t, rx.Flush())
	deliver(t, r.dev, frameFor(1, 100), 1)
	var comps [4]nic.Completion
	require.Equal(t, 1, rx.Poll(comps[:]))
	c := comps[0]
	require.ErrorIs(t, rx.Release(c.Buf+1), nic.ErrBadBuffer, "not a frame start")
	require.ErrorIs(t, rx.Release(c.Buf-netHdrLen), nic.ErrBadBuffer, "the header is not the frame")
	require.ErrorIs(t, rx.Release(0), nic.ErrBadBuffer)
	require.ErrorIs(t, rx.Release(c.Buf+1<<20), nic.ErrBadBuffer, "past the pool")
	require.NoError(t, rx.Release(c.Buf))
	require.ErrorIs(t, rx.Release(c.Buf), nic.ErrBadBuffer, "released twice")
	require.ErrorIs(t, rx.Repost(c.Buf, nil), nic.ErrBadBuffer, "not lent any more")
	// A buffer lent to the device cannot be released by a stale handle.
	require.NoError(t, rx.PostRecv(nil))
	require.ErrorIs(t, rx.Release(c.Buf), nic.ErrBadBuffer)
}

func TestPoolExhaustion(t *testing.T) {
	r := newRig(t, 4, false, true, 64<<10)
	rx := r.rxQueue(t, 4, 2048, false)
	for range 4 {
		require.NoError(t, rx.PostRecv(nil))
	}
	require.NoError(t, rx.Flush())
	var comps [4]nic.Completion
	for i := range 4 {
		deliver(t, r.dev, frameFor(i, 64), 1)
	}
	require.Equal(t, 4, rx.Poll(comps[:]))
	require.ErrorIs(t, rx.PostRecv(nil), nic.ErrFull, "all four buffers are lent to the caller")
	require.NoError(t, rx.Release(comps[0].Buf))
	require.NoError(t, rx.PostRecv(nil))
}

func TestNotifySuppression(t *testing.T) {
	t.Run("packed", func(t *testing.T) {
		r := newRig(t, 8, true, true, 64<<10)
		tx := r.txQueue(t, 1500)
		send := func(n int) {
			for range n {
				require.NoError(t, tx.Send(frameFor(0, 64), nil))
			}
			require.NoError(t, tx.Flush())
		}
		r.dev.setDeviceEvent(eventDisable, 0, false)
		send(1)
		require.Equal(t, uint64(0), r.v.notifies)
		require.Equal(t, uint64(1), r.v.suppressed)
		r.dev.setDeviceEvent(eventEnable, 0, false)
		send(1)
		require.Equal(t, uint64(1), r.v.notifies)
		// Descriptor event at position 4 on lap 1: the batch [2,3] does not
		// reach it, [4,5] does.
		r.dev.setDeviceEvent(eventDesc, 4, true)
		send(2)
		require.Equal(t, uint64(1), r.v.notifies)
		send(2)
		require.Equal(t, uint64(2), r.v.notifies)
		// Free the ring, then cross the wrap: event at position 1 of lap 0.
		var comps [8]nic.Completion
		for {
			tk, ok := r.dev.take()
			if !ok {
				break
			}
			r.dev.complete(tk.id, 0, 1)
		}
		require.Equal(t, 6, tx.Poll(comps[:]))
		r.dev.setDeviceEvent(eventDesc, 1, false)
		send(3) // positions 6, 7, 0: not 1
		require.Equal(t, uint64(2), r.v.notifies)
		send(1) // position 1
		require.Equal(t, uint64(3), r.v.notifies)
		// An event left on the previous lap, behind the batch, may be
		// one the device did not move as it went on (QEMU): notify.
		r.dev.setDeviceEvent(eventDesc, 5, true)
		for {
			tk, ok := r.dev.take()
			if !ok {
				break
			}
			r.dev.complete(tk.id, 0, 1)
		}
		require.Equal(t, 4, tx.Poll(comps[:]))
		send(1) // position 2 of lap 0
		require.Equal(t, uint64(4), r.v.notifies)
	})
	t.Run("split", func(t *testing.T) {
		r := newRig(t, 8, false, true, 64<<10)
		tx := r.txQueue(t, 1500)
		send := func(n int) {
			for range n {
				require.NoError(t, tx.Send(frameFor(0, 64), nil))
			}
			require.NoError(t, tx.Flush())
		}
		r.dev.setAvailEvent(0)
		send(1) // index 0 -> 1 crosses event 0
		require.Equal(t, uint64(1), r.v.notifies)
		r.dev.setAvailEvent(3)
		send(2) // 1 -> 3: event 3 not crossed
		require.Equal(t, uint64(1), r.v.notifies)
		send(1) // 3 -> 4 crosses 3
		require.Equal(t, uint64(2), r.v.notifies)
	})
	t.Run("split-flags", func(t *testing.T) {
		r := newRig(t, 8, false, false, 64<<10)
		tx := r.txQueue(t, 1500)
		r.dev.usedFlags = usedNoNotify
		r.dev.publishUsed()
		require.NoError(t, tx.Send(frameFor(0, 64), nil))
		require.NoError(t, tx.Flush())
		require.Equal(t, uint64(0), r.v.notifies)
		r.dev.usedFlags = 0
		r.dev.publishUsed()
		require.NoError(t, tx.Send(frameFor(0, 64), nil))
		require.NoError(t, tx.Flush())
		require.Equal(t, uint64(1), r.v.notifies)
		require.NoError(t, tx.Flush())
		require.Equal(t, uint64(1), r.v.notifies, "nothing new: no doorbell")
	})
}

func TestArm(t *testing.T) {
	t.Run("packed-event-idx", func(t *testing.T) {
		r := newRig(t, 8, true, true, 64<<10)
		rx := r.rxQueue(t, 16, 2048, false)
		fl, _, _ := r.dev.driverEvent()
		require.Equal(t, uint16(eventDisable), fl, "interrupts start off")
		for range 8 {
			require.NoError(t, rx.PostRecv(nil))
		}
		require.NoError(t, rx.Flush())
		require.NoError(t, rx.Arm(3))
		fl, off, wrap := r.dev.driverEvent()
		require.Equal(t, uint16(eventDesc), fl)
		require.Equal(t, uint16(2), off)
		require.True(t, wrap)
		var comps [8]nic.Completion
		for i := range 7 {
			deliver(t, r.dev, frameFor(i, 64), 1)
		}
		require.Equal(t, 7, rx.Poll(comps[:]))
		fl, _, _ = r.dev.driverEvent()
		require.Equal(t, uint16(eventDisable), fl, "a poll that returned entries disarms")
		require.NoError(t, rx.Arm(2)) // one buffer outstanding: aim at it, position 7
		fl, off, wrap = r.dev.driverEvent()
		require.Equal(t, uint16(eventDesc), fl)
		require.Equal(t, uint16(7), off)
		require.True(t, wrap)
		for _, c := range comps[:7] {
			require.NoError(t, rx.Repost(c.Buf, nil))
		}
		require.NoError(t, rx.Flush())
		require.NoError(t, rx.Arm(2)) // from position 7: the event lands on 0 of lap 0
		fl, off, wrap = r.dev.driverEvent()
		require.Equal(t, uint16(eventDesc), fl)
		require.Equal(t, uint16(0), off)
		require.False(t, wrap)
	})
	t.Run("packed-flags", func(t *testing.T) {
		r := newRig(t, 8, true, false, 64<<10)
		rx := r.rxQueue(t, 16, 2048, false)
		require.NoError(t, rx.Arm(5))
		fl, _, _ := r.dev.driverEvent()
		require.Equal(t, uint16(eventEnable), fl)
	})
	t.Run("split-event-idx", func(t *testing.T) {
		r := newRig(t, 8, false, true, 64<<10)
		rx := r.rxQueue(t, 16, 2048, false)
		require.Equal(t, uint16(0x8000), r.dev.usedEvent(), "interrupts start far away")
		postN(t, rx, 8)
		require.NoError(t, rx.Arm(4))
		require.Equal(t, uint16(3), r.dev.usedEvent())
		require.NoError(t, rx.Arm(20))
		require.Equal(t, uint16(7), r.dev.usedEvent(), "aimed at the last outstanding buffer")
	})
	t.Run("split-flags", func(t *testing.T) {
		r := newRig(t, 8, false, false, 64<<10)
		rx := r.rxQueue(t, 16, 2048, false)
		require.Equal(t, uint16(availNoInterrupt), r.dev.availFlags())
		require.NoError(t, rx.Arm(1))
		require.Zero(t, r.dev.availFlags())
		for range 2 {
			require.NoError(t, rx.PostRecv(nil))
		}
		require.NoError(t, rx.Flush())
		require.Zero(t, r.dev.availFlags(), "publishing keeps the armed flags")
		deliver(t, r.dev, frameFor(0, 64), 1)
		var comps [2]nic.Completion
		require.Equal(t, 1, rx.Poll(comps[:]))
		require.Equal(t, uint16(availNoInterrupt), r.dev.availFlags())
	})
}

// TestArmPastUsedBuffers: a reader that counts ready entries without
// taking them (a cq.CQ waiting for a threshold) arms with every
// outstanding buffer already used. Aiming at the last of them, the device
// would never fire again; the event goes to the threshold instead.
func TestArmPastUsedBuffers(t *testing.T) {
	forRings(t, func(t *testing.T, packed bool) {
		r := newRig(t, 8, packed, true, 64<<10)
		rx := r.rxQueue(t, 16, 2048, false)
		postN(t, rx, 2)
		require.NoError(t, rx.Arm(4))
		event := func() uint16 {
			if packed {
				_, off, _ := r.dev.driverEvent()
				return off
			}
			return r.dev.usedEvent()
		}
		require.Equal(t, uint16(1), event(), "two outstanding, none used: aimed at the second")
		deliver(t, r.dev, frameFor(0, 64), 1)
		deliver(t, r.dev, frameFor(1, 64), 1)
		require.Equal(t, 2, rx.Ready(8))
		require.NoError(t, rx.Arm(4))
		require.Equal(t, uint16(3), event(), "both used and unread: aimed at the fourth, which later posts reach")
		postN(t, rx, 1)
		require.NoError(t, rx.Arm(4))
		require.Equal(t, uint16(2), event(), "a third outstanding and not used: aimed at it")
		deliver(t, r.dev, frameFor(2, 64), 1)
		require.NoError(t, rx.Arm(4))
		require.Equal(t, uint16(3), event(), "all three used: aimed at the fourth")
	})
}

func TestSReadWakesAndTimesOut(t *testing.T) {
	forRings(t, func(t *testing.T, packed bool) {
		r := newRig(t, 8, packed, true, 64<<10)
		rx := r.rxQueue(t, 16, 2048, false)
		for range 8 {
			require.NoError(t, rx.PostRecv(nil))
		}
		require.NoError(t, rx.Flush())
		var comps [4]nic.Completion
		start := time.Now()
		n, err := rx.SRead(context.Background(), comps[:], 1, 50*time.Millisecond)
		require.ErrorIs(t, err, nic.ErrTimeout)
		require.Zero(t, n)
		require.GreaterOrEqual(t, time.Since(start), 50*time.Millisecond)
		n, err = rx.SRead(context.Background(), comps[:], 1, 0)
		require.ErrorIs(t, err, nic.ErrTimeout, "zero timeout polls once")
		require.Zero(t, n)

		// A "device" delivers two frames 20 ms after the read blocks, then
		// raises the interrupt.
		go func() { // no require here: a failure shows as a timeout below
			time.Sleep(20 * time.Millisecond)
			for i := range 2 {
				if x, ok := r.dev.take(); ok {
					r.dev.complete(x.id, writeFrame(x, frameFor(i+1, 64), 1), x.ndesc)
				}
			}
			_ = rx.Interrupt().Add(1)
		}()
		n, err = rx.SRead(context.Background(), comps[:], 2, 5*time.Second)
		require.NoError(t, err)
		require.Equal(t, 2, n)
		require.Equal(t, uint64(1), rx.Stats().Interrupts)

		ctx, cancel := context.WithCancel(context.Background())
		go func() { time.Sleep(10 * time.Millisecond); cancel() }()
		_, err = rx.SRead(ctx, comps[:], 1, -1)
		require.ErrorIs(t, err, context.Canceled)
	})
}

func TestTxNoAllocations(t *testing.T) {
	forRings(t, func(t *testing.T, packed bool) {
		r := newRig(t, 64, packed, true, 256<<10)
		tx := r.txQueue(t, 1500)
		rx := newRig(t, 64, packed, true, 512<<10)
		rq := rx.rxQueue(t, 128, 2048, true)
		for range 64 {
			require.NoError(t, rq.PostRecv(nil))
		}
		require.NoError(t, rq.Flush())
		frame := frameFor(1, 64)
		var comps [32]nic.Completion
		ctx := new(int)
		allocs := testing.AllocsPerRun(200, func() {
			for range 32 {
				if err := tx.Send(frame, ctx); err != nil {
					panic(err)
				}
			}
			_ = tx.Flush()
			r.dev.sendAll(tx, comps[:])
			for range 32 {
				deliver(t, rx.dev, frame, 1)
			}
			for {
				n := rq.Poll(comps[:])
				if n == 0 {
					break
				}
				for _, c := range comps[:n] {
					if c.Err != nil {
						panic(c.Err)
					}
					_ = rq.Repost(c.Buf, ctx)
				}
			}
			_ = rq.Flush()
		})
		require.Zero(t, allocs, "send, flush, poll, receive and repost allocate nothing")
	})
}

func BenchmarkTxPoll(b *testing.B) {
	for _, packed := range []bool{true, false} {
		b.Run(fmt.Sprintf("packed=%v", packed), func(b *testing.B) {
			r := newRig(b, 256, packed, true, 1<<20)
			tx := r.txQueue(b, 1500)
			frame := frameFor(1, 64)
			var comps [32]nic.Completion
			b.ResetTimer()
			for i := 0; i < b.N; i += 32 {
				for range 32 {
					_ = tx.Send(frame, nil)
				}
				_ = tx.Flush()
				for range 32 {
					tk, _ := r.dev.take()
					r.dev.complete(tk.id, 0, 1)
				}
				for tx.Poll(comps[:]) > 0 {
				}
			}
		})
	}
}

// TestPostRecvBufAndReady: PostRecvBuf says where the frame lands (the
// completion's Buf and Data are that slice), and Ready counts what the
// device wrote without taking it from the reader.
func TestPostRecvBufAndReady(t *testing.T) {
	forRings(t, func(t *testing.T, packed bool) {
		r := newRig(t, 4, packed, true, 64<<10)
		rx := r.rxQueue(t, 8, 2048, true)
		var bufs [][]byte
		for i := range 3 {
			b, err := rx.PostRecvBuf(i)
			require.NoError(t, err)
			require.Len(t, b, rx.MaxFrame())
			bufs = append(bufs, b)
		}
		require.NoError(t, rx.Flush())
		require.Zero(t, rx.Ready(8), "nothing written yet")
		deliver(t, r.dev, frameFor(0, 100), 1)
		deliver(t, r.dev, frameFor(1, 200), 1)
		require.Equal(t, 2, rx.Ready(8))
		require.Equal(t, 1, rx.Ready(1), "up to max")
		require.Equal(t, 2, rx.Ready(8), "counting consumes nothing")
		require.Equal(t, 3, rx.Outstanding())
		var comps [4]nic.Completion
		require.Equal(t, 2, rx.Poll(comps[:]))
		for i, c := range comps[:2] {
			require.Equal(t, i, c.Context)
			require.Equal(t, uintptr(unsafe.Pointer(&bufs[i][0])), c.Buf, "the frame landed where PostRecvBuf said")
			require.True(t, bytes.Equal(bufs[i][:c.Len], c.Data))
		}
		require.Zero(t, rx.Ready(8))
		require.Equal(t, 1, rx.Outstanding())
		for rx.PostRecv(nil) == nil {
		}
		_, err := rx.PostRecvBuf(nil)
		require.ErrorIs(t, err, nic.ErrFull)
	})
}

// TestArmNextBeyondReady: Arm(0) (verbs' request-notify) aims the event at
// the buffer after those already used and unread, so that completions
// present at the arm raise nothing and the next one does.
func TestArmNextBeyondReady(t *testing.T) {
	forRings(t, func(t *testing.T, packed bool) {
		r := newRig(t, 8, packed, true, 64<<10)
		rx := r.rxQueue(t, 16, 2048, false)
		postN(t, rx, 6)
		event := func() uint16 {
			if packed {
				_, off, _ := r.dev.driverEvent()
				return off
			}
			return r.dev.usedEvent()
		}
		require.NoError(t, rx.Arm(0))
		require.Equal(t, uint16(0), event(), "none used: the first")
		deliver(t, r.dev, frameFor(0, 64), 1)
		deliver(t, r.dev, frameFor(1, 64), 1)
		require.NoError(t, rx.Arm(0))
		require.Equal(t, uint16(2), event(), "two used and unread: the third")
		var comps [4]nic.Completion
		require.Equal(t, 2, rx.Poll(comps[:]))
		require.NoError(t, rx.Arm(0))
		require.Equal(t, uint16(2), event(), "read: the next is still the third")
	})
}
