package irq

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/eventfd"
	"github.com/vfnic/vfnic/nic"
)

func TestWaitAndTakeLeft(t *testing.T) {
	fd, err := eventfd.New()
	require.NoError(t, err)
	var taken atomic.Uint64

	require.NoError(t, fd.Add(3))
	require.NoError(t, Wait(t.Context(), fd, time.Time{}, &taken))
	require.EqualValues(t, 3, taken.Load(), "Wait counts what it took")

	TakeLeft(fd, &taken)
	require.EqualValues(t, 3, taken.Load(), "nothing was left")

	err = Wait(t.Context(), fd, time.Now().Add(time.Millisecond), &taken)
	require.ErrorIs(t, err, nic.ErrTimeout)

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err = Wait(ctx, fd, time.Time{}, &taken)
	require.True(t, errors.Is(err, context.Canceled), "got %v", err)

	require.NoError(t, fd.Close())
	err = Wait(t.Context(), fd, time.Time{}, &taken)
	require.True(t, err == nic.ErrClosed, "got %v, want nic.ErrClosed itself", err)
	TakeLeft(fd, &taken) // a closed fd: nothing counted, no panic
	require.EqualValues(t, 3, taken.Load())
}

// TestSteerWithoutDevice: a queue without a vfio device (a driver under
// test) or without a vector cannot steer, and says which queue.
func TestSteerWithoutDevice(t *testing.T) {
	for _, v := range []int{1, -1} {
		err := Steer(nil, v, 0, "rx0")
		require.ErrorIs(t, err, nic.ErrNotSupported)
		require.Contains(t, err.Error(), "rx0")
	}
}
