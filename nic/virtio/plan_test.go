package virtio

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vfnic/vfnic/nic"
)

func TestPlanQueuesControlQueueIndex(t *testing.T) {
	specs, err := planQueues("t", 256, 2, 4, true, 9)
	require.NoError(t, err)
	require.Len(t, specs, 5)
	require.Equal(t, "ctrl", specs[4].name)
	require.EqualValues(t, 8, specs[4].qidx, "2 * max_virtqueue_pairs")
	require.EqualValues(t, 1, specs[0].vector)

	// The spec's maximum, 0x8000 pairs, puts the control queue at 0x10000:
	// refused, not wrapped to 0 and set up over rx0.
	_, err = planQueues("t", 256, 1, 0x8000, true, 0xffff)
	require.ErrorIs(t, err, nic.ErrNotSupported)
	require.ErrorContains(t, err, "ctrl is number 65536")
	specs, err = planQueues("t", 256, 1, 0x8000, false, 0xffff)
	require.NoError(t, err, "without a control queue the device is usable")
	require.Len(t, specs, 2)

	_, err = planQueues("t", 256, 2, 2, false, 3)
	require.ErrorIs(t, err, nic.ErrNotSupported, "tx1 is number 3 of 3 queues")
}
