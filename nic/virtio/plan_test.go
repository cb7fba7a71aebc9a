package virtio

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vfnic/vfnic/doorbell"
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

// A device whose queue_size register reads too little for a ring is
// refused while the rings are sized, with the package's not-supported
// error: a one-entry ring used to get through and panic at the first
// post (buffer id 1 on a one-entry ring).
func TestRingSizeRefusesTooSmallRings(t *testing.T) {
	rx := queueSpec{name: "rx0", qidx: 0, size: 256}
	ctrl := queueSpec{name: "ctrl", qidx: 2, size: maxCtrlQueueSize}
	for _, c := range []struct {
		s      queueSpec
		max    int
		packed bool
		want   int // 0: refused
	}{
		{rx, 1, true, 0},
		{rx, 1, false, 0},
		{rx, 2, true, 2},
		{rx, 3, false, 2}, // rounded down to a power of two
		{rx, 300, true, 256},
		{ctrl, 1, true, 0},
		{ctrl, 1, false, 0},
		{ctrl, 2, true, 0}, // a command is a chain of three
		{ctrl, 3, true, 3},
		{ctrl, 3, false, 0}, // 2 once rounded
		{ctrl, 4, false, 4},
	} {
		got, err := ringSize("t", c.s, c.max, c.packed)
		if c.want == 0 {
			require.ErrorIs(t, err, nic.ErrNotSupported, "%s, queue_size %d, packed %v", c.s.name, c.max, c.packed)
			require.ErrorContains(t, err, c.s.name)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, c.want, got, "%s, queue_size %d, packed %v", c.s.name, c.max, c.packed)
	}
	_, err := ringSize("t", rx, 0, true)
	require.ErrorIs(t, err, nic.ErrNotSupported, "queue_size 0: not available")
}

// Sizing the queues of a device whose queue_size registers read 1 (its
// common configuration in ordinary memory, so every queue reads the same):
// refused before any memory is allocated. Without the data queues, the
// control queue alone is refused the same way.
func TestSizeQueuesQueueSizeOne(t *testing.T) {
	forRings(t, func(t *testing.T, packed bool) {
		for _, pairs := range []int{1, 0} {
			common := make([]byte, 4096)
			w := doorbell.NewWindow(common)
			require.NoError(t, w.Write16(regNumQueues, 3))
			require.NoError(t, w.Write16(regQueueSize, 1))
			d := &Device{name: "t", packed: packed, maxPairs: 1, features: bit(FeatureCtrlVQ),
				t: &transport{name: "t", common: w}}
			_, err := d.sizeQueues(Config{Config: nic.Config{QueueSize: 256}}, pairs)
			require.ErrorIs(t, err, nic.ErrNotSupported)
			require.ErrorContains(t, err, map[int]string{1: "(rx0) offers 1", 0: "(ctrl) offers 1"}[pairs])
		}
	})
}

// newVQ refuses a one-entry ring too, whoever asks for it.
func TestNewVQRefusesOneEntry(t *testing.T) {
	forRings(t, func(t *testing.T, packed bool) {
		r := newRig(t, 2, packed, true, 0)
		_, err := newVQ("test", 0, 1, packed, true, r.mem, r.v.notify)
		require.ErrorIs(t, err, nic.ErrInvalid)
	})
}
