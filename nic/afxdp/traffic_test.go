package afxdp

import (
	"context"
	"testing"

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
		vt.SendFrames(t, tx, dev.MAC(), p, trafficFrames, window)
	})

	t.Run("receive", func(t *testing.T) {
		rx, err := dev.Rx(0)
		require.NoError(t, err)
		vt.RecvFrames(t, rx, dev.MAC(), p, trafficFrames, window, func(f func() error) error { return vt.In(v.B, f) })
	})
}
