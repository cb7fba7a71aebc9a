package afxdp

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	vt "github.com/vfnic/vfnic/internal/vethtest"
	"github.com/vfnic/vfnic/nic"
)

const (
	trafficFrames = 100_000
	window        = 128 // frames in flight, below the rings' 256: nobody drops for lack of room
)

// openIn opens name in namespace ns.
func openIn(t testing.TB, ns, name string, cfg nic.Config) *Device {
	t.Helper()
	var dev *Device
	require.NoError(t, vt.In(ns, func() (err error) {
		dev, err = Open(context.Background(), name, cfg)
		return err
	}))
	t.Cleanup(func() { _ = dev.Close() })
	return dev
}

// TestTraffic sends 100,000 frames of 60 to 1514 bytes each way between
// vfnic's end of a veth pair and a Linux AF_PACKET socket on the other:
// every frame arrives once, intact, and every send completes once.
func TestTraffic(t *testing.T) {
	v := vt.New(t, 1)
	dev := openIn(t, v.A, "vfx0", nic.Config{})
	var p *vt.Peer
	require.NoError(t, vt.In(v.B, func() (err error) { p, err = vt.NewPeer("vfx1"); return err }))
	defer p.Close()
	t.Logf("%s: %v", dev.Info().Model, dev.Info().Features)

	t.Run("send", func(t *testing.T) {
		tx, err := dev.Tx(0)
		require.NoError(t, err)
		var got atomic.Int64
		done := make(chan error, 1)
		go func() {
			seen := make([]bool, trafficFrames)
			b := make([]byte, 4096)
			for got.Load() < trafficFrames {
				n, err := p.Recv(b)
				if err != nil {
					done <- err
					return
				}
				if n == 0 {
					continue
				}
				seq, ok, err := vt.CheckFrame(b[:n], p.MAC, dev.MAC())
				switch {
				case !ok:
					continue
				case err != nil:
					done <- err
					return
				case seq >= trafficFrames || seen[seq]:
					done <- fmt.Errorf("frame %d duplicated or unknown", seq)
					return
				}
				seen[seq] = true
				got.Add(1)
			}
			done <- nil
		}()
		completed := make([]bool, trafficFrames)
		ncomp := 0
		comps := make([]nic.Completion, 64)
		reap := func() {
			n := tx.Poll(comps)
			for _, c := range comps[:n] {
				require.NoError(t, c.Err)
				seq := c.Context.(uint64)
				require.False(t, completed[seq], "send %d completed twice", seq)
				require.Equal(t, vt.FrameLen(seq), c.Len)
				completed[seq] = true
				ncomp++
			}
		}
		buf := make([]byte, 2048)
		deadline := time.Now().Add(2 * time.Minute)
		for seq := uint64(0); seq < trafficFrames; {
			require.True(t, time.Now().Before(deadline), "stalled at %d sent, %d received", seq, got.Load())
			if int64(seq)-got.Load() >= window {
				require.NoError(t, tx.Flush())
				reap()
				runtime.Gosched()
				continue
			}
			err := tx.Send(vt.MakeFrame(buf, p.MAC, dev.MAC(), seq), seq)
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
		for ncomp < trafficFrames && time.Now().Before(deadline) {
			reap()
		}
		require.Equal(t, trafficFrames, ncomp, "completions")
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Fatalf("peer received %d of %d", got.Load(), trafficFrames)
		}
		require.EqualValues(t, trafficFrames, got.Load())
		st := tx.Stats()
		t.Logf("tx: %+v", st)
		require.EqualValues(t, trafficFrames, st.Packets)
		require.Zero(t, st.Errors)
	})

	t.Run("receive", func(t *testing.T) {
		rx, err := dev.Rx(0)
		require.NoError(t, err)
		for rx.PostRecv(nil) == nil {
		}
		require.NoError(t, rx.Flush())
		var got atomic.Int64
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		sendErr := make(chan error, 1)
		go func() {
			sendErr <- vt.In(v.B, func() error {
				b := make([]byte, 2048)
				for seq := uint64(0); seq < trafficFrames; {
					if int64(seq)-got.Load() >= window {
						if ctx.Err() != nil {
							return ctx.Err()
						}
						runtime.Gosched()
						continue
					}
					if err := p.Send(vt.MakeFrame(b, dev.MAC(), p.MAC, seq)); err != nil {
						return err
					}
					seq++
				}
				return nil
			})
		}()
		seen := make([]bool, trafficFrames)
		comps := make([]nic.Completion, 64)
		other := 0
		for got.Load() < trafficFrames {
			n, err := rx.SRead(ctx, comps, 1, 10*time.Second)
			require.NoError(t, err, "received %d of %d", got.Load(), trafficFrames)
			for _, c := range comps[:n] {
				require.NoError(t, c.Err)
				seq, ok, err := vt.CheckFrame(c.Data, dev.MAC(), p.MAC)
				require.NoError(t, err)
				if !ok {
					other++
				} else {
					require.Less(t, seq, uint64(trafficFrames))
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
		require.EqualValues(t, trafficFrames, int(st.Packets)-other)
		require.Zero(t, st.Errors)
	})
}
