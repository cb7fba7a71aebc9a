package main

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/lcore"
	"github.com/vfnic/vfnic/nic"
)

// sendRecorder is a transmit queue that records what is sent, or is full.
type sendRecorder struct {
	nic.TxQueue
	sent [][]byte
	full bool
}

func (s *sendRecorder) Send(frame []byte, _ any) error {
	if s.full {
		return nic.ErrFull
	}
	s.sent = append(s.sent, append([]byte(nil), frame...))
	return nil
}

// repostCounter is a receive queue that counts reposted buffers.
type repostCounter struct {
	nic.RxQueue
	reposts int
}

func (r *repostCounter) Repost(uintptr, any) error { r.reposts++; return nil }

// TestForward: io sends the frame as it came, macswap with its MACs
// swapped; a full ring on the other side drops and counts; every buffer
// goes back.
func TestForward(t *testing.T) {
	frame := []byte{1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 0x88, 0xb5, 9}
	for _, swap := range []bool{false, true} {
		rx, tx := &repostCounter{}, &sendRecorder{}
		f := &forwarder{swap: swap}
		in, out := &fwdPort{addr: "a", rx: rx}, &fwdPort{addr: "b", tx: tx}
		batch := []nic.Completion{{Data: append([]byte(nil), frame...), Buf: 1}, {Err: cq.ProvBadLen}}
		require.NoError(t, f.forward(in, out, batch[:1]))
		want := frame
		if swap {
			want = []byte{2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 0x88, 0xb5, 9}
		}
		require.Equal(t, [][]byte{want}, tx.sent)
		require.EqualValues(t, 1, out.forwarded.Load())
		require.Equal(t, 1, rx.reposts)
		tx.full = true
		require.NoError(t, f.forward(in, out, batch[:1]))
		require.EqualValues(t, 1, out.dropped.Load(), "dropped when the other ring is full")
		require.Equal(t, 2, rx.reposts, "its buffer goes back all the same")
		f.queues = [][2]*fwdPort{{in, out}}
		require.Equal(t, "a->b 1 (dropped 1), b->a 0 (dropped 0)", f.line())
	}
}

// TestForwardOnCore: both directions on one core, over the test queues.
func TestForwardOnCore(t *testing.T) {
	aRx, aTx, bRx, bTx := newTestQueue(t), newTestQueue(t), newTestQueue(t), newTestQueue(t)
	core := newTestCore(t, lcore.Interrupt)
	f := &forwarder{queues: [][2]*fwdPort{{{addr: "a", rx: aRx, tx: aTx}, {addr: "b", rx: bRx, tx: bTx}}}}
	p := newProgress(io.Discard, &fakeDevice{}, 0, f.line)
	aRx.Inject(20)
	bRx.Inject(10)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	go func() {
		// The transmit queues' counters are atomic: the forwarder's are the core's.
		for (bTx.Counters().Posts < 20 || aTx.Counters().Posts < 10) && ctx.Err() == nil {
			time.Sleep(time.Millisecond)
		}
		cancel()
	}()
	require.NoError(t, f.run(ctx, core, p))
	require.EqualValues(t, 20, f.queues[0][1].forwarded.Load(), "a's frames out of b")
	require.EqualValues(t, 10, f.queues[0][0].forwarded.Load(), "b's frames out of a")
	require.EqualValues(t, 20, aRx.Counters().Posts, "a's buffers posted again")
	d := f.details("io", nic.Stats{})
	require.Equal(t, "io", d["forward"])
}
