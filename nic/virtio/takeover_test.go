package virtio

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/doorbell"
	"github.com/vfnic/vfnic/nic"
)

// TestBusMasterAfterReset: a device that a killed process left with its
// queues enabled at that process's addresses (virtio-net has no function
// reset, so vfio-pci only turned bus mastering off) gets bus mastering
// back only once its reset is complete (status reads 0), before any
// feature is negotiated or DMA memory exists. The common configuration is
// ordinary memory; it offers no features, so start stops at negotiation.
func TestBusMasterAfterReset(t *testing.T) {
	w := doorbell.NewWindow(make([]byte, 4096))
	const left = statusAcknowledge | statusDriver | statusFeaturesOK | statusDriverOK
	require.NoError(t, w.Write8(regDeviceStatus, left))
	require.NoError(t, w.Write16(regQueueEnable, 1))
	d := &Device{name: "t", t: &transport{name: "t", common: w}}
	type change struct {
		on     bool
		status uint8
		dma    bool
	}
	var got []change
	d.busMaster = func(on bool) error {
		st, _ := w.Read8(regDeviceStatus)
		got = append(got, change{on, st, d.space != nil})
		return nil
	}
	err := d.start(context.Background(), Config{Config: nic.Config{QueueSize: 256}})
	require.ErrorIs(t, err, nic.ErrNotSupported, "no VERSION_1 offered")
	require.Equal(t, []change{{on: true}}, got, "bus mastering turned on once, after the reset, before any DMA memory")
}
