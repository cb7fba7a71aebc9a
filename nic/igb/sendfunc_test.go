package igb

import (
	"net"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/nic/internal/sendcheck"
)

// TestSendFunc runs the in-place send's check on the fake 82576: each
// descriptor's buffer keeps the last frame written into it.
func TestSendFunc(t *testing.T) {
	d, f := newFakeDevice(t, Config{Config: nic.Config{QueueSize: 16}})
	dev := newFakeNIC(t, d, f)
	dst := net.HardwareAddr{2, 0, 0, 0, 0, 1}
	sendcheck.Run(t, d.tx[0], dst, d.MAC(), func(t testing.TB, n int) [][]byte {
		got := dev.transmit()
		require.Len(t, got, n)
		return got
	})
}
