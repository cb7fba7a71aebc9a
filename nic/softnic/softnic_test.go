package softnic_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/nic/softnic"
)

// pair opens both ends of an unnamed wire and closes them at the end.
func pair(t *testing.T, cfg nic.Config) (*softnic.Device, *softnic.Device) {
	t.Helper()
	a, b, err := softnic.Pair(cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, a.Close())
		require.NoError(t, b.Close())
	})
	return a, b
}

// frame is an Ethernet frame from src to dst carrying n as its payload,
// padded to size bytes.
func frame(dst, src []byte, n, size int) []byte {
	f := make([]byte, size)
	copy(f, dst)
	copy(f[6:], src)
	binary.BigEndian.PutUint16(f[12:], 0x88b5)
	binary.BigEndian.PutUint32(f[14:], uint32(n))
	for i := 18; i < size; i++ {
		f[i] = byte(n + i)
	}
	return f
}

// fill posts every buffer the receive queue takes.
func fill(t *testing.T, rx nic.RxQueue) {
	t.Helper()
	for rx.PostRecv(nil) == nil {
	}
	require.NoError(t, rx.Flush())
}

// send sends frames and reclaims their completions, which must succeed.
func send(t *testing.T, tx nic.TxQueue, frames ...[]byte) {
	t.Helper()
	for i, f := range frames {
		require.NoError(t, tx.Send(f, i))
	}
	require.NoError(t, tx.Flush())
	var comps [64]nic.Completion
	got := 0
	for got < len(frames) {
		n := tx.Poll(comps[:])
		require.NotZero(t, n, "send completions written during Flush")
		for _, c := range comps[:n] {
			require.NoError(t, c.Err)
			require.Equal(t, got, c.Context)
			got++
		}
	}
}

// recv reads n completions from rx (waiting at most a second for each
// batch), copying each frame or error, and reposting the buffers.
func recv(t *testing.T, rx nic.RxQueue, n int) ([][]byte, []error) {
	t.Helper()
	var frames [][]byte
	var errs []error
	var comps [64]nic.Completion
	for len(frames)+len(errs) < n {
		k, err := rx.SRead(t.Context(), comps[:min(len(comps), n-len(frames)-len(errs))], 1, time.Second)
		require.NoError(t, err, "after %d of %d", len(frames)+len(errs), n)
		for _, c := range comps[:k] {
			if c.Err != nil {
				errs = append(errs, c.Err)
				continue
			}
			require.Len(t, c.Data, c.Len)
			frames = append(frames, append([]byte(nil), c.Data...))
			require.NoError(t, rx.Repost(c.Buf, nil))
		}
		require.NoError(t, rx.Flush())
	}
	return frames, errs
}

func TestFramesBothWays(t *testing.T) {
	a, b := pair(t, nic.Config{QueueSize: 64})
	require.NotEqual(t, a.MAC(), b.MAC())
	for _, d := range []*softnic.Device{a, b} {
		l, err := d.Link()
		require.NoError(t, err)
		require.Equal(t, nic.Link{Up: true, Reported: true, SpeedMbps: 10000, FullDuplex: true}, l)
		i := d.Info()
		require.Equal(t, "softnic", i.Driver)
		require.Equal(t, 1500, i.MTU)
		require.Equal(t, 64, i.QueueSize)
		require.Equal(t, 128, i.RxBuffers)
	}
	for _, dir := range []struct{ from, to *softnic.Device }{{a, b}, {b, a}} {
		rx, err := dir.to.Rx(0)
		require.NoError(t, err)
		fill(t, rx)
		require.Equal(t, 64, rx.Outstanding())
		tx, err := dir.from.Tx(0)
		require.NoError(t, err)
		require.Equal(t, 1522, tx.MaxFrame())
		var sent [][]byte
		for i := range 40 {
			sent = append(sent, frame(dir.to.MAC(), dir.from.MAC(), i, 60+i*30))
		}
		send(t, tx, sent...)
		got, errs := recv(t, rx, len(sent))
		require.Empty(t, errs)
		require.Equal(t, sent, got)
	}
	sa, sb := a.Stats(), b.Stats()
	require.Equal(t, uint64(40), sa.Tx.Packets)
	require.Equal(t, uint64(40), sa.Rx.Packets)
	require.Equal(t, sa.Tx.Bytes, sb.Rx.Bytes)
	require.Equal(t, softnic.WireStats{Sent: 40, Delivered: 40}, a.Wire().Stats(0))
}

func TestSendChecks(t *testing.T) {
	a, _ := pair(t, nic.Config{QueueSize: 8})
	tx, err := a.Tx(0)
	require.NoError(t, err)
	require.ErrorIs(t, tx.Send(make([]byte, 13), nil), nic.ErrFrameSize)
	require.ErrorIs(t, tx.Send(make([]byte, 1523), nil), nic.ErrFrameSize)
	for range 8 {
		require.NoError(t, tx.Send(make([]byte, 60), nil))
	}
	require.ErrorIs(t, tx.Send(make([]byte, 60), nil), nic.ErrFull)
	require.Equal(t, 8, tx.Outstanding())
	require.NoError(t, tx.Flush())
	var comps [16]nic.Completion
	require.Equal(t, 8, tx.Poll(comps[:]))
	require.Zero(t, tx.Outstanding())
	rx, err := a.Rx(0)
	require.NoError(t, err)
	require.ErrorIs(t, rx.Release(12345), nic.ErrBadBuffer)
	require.ErrorIs(t, rx.Repost(12345, nil), nic.ErrBadBuffer)
	_, err = a.Rx(1)
	require.ErrorIs(t, err, nic.ErrInvalid)
	_, _, err = softnic.Pair(nic.Config{QueuePairs: 17})
	require.ErrorIs(t, err, nic.ErrInvalid)
}

// TestSReadSleeps: a reader blocked in SRead sleeps on the queue's
// eventfd until a frame sent from another goroutine arrives.
func TestSReadSleeps(t *testing.T) {
	a, b := pair(t, nic.Config{QueueSize: 16})
	rx, _ := b.Rx(0)
	tx, _ := a.Tx(0)
	fill(t, rx)
	var comps [4]nic.Completion
	n, err := rx.SRead(t.Context(), comps[:], 1, 20*time.Millisecond)
	require.ErrorIs(t, err, nic.ErrTimeout)
	require.Zero(t, n)
	go func() {
		time.Sleep(30 * time.Millisecond)
		send(t, tx, frame(b.MAC(), a.MAC(), 7, 64))
	}()
	start := time.Now()
	n, err = rx.SRead(t.Context(), comps[:], 1, 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.GreaterOrEqual(t, time.Since(start), 20*time.Millisecond, "it slept until the frame came")
	require.Equal(t, uint64(1), rx.Stats().Interrupts, "woken by the interrupt")
	require.NoError(t, rx.Release(comps[0].Buf))

	// Closing the device ends a blocked read.
	done := make(chan error, 1)
	go func() {
		_, err := rx.SRead(context.Background(), comps[:], 1, -1)
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, b.Close())
	require.ErrorIs(t, <-done, nic.ErrClosed)
}

// TestArmCountsLaterCompletions: an arm fires for a completion written
// after it, not for one already waiting; Poll cancels it.
func TestArmCountsLaterCompletions(t *testing.T) {
	a, b := pair(t, nic.Config{QueueSize: 16})
	rx, _ := b.Rx(0)
	tx, _ := a.Tx(0)
	fill(t, rx)
	send(t, tx, frame(b.MAC(), a.MAC(), 1, 64))
	require.NoError(t, rx.Arm(1))
	err := rx.WaitInterrupt(t.Context(), time.Now().Add(20*time.Millisecond))
	require.ErrorIs(t, err, nic.ErrTimeout, "the waiting completion raises nothing")
	send(t, tx, frame(b.MAC(), a.MAC(), 2, 64))
	require.NoError(t, rx.WaitInterrupt(t.Context(), time.Now().Add(time.Second)))
	require.NoError(t, rx.Arm(4))
	send(t, tx, frame(b.MAC(), a.MAC(), 3, 64))
	require.ErrorIs(t, rx.WaitInterrupt(t.Context(), time.Now().Add(20*time.Millisecond)), nic.ErrTimeout,
		"4 beyond those read: 3 written, not yet")
	send(t, tx, frame(b.MAC(), a.MAC(), 4, 64))
	require.NoError(t, rx.WaitInterrupt(t.Context(), time.Now().Add(time.Second)))
	var comps [8]nic.Completion
	require.Equal(t, 4, rx.Poll(comps[:]))
	require.NoError(t, rx.Arm(2))
	send(t, tx, frame(b.MAC(), a.MAC(), 5, 64))
	require.Equal(t, 1, rx.Poll(comps[:]), "a Poll that reads cancels the arm")
	send(t, tx, frame(b.MAC(), a.MAC(), 6, 64))
	require.ErrorIs(t, rx.WaitInterrupt(t.Context(), time.Now().Add(20*time.Millisecond)), nic.ErrTimeout)
}

func TestWireFaults(t *testing.T) {
	a, b := pair(t, nic.Config{QueueSize: 64})
	rx, _ := b.Rx(0)
	tx, _ := a.Tx(0)
	fill(t, rx)
	w := a.Wire()
	f := func(i int) []byte { return frame(b.MAC(), a.MAC(), i, 100) }

	w.SetFaults(softnic.Faults{Drop: 1})
	send(t, tx, f(0), f(1))
	require.Zero(t, rx.Poll(make([]nic.Completion, 4)))
	require.Equal(t, uint64(2), w.Stats(0).Dropped)

	w.SetFaults(softnic.Faults{Duplicate: 1})
	send(t, tx, f(2))
	got, _ := recv(t, rx, 2)
	require.Equal(t, [][]byte{f(2), f(2)}, got)

	w.SetFaults(softnic.Faults{Reorder: 1})
	send(t, tx, f(3), f(4)) // 3 held, 4 then 3; nothing held from 4 on
	got, _ = recv(t, rx, 2)
	require.Equal(t, [][]byte{f(4), f(3)}, got)

	w.SetFaults(softnic.Faults{Corrupt: 1, Seed: 42})
	send(t, tx, f(5))
	got, _ = recv(t, rx, 1)
	diff := 0
	for i := range got[0] {
		if got[0][i] != f(5)[i] {
			require.GreaterOrEqual(t, i, 34, "headers before byte 34 stay intact")
			diff++
		}
	}
	require.Equal(t, 1, diff)

	// Probabilities: about half of 1000 frames dropped, the same ones
	// for the same seed.
	run := func() uint64 {
		w.SetFaults(softnic.Faults{Drop: 0.5, Seed: 7})
		before := w.Stats(0).Dropped
		for i := range 1000 {
			send(t, tx, f(i))
			_, _ = recvAll(rx)
		}
		return w.Stats(0).Dropped - before
	}
	d1, d2 := run(), run()
	require.Equal(t, d1, d2)
	require.InDelta(t, 500, float64(d1), 80)

	w.SetFaults(softnic.Faults{})
	links := a.Stats().ConfigInterrupts
	w.SetLink(false)
	l, _ := a.Link()
	require.False(t, l.Up)
	send(t, tx, f(9))
	require.Zero(t, rx.Poll(make([]nic.Completion, 4)))
	w.SetLink(true)
	send(t, tx, f(10))
	got, _ = recv(t, rx, 1)
	require.Equal(t, f(10), got[0])
	require.Equal(t, links+2, a.Stats().ConfigInterrupts, "down and up")
}

// recvAll reads and reposts whatever is waiting.
func recvAll(rx nic.RxQueue) (int, error) {
	var comps [64]nic.Completion
	n := rx.Poll(comps[:])
	for _, c := range comps[:n] {
		if c.Err == nil {
			if err := rx.Repost(c.Buf, nil); err != nil {
				return n, err
			}
		}
	}
	return n, rx.Flush()
}

// TestRingFaults: each fault the device writes into a completion ring is
// refused by cq/ring's reader with its code, loses no buffer and leaves
// the queue working.
func TestRingFaults(t *testing.T) {
	a, b := pair(t, nic.Config{QueueSize: 16, RxBuffers: 16})
	rx, _ := b.Rx(0)
	tx, _ := a.Tx(0)
	fill(t, rx)
	f := func(i int) []byte { return frame(b.MAC(), a.MAC(), i, 80) }
	for _, tc := range []struct {
		fault softnic.RingFault
		want  cq.ProvErrno
		lost  bool // the fault's entry completes the operation with an error
	}{
		{softnic.RingBadID, cq.ProvBadID, false},
		{softnic.RingDuplicateID, cq.ProvBadID, false},
		{softnic.RingWrongPhase, cq.ProvBadPhase, false},
		{softnic.RingBadLen, cq.ProvBadLen, true},
	} {
		t.Run(tc.fault.String(), func(t *testing.T) {
			require.NoError(t, b.InjectRing(nic.Recv, 0, tc.fault))
			send(t, tx, f(1), f(2))
			total := 3 // the fault's entry and both frames
			if tc.lost {
				total = 2
			}
			got, errs := recv(t, rx, total)
			require.Len(t, errs, 1)
			require.ErrorIs(t, errs[0], tc.want)
			if tc.lost {
				require.Equal(t, [][]byte{f(2)}, got[:1])
			} else {
				require.Equal(t, [][]byte{f(1), f(2)}, got[:2])
			}
			if tc.lost {
				fill(t, rx) // its buffer went back to the pool
			}
			require.Equal(t, 16, rx.Outstanding(), "no buffer lost")
			// Transmit rings take the same faults.
			require.NoError(t, a.InjectRing(nic.Send, 0, tc.fault))
			require.NoError(t, tx.Send(f(3), "x"))
			require.NoError(t, tx.Flush())
			var comps [8]nic.Completion
			n := tx.Poll(comps[:])
			require.NotZero(t, n)
			require.ErrorIs(t, comps[n-1].Err, tc.want)
			if !tc.lost {
				require.Equal(t, 1, tx.Poll(comps[:]))
				require.Equal(t, "x", comps[0].Context)
			}
			require.Zero(t, tx.Outstanding())
			_, _ = recv(t, rx, 1)
		})
	}
	require.ErrorIs(t, b.InjectRing(nic.Recv, 0, 99), nic.ErrInvalid)
	require.ErrorIs(t, b.InjectRing(nic.Recv|nic.Send, 0, softnic.RingBadID), nic.ErrInvalid)
}

// TestRewriteID: a reader polling while the device rewrites a completion's
// id after the hand-over sees the real id or the stale one, never both:
// each frame is delivered at most once, or refused (cq.ProvBadID) with its
// operation left outstanding, lost by the device.
func TestRewriteID(t *testing.T) {
	a, b := pair(t, nic.Config{QueueSize: 256, RxBuffers: 256})
	rx, _ := b.Rx(0)
	tx, _ := a.Tx(0)
	fill(t, rx)
	const frames = 200
	stop := make(chan struct{})
	type result struct{ got, refused int }
	res := make(chan result, 1)
	go func() {
		var r result
		seen := map[uint32]bool{}
		var comps [8]nic.Completion
		for done := false; !done; {
			select {
			case <-stop:
				done = true
			default:
			}
			n := rx.Poll(comps[:])
			for _, c := range comps[:n] {
				if c.Err != nil {
					if !errors.Is(c.Err, cq.ProvBadID) {
						t.Errorf("unexpected %v", c.Err)
					}
					r.refused++
					continue
				}
				i := binary.BigEndian.Uint32(c.Data[14:])
				if seen[i] {
					t.Errorf("frame %d delivered twice", i)
				}
				seen[i] = true
				r.got++
				_ = rx.Release(c.Buf)
			}
		}
		res <- r
	}()
	for i := range frames {
		require.NoError(t, b.InjectRing(nic.Recv, 0, softnic.RingRewriteID))
		require.NoError(t, tx.Send(frame(b.MAC(), a.MAC(), i, 80), nil))
		require.NoError(t, tx.Flush())
		tx.Poll(make([]nic.Completion, 4))
	}
	time.Sleep(10 * time.Millisecond)
	close(stop)
	r := <-res
	t.Logf("%d frames: %d delivered, %d refused as a stale id", frames, r.got, r.refused)
	require.Equal(t, frames, r.got+r.refused)
	require.Equal(t, 256-r.got, rx.Outstanding(), "a refused frame's operation stays outstanding")
}

// TestLongFrame: a frame longer than a buffer fills several, each an
// error completion matching cq.ProvMultiBuffer, and gives every buffer back.
func TestLongFrame(t *testing.T) {
	a, b := pair(t, nic.Config{QueueSize: 8, BufferSize: 1024, RxBuffers: 8})
	_ = a
	rx, _ := b.Rx(0)
	fill(t, rx)
	ok, err := b.Receive(0, make([]byte, 3000))
	require.NoError(t, err)
	require.True(t, ok)
	_, errs := recv(t, rx, 3)
	require.Len(t, errs, 3)
	for _, e := range errs {
		require.ErrorIs(t, e, cq.ProvMultiBuffer)
	}
	require.Equal(t, 5, rx.Outstanding())
	ok, err = b.Receive(0, make([]byte, 9000))
	require.NoError(t, err)
	require.False(t, ok, "too few buffers posted: dropped whole")
	require.Equal(t, 5, rx.Outstanding())
}

func TestOpenByName(t *testing.T) {
	ctx := t.Context()
	require.Contains(t, nic.Schemes(), "softnic")
	a, err := nic.Open(ctx, "softnic:t-open/0", nic.Config{QueuePairs: 2})
	require.NoError(t, err)
	l, err := a.Link()
	require.NoError(t, err)
	require.False(t, l.Up, "no peer yet")
	_, err = nic.Open(ctx, "softnic:t-open/0", nic.Config{})
	require.ErrorIs(t, err, softnic.ErrInUse)
	b, err := nic.Open(ctx, "softnic:t-open/1", nic.Config{})
	require.NoError(t, err)
	l, _ = a.Link()
	require.True(t, l.Up)
	require.Equal(t, "softnic:t-open/1", b.Info().Address)
	require.Equal(t, 2, a.QueuePairs())
	require.Equal(t, 1, b.QueuePairs())
	mac := a.MAC()
	require.NoError(t, b.Close())
	l, _ = a.Link()
	require.False(t, l.Up, "peer closed")
	require.NoError(t, a.Close())
	require.NoError(t, a.Close(), "idempotent")
	_, err = a.Link()
	require.ErrorIs(t, err, nic.ErrClosed)
	a, err = nic.Open(ctx, "softnic:t-open/0", nic.Config{})
	require.NoError(t, err)
	require.Equal(t, mac, a.MAC(), "a name's MACs are stable")
	require.NoError(t, a.Close())
	for _, bad := range []string{"softnic:t-open", "softnic:t-open/2", "softnic:/0", "softnic:a b/0"} {
		_, err := nic.Open(ctx, bad, nic.Config{})
		require.ErrorIs(t, err, softnic.ErrBadName, bad)
		require.ErrorIs(t, err, nic.ErrInvalid, bad)
	}

	// Opens of one end at once: one wins, the others are told it is in use.
	var wg sync.WaitGroup
	opened := make(chan nic.Device, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, err := nic.Open(ctx, "softnic:t-race/0", nic.Config{QueueSize: 8})
			if err == nil {
				opened <- d
			} else if !errors.Is(err, softnic.ErrInUse) {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	close(opened)
	require.Len(t, opened, 1)
	require.NoError(t, (<-opened).Close())

	w, err := softnic.NewWire("t-jumbo", softnic.Options{MTU: 9000, MaxQueuePairs: 4})
	require.NoError(t, err)
	defer w.Close()
	_, err = softnic.NewWire("t-jumbo", softnic.Options{})
	require.ErrorIs(t, err, nic.ErrInvalid)
	j, err := nic.Open(ctx, "softnic:t-jumbo/1", nic.Config{QueuePairs: 4})
	require.NoError(t, err)
	defer j.Close()
	require.Equal(t, 9000, j.Info().MTU)
	tx, _ := j.Tx(0)
	require.Equal(t, 9022, tx.MaxFrame())
	rx, _ := j.Rx(0)
	require.Equal(t, 9022, rx.MaxFrame())
	_, err = nic.Open(ctx, "softnic:t-jumbo/0", nic.Config{QueuePairs: 5})
	require.ErrorIs(t, err, nic.ErrInvalid)
}

// TestSteering: flows spread over the receive queues, each flow on one.
func TestSteering(t *testing.T) {
	a, b := pair(t, nic.Config{QueuePairs: 4, QueueSize: 64})
	for i := range 4 {
		rx, _ := b.Rx(i)
		fill(t, rx)
	}
	tx, _ := a.Tx(0)
	udp := func(port int) []byte {
		f := frame(b.MAC(), a.MAC(), 0, 60)
		binary.BigEndian.PutUint16(f[12:], 0x0800)
		ip := f[14:]
		ip[0], ip[6], ip[7], ip[9] = 0x45, 0, 0, 17
		copy(ip[12:], []byte{10, 0, 0, 1, 10, 0, 0, 2})
		binary.BigEndian.PutUint16(ip[20:], uint16(port))
		binary.BigEndian.PutUint16(ip[22:], 53)
		return f
	}
	queueOf := map[int]int{}
	for port := 1000; port < 1064; port++ {
		send(t, tx, udp(port), udp(port))
		for i := range 4 {
			rx, _ := b.Rx(i)
			if n, _ := recvAll(rx); n > 0 {
				require.Equal(t, 2, n, "a flow's frames on one queue")
				queueOf[port] = i
			}
		}
	}
	used := map[int]bool{}
	for _, q := range queueOf {
		used[q] = true
	}
	require.Len(t, queueOf, 64)
	require.Len(t, used, 4, "64 flows use every queue")
	// Other frames go to the queue of the sending queue's index.
	tx2, _ := a.Tx(2)
	send(t, tx2, frame(b.MAC(), a.MAC(), 1, 60))
	rx2, _ := b.Rx(2)
	n, _ := recvAll(rx2)
	require.Equal(t, 1, n)
}

// TestRemove: the kernel taking the device back fails operations with
// ErrRemoved and completes the posted receives with ErrCanceled; a burst
// sent then posts nothing and says why.
func TestRemove(t *testing.T) {
	a, b := pair(t, nic.Config{QueueSize: 8})
	_ = a
	rx, _ := b.Rx(0)
	tx, _ := b.Tx(0)
	for i := range 3 {
		require.NoError(t, rx.PostRecv(i))
	}
	require.NoError(t, rx.Flush())
	require.NoError(t, b.Remove())
	require.ErrorIs(t, rx.PostRecv(nil), nic.ErrRemoved)
	require.ErrorIs(t, rx.PostRecv(nil), nic.ErrClosed)
	f := frame(a.MAC(), b.MAC(), 1, 60)
	n, err := tx.SendBurst([][]byte{f, f}, nil)
	require.ErrorIs(t, err, nic.ErrRemoved)
	require.ErrorIs(t, err, nic.ErrClosed)
	require.Zero(t, n)
	var comps [4]nic.Completion
	for i := range 3 {
		require.Equal(t, 1, rx.Poll(comps[:]))
		require.ErrorIs(t, comps[0].Err, nic.ErrCanceled)
		require.Equal(t, i, comps[0].Context)
	}
	require.Zero(t, rx.Poll(comps[:]))
}

// TestBindCQ: a queue bound to a CQ feeds it through the same reader;
// closing the device flushes what is outstanding into it.
func TestBindCQ(t *testing.T) {
	a, b := pair(t, nic.Config{QueueSize: 16})
	c, err := cq.New(cq.Attr{Size: 64, Format: cq.FormatData, WaitObj: cq.WaitFD}, cq.Limits{DefaultSize: 64, MaxSize: 64})
	require.NoError(t, err)
	defer func() { require.NoError(t, c.Close()) }()
	rx, _ := b.RxQueue(0)
	require.NoError(t, b.BindCQ(c, 0, nic.Recv))
	require.ErrorIs(t, b.BindCQ(c, 0, nic.Recv), nic.ErrInvalid)
	var comps [2]nic.Completion
	require.Equal(t, 1, rx.Poll(comps[:]))
	require.ErrorIs(t, comps[0].Err, nic.ErrBound)
	for i := range 4 {
		require.NoError(t, rx.PostRecv(i))
	}
	require.NoError(t, rx.Flush())
	tx, _ := a.Tx(0)
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		time.Sleep(20 * time.Millisecond)
		send(t, tx, frame(b.MAC(), a.MAC(), 1, 64))
	}()
	ents := make([]cq.Entry, 4)
	n, err := c.SRead(t.Context(), ents, 1, 5*time.Second)
	require.NoError(t, err)
	<-sent // the frame arrives before send reads its completion; tx is the sender's till then
	require.Equal(t, 1, n)
	require.Equal(t, 0, ents[0].Context)
	require.Equal(t, uint32(0), ents[0].Queue)
	data, err := rx.Frame(ents[0].Buf, ents[0].Len)
	require.NoError(t, err)
	require.Equal(t, frame(b.MAC(), a.MAC(), 1, 64), data)
	require.NoError(t, rx.Release(ents[0].Buf))

	require.NoError(t, b.InjectRing(nic.Recv, 0, softnic.RingBadID))
	send(t, tx, frame(b.MAC(), a.MAC(), 2, 64))
	_, err = c.Read(ents)
	require.ErrorIs(t, err, cq.ErrAvail)
	var e cq.ErrEntry
	require.NoError(t, c.ReadErr(&e))
	require.Equal(t, cq.ProvBadID, e.ProvErrno)
	n, err = c.Read(ents)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, 1, ents[0].Context)

	require.NoError(t, b.Close())
	for _, want := range []any{2, 3} {
		_, err = c.Read(ents)
		require.ErrorIs(t, err, cq.ErrAvail)
		require.NoError(t, c.ReadErr(&e))
		require.Equal(t, cq.ECANCELED, e.Err)
		require.Equal(t, want, e.Context, "flushed in posting order")
	}
	_, err = c.Read(ents)
	require.ErrorIs(t, err, cq.ErrAgain)
}

// TestBindRouting: each queue's interrupt goes where its vector is
// routed: a receive and a transmit queue bound to two CQs wake each its
// own CQ's sleeping reader, and a queue of another pair, bound to none,
// still wakes its reader on its own eventfd.
func TestBindRouting(t *testing.T) {
	newCQ := func() *cq.CQ {
		c, err := cq.New(cq.Attr{Size: 64, Format: cq.FormatData, WaitObj: cq.WaitFD}, cq.Limits{DefaultSize: 64, MaxSize: 64})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, c.Close()) }) // after the devices close (LIFO)
		return c
	}
	rxCQ, txCQ := newCQ(), newCQ()
	a, b := pair(t, nic.Config{QueuePairs: 2, QueueSize: 16})
	rx0, _ := b.Rx(0)
	rx1, _ := b.Rx(1)
	tx0, _ := a.Tx(0)
	tx1, _ := a.Tx(1)
	fill(t, rx0)
	fill(t, rx1)
	require.NoError(t, b.BindCQ(rxCQ, 0, nic.Recv))
	require.NoError(t, a.BindCQ(txCQ, 0, nic.Send))
	type got struct {
		queue uint32
		err   error
	}
	res := make(chan got, 3)
	for _, c := range []*cq.CQ{rxCQ, txCQ} {
		go func() {
			ents := make([]cq.Entry, 4)
			n, err := c.SRead(t.Context(), ents, 1, 5*time.Second)
			if err == nil && n != 1 {
				err = fmt.Errorf("%d entries", n)
			}
			res <- got{ents[0].Queue, err}
		}()
	}
	go func() {
		var comps [4]nic.Completion
		n, err := rx1.SRead(t.Context(), comps[:], 1, 5*time.Second)
		if err == nil && n != 1 {
			err = fmt.Errorf("%d completions", n)
		}
		res <- got{99, err}
	}()
	time.Sleep(30 * time.Millisecond) // the readers sleep
	// Not IP: each frame lands on the receive queue of its sender's index.
	for i, tx := range []nic.TxQueue{tx0, tx1} {
		require.NoError(t, tx.Send(frame(b.MAC(), a.MAC(), i, 64), nil))
		require.NoError(t, tx.Flush())
	}
	var queues []uint32
	for range 3 {
		g := <-res
		require.NoError(t, g.err)
		queues = append(queues, g.queue)
	}
	require.ElementsMatch(t, []uint32{0, 1, 99}, queues, "rx0's entry in rxCQ, tx0's in txCQ, rx1's own")
	require.Equal(t, uint64(1), rx1.Stats().Interrupts, "rx1 woken by its own interrupt")
	rxq0, _ := b.RxQueue(0)
	require.Equal(t, uint64(1), rxq0.Raised(), "rx0 raised one interrupt, on rxCQ")
}

// TestConcurrent: a sender and a receiver per queue, on both ends and
// two queue pairs at once, with faults, under the race detector: every
// frame the wire delivered is read, intact.
func TestConcurrent(t *testing.T) {
	a, b := pair(t, nic.Config{QueuePairs: 2, QueueSize: 64})
	a.Wire().SetFaults(softnic.Faults{Drop: 0.01, Reorder: 0.05, Duplicate: 0.01})
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	const frames = 2000
	var senders, readers sync.WaitGroup
	sent := make(chan struct{})
	var received [2][2]int
	for _, ends := range [][2]*softnic.Device{{a, b}, {b, a}} {
		for q := range 2 {
			rx, _ := ends[1].Rx(q)
			tx, _ := ends[0].Tx(q)
			fill(t, rx)
			senders.Add(1)
			go func() {
				defer senders.Done()
				comps := make([]nic.Completion, 64)
				for i := range frames {
					f := frame(ends[1].MAC(), ends[0].MAC(), i, 64+i%1000)
					for tx.Send(f, nil) != nil {
						_ = tx.Flush()
						tx.Poll(comps)
						runtime.Gosched() // let the reader repost
					}
					if i%8 == 7 {
						_ = tx.Flush()
					}
				}
				_ = tx.Flush()
			}()
			readers.Add(1)
			go func() {
				defer readers.Done()
				var comps [32]nic.Completion
				for ctx.Err() == nil {
					n, err := rx.SRead(ctx, comps[:], 1, 50*time.Millisecond)
					if errors.Is(err, nic.ErrTimeout) {
						select {
						case <-sent:
							return // nothing more comes
						default:
							continue
						}
					}
					if err != nil {
						t.Error(err)
						return
					}
					for _, c := range comps[:n] {
						if c.Err != nil {
							t.Error(c.Err)
							continue
						}
						i := int(binary.BigEndian.Uint32(c.Data[14:]))
						if !bytes.Equal(c.Data, frame(ends[1].MAC(), ends[0].MAC(), i, 64+i%1000)) {
							t.Errorf("frame %d damaged", i)
						}
						received[ends[1].End()][q]++
						_ = rx.Repost(c.Buf, nil)
					}
					_ = rx.Flush()
				}
			}()
		}
	}
	senders.Wait()
	close(sent)
	readers.Wait()
	for from := range 2 {
		st := a.Wire().Stats(from)
		require.Equal(t, uint64(2*frames), st.Sent)
		to := 1 - from
		require.Equal(t, st.Delivered, uint64(received[to][0]+received[to][1]), "%+v", st)
		require.Equal(t, st.Sent+st.Duplicated, st.Delivered+st.Dropped+st.NoBuffer+st.Held, "every frame accounted for: %+v", st)
	}
}

// TestCloseReleasesEverything: opening and closing pairs returns every fd
// and every locked page, and leaves no goroutine.
func TestCloseReleasesEverything(t *testing.T) {
	warm, peer, err := softnic.Pair(nic.Config{})
	require.NoError(t, err)
	require.NoError(t, errors.Join(warm.Close(), peer.Close()))
	fds, locked, gs := countFDs(t), lockedKB(t), runtime.NumGoroutine()
	for range 5 {
		a, b, err := softnic.Pair(nic.Config{QueuePairs: 3})
		require.NoError(t, err)
		rx, _ := b.Rx(1)
		fill(t, rx)
		tx, _ := a.Tx(1)
		require.NoError(t, tx.Send(make([]byte, 60), nil))
		require.NoError(t, tx.Flush())
		require.NoError(t, errors.Join(a.Close(), b.Close()))
	}
	require.Equal(t, fds, countFDs(t), "fds")
	require.Equal(t, locked, lockedKB(t), "locked DMA memory")
	require.LessOrEqual(t, runtime.NumGoroutine(), gs, "goroutines")
}

func countFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents)
}

// lockedKB is the process's locked memory: DMA memory is locked 4 KiB
// pages, so a leaked mapping shows here.
func lockedKB(t *testing.T) string {
	b, err := os.ReadFile("/proc/self/status")
	require.NoError(t, err)
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmLck:"); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatal("no VmLck in /proc/self/status")
	return ""
}

// TestNoAllocs: the data path (Send, Flush through the wire, Poll of both
// queues, Repost) allocates nothing per frame.
func TestNoAllocs(t *testing.T) {
	a, b := pair(t, nic.Config{QueueSize: 64})
	rx, _ := b.Rx(0)
	tx, _ := a.Tx(0)
	fill(t, rx)
	f := frame(b.MAC(), a.MAC(), 1, 1000)
	comps := make([]nic.Completion, 8)
	allocs := testing.AllocsPerRun(1000, func() {
		if err := tx.Send(f, nil); err != nil {
			t.Fatal(err)
		}
		if err := tx.Flush(); err != nil {
			t.Fatal(err)
		}
		if tx.Poll(comps) != 1 {
			t.Fatal("no send completion")
		}
		if rx.Poll(comps) != 1 || comps[0].Err != nil {
			t.Fatal("no receive completion")
		}
		if err := rx.Repost(comps[0].Buf, nil); err != nil {
			t.Fatal(err)
		}
		if err := rx.Flush(); err != nil {
			t.Fatal(err)
		}
	})
	require.Zero(t, allocs)
}

// BenchmarkFrame is one 64-byte frame through the wire and back to the
// caller: Send, Flush (the device carries it), both Polls, Repost, Flush.
func BenchmarkFrame(b *testing.B) {
	x, y, err := softnic.Pair(nic.Config{})
	require.NoError(b, err)
	defer x.Close()
	defer y.Close()
	rx, _ := y.Rx(0)
	tx, _ := x.Tx(0)
	for rx.PostRecv(nil) == nil {
	}
	require.NoError(b, rx.Flush())
	f := frame(y.MAC(), x.MAC(), 1, 64)
	comps := make([]nic.Completion, 32)
	const batch = 32
	b.ReportAllocs()
	for b.Loop() {
		for range batch {
			_ = tx.Send(f, nil)
		}
		_ = tx.Flush()
		tx.Poll(comps)
		n := rx.Poll(comps)
		for _, c := range comps[:n] {
			_ = rx.Repost(c.Buf, nil)
		}
		_ = rx.Flush()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/frame")
}

// TestRepostBurst: RepostBurst posts received buffers back in order with
// their contexts, stops at the first it refuses (those before it posted,
// it and those after still lent), refuses mismatched contexts and a closed
// queue, and allocates nothing.
func TestRepostBurst(t *testing.T) {
	a, b := pair(t, nic.Config{QueueSize: 8})
	rx, _ := b.Rx(0)
	tx, _ := a.Tx(0)
	fill(t, rx)
	var frames [][]byte
	for i := range 8 {
		frames = append(frames, frame(b.MAC(), a.MAC(), i, 100))
	}
	send(t, tx, frames...)
	comps := make([]nic.Completion, 8)
	require.Equal(t, 8, rx.Poll(comps))
	bufs := make([]uintptr, 8)
	for i, c := range comps {
		require.NoError(t, c.Err)
		bufs[i] = c.Buf
	}

	_, err := rx.RepostBurst(bufs[:2], []any{"x"})
	require.ErrorIs(t, err, nic.ErrInvalid, "one context for two buffers")
	// bufs[3] named twice: the second is no longer lent.
	n, err := rx.RepostBurst([]uintptr{bufs[0], bufs[1], bufs[2], bufs[3], bufs[3], bufs[4]}, []any{0, 1, 2, 3, 33, 4})
	require.Equal(t, 4, n)
	require.ErrorIs(t, err, nic.ErrBadBuffer)
	n, err = rx.RepostBurst(bufs[4:], nil)
	require.NoError(t, err, "those after the refused one were still lent")
	require.Equal(t, 4, n)
	require.NoError(t, rx.Flush())

	// The reposted buffers carry the next frames with the contexts given.
	send(t, tx, frames[:6]...)
	require.Equal(t, 6, rx.Poll(comps))
	want := []any{0, 1, 2, 3, nil, nil}
	for i, c := range comps[:6] {
		require.NoError(t, c.Err)
		require.Equal(t, want[i], c.Context)
		require.Equal(t, frames[i], c.Data)
		bufs[i] = c.Buf
	}
	allocs := testing.AllocsPerRun(100, func() {
		if n, err := rx.RepostBurst(bufs[:6], nil); n != 6 || err != nil {
			t.Fatal(n, err)
		}
		if err := rx.Flush(); err != nil {
			t.Fatal(err)
		}
		for _, f := range frames[:6] {
			if err := tx.Send(f, nil); err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.Flush(); err != nil {
			t.Fatal(err)
		}
		if tx.Poll(comps) != 6 || rx.Poll(comps) != 6 {
			t.Fatal("frames lost")
		}
		for i, c := range comps[:6] {
			bufs[i] = c.Buf
		}
	})
	require.Zero(t, allocs)

	require.NoError(t, b.Close())
	_, err = rx.RepostBurst(bufs[:6], nil)
	require.ErrorIs(t, err, nic.ErrClosed)
}
