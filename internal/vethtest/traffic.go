package vethtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vfnic/vfnic/nic"
)

// SendFrames sends n test frames (MakeFrame, 60 to 1514 bytes) from tx,
// the queue of a device with address src, to the peer p, with at most
// window frames sent and not yet received (below the rings' sizes, so
// that nobody drops for lack of room). It fails t unless p receives each
// frame once, intact, and each send completes once, with its length,
// with the queue's packet count up by n and no error counted.
func SendFrames(t testing.TB, tx nic.TxQueue, src net.HardwareAddr, p *Peer, n, window int) {
	t.Helper()
	st0 := tx.Stats()
	var got atomic.Int64
	done := make(chan error, 1)
	go func() {
		seen := make([]bool, n)
		b := make([]byte, 4096)
		for got.Load() < int64(n) {
			k, err := p.Recv(b)
			if err != nil {
				done <- err
				return
			}
			if k == 0 {
				continue
			}
			seq, ok, err := CheckFrame(b[:k], p.MAC, src)
			switch {
			case !ok:
				continue
			case err != nil:
				done <- err
				return
			case seq >= uint64(n) || seen[seq]:
				done <- fmt.Errorf("frame %d duplicated or unknown", seq)
				return
			}
			seen[seq] = true
			got.Add(1)
		}
		done <- nil
	}()
	completed := make([]bool, n)
	ncomp := 0
	comps := make([]nic.Completion, 64)
	reap := func() {
		k := tx.Poll(comps)
		for _, c := range comps[:k] {
			require.NoError(t, c.Err)
			seq := c.Context.(uint64)
			require.False(t, completed[seq], "send %d completed twice", seq)
			require.Equal(t, FrameLen(seq), c.Len)
			completed[seq] = true
			ncomp++
		}
	}
	buf := make([]byte, 2048)
	deadline := time.Now().Add(2 * time.Minute)
	for seq := uint64(0); seq < uint64(n); {
		require.True(t, time.Now().Before(deadline), "stalled at %d sent, %d received", seq, got.Load())
		if int64(seq)-got.Load() >= int64(window) {
			require.NoError(t, tx.Flush())
			reap()
			runtime.Gosched()
			continue
		}
		err := tx.Send(MakeFrame(buf, p.MAC, src, seq), seq)
		if errors.Is(err, nic.ErrFull) {
			require.NoError(t, tx.Flush())
			reap()
			continue
		}
		require.NoError(t, err)
		seq++
		if seq%32 == 0 {
			require.NoError(t, tx.Flush())
			reap()
		}
	}
	require.NoError(t, tx.Flush())
	for ncomp < n && time.Now().Before(deadline) {
		reap()
	}
	require.Equal(t, n, ncomp, "completions")
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatalf("peer received %d of %d", got.Load(), n)
	}
	require.EqualValues(t, n, got.Load())
	st := tx.Stats()
	t.Logf("tx: %+v", st)
	require.EqualValues(t, n, st.Packets-st0.Packets)
	require.Equal(t, st0.Errors, st.Errors)
}

// RecvFrames has the peer p send n test frames to rx, the queue of a
// device with address dst, with at most window frames sent and not yet
// received, and fails t unless rx receives each once, intact, with the
// queue's packet count up by n (and frames of other kinds) and no error
// counted. in runs the peer's sending loop (in the peer's namespace, say;
// nil runs it as it is), on a goroutine of its own; rx's receive buffers
// are posted first, and each is posted again once its frame is checked.
func RecvFrames(t testing.TB, rx nic.RxQueue, dst net.HardwareAddr, p *Peer, n, window int, in func(func() error) error) {
	t.Helper()
	st0 := rx.Stats()
	for rx.PostRecv(nil) == nil {
	}
	require.NoError(t, rx.Flush())
	if in == nil {
		in = func(f func() error) error { return f() }
	}
	var got atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sendErr := make(chan error, 1)
	go func() {
		sendErr <- in(func() error {
			b := make([]byte, 2048)
			for seq := uint64(0); seq < uint64(n); {
				if int64(seq)-got.Load() >= int64(window) {
					if ctx.Err() != nil {
						return ctx.Err()
					}
					runtime.Gosched()
					continue
				}
				if err := p.Send(MakeFrame(b, dst, p.MAC, seq)); err != nil {
					return err
				}
				seq++
			}
			return nil
		})
	}()
	seen := make([]bool, n)
	comps := make([]nic.Completion, 64)
	other := 0
	for got.Load() < int64(n) {
		k, err := rx.SRead(ctx, comps, 1, 10*time.Second)
		require.NoError(t, err, "received %d of %d", got.Load(), n)
		for _, c := range comps[:k] {
			require.NoError(t, c.Err)
			seq, ok, err := CheckFrame(c.Data, dst, p.MAC)
			require.NoError(t, err)
			if !ok {
				other++
			} else {
				require.Less(t, seq, uint64(n))
				require.False(t, seen[seq], "frame %d received twice", seq)
				seen[seq] = true
				got.Add(1)
			}
			require.NoError(t, rx.Repost(c.Buf, nil))
		}
		require.NoError(t, rx.Flush())
	}
	require.NoError(t, <-sendErr)
	st := rx.Stats()
	t.Logf("rx: %+v, %d frames of other kinds", st, other)
	require.EqualValues(t, n, int(st.Packets-st0.Packets)-other)
	require.Equal(t, st0.Errors, st.Errors)
}
