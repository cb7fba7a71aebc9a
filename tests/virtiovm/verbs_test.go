package virtiovm

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/nic/virtio"
	"github.com/vfnic/vfnic/verbs/nicverbs/nicverbstest"
)

// TestGuestVerbsPacked runs the verbs CQ's behaviour tests
// (verbs/nicverbs/nicverbstest) over a virtio-net queue's used ring:
// creation limits, the iterator over real transmit completions,
// request-notify with a completion channel woken by the queue's MSI-X
// interrupt, and the lost-wake-up loop against completions the device
// writes while the consumer polls and arms.
func TestGuestVerbsPacked(t *testing.T) { guestOnly(t); testVerbs(t, slotPacked) }

// TestGuestVerbsSplit is TestGuestVerbsPacked on split rings.
func TestGuestVerbsSplit(t *testing.T) { guestOnly(t); testVerbs(t, slotSplit) }

func testVerbs(t *testing.T, slot int) {
	before := snapshot(t)
	dev, err := virtio.Open(context.Background(), addrOf(slot), virtio.Config{})
	require.NoError(t, err)
	nicverbstest.Run(t, dev, ctlFrame(dev.MAC(), 1, 0xee), nicverbstest.Rounds(t)) // the host ignores the frame
	require.Equal(t, before, snapshot(t), "every fd and mapping returned")
}
