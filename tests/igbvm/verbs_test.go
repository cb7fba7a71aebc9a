package igbvm

import (
	"context"
	"encoding/binary"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/nic/igb"
	"github.com/vfnic/vfnic/tests/leakcheck"
	"github.com/vfnic/vfnic/verbs/nicverbs/nicverbstest"
)

// TestGuestVerbs runs the verbs CQ's behaviour tests
// (verbs/nicverbs/nicverbstest), the ones the virtio suite runs, over an
// igb transmit queue's DD-bit write-back ring: creation limits, the
// iterator over real transmit completions, request-notify with a
// completion channel woken by the queue's MSI-X vector, and the
// lost-wake-up loop against completions the device writes while the
// consumer polls and arms.
func TestGuestVerbs(t *testing.T) {
	guestOnly(t)
	before, err := leakcheck.Snapshot()
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	dev, err := igb.Open(ctx, igbAddr, igb.Config{})
	cancel()
	require.NoError(t, err)
	// A broadcast of an EtherType the host's server does not speak: it
	// ignores the frame.
	f := make([]byte, 60)
	copy(f, net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(f[6:], dev.MAC())
	binary.BigEndian.PutUint16(f[12:], 0x88b6)
	nicverbstest.Run(t, dev, f, nicverbstest.Rounds(t))
	after, err := leakcheck.Snapshot()
	require.NoError(t, err)
	require.Equal(t, before, after, "every fd and mapping returned")
}
