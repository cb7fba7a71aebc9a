package queue

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vfnic/vfnic/eventfd"
	"github.com/vfnic/vfnic/nic"
)

func TestCountAndStats(t *testing.T) {
	c := Core[struct{}]{Name: "rx0", Pair: 3, Vector: -1}
	require.Equal(t, 3, c.Index())
	c.Count(0, 0, 0)
	c.Count(5, 2, 900)
	c.Count(4, 0, 100)
	c.Interrupts.Add(2)
	c.Notifies.Add(1)
	require.Equal(t, nic.QueueStats{Packets: 7, Bytes: 1000, Errors: 2, Notifies: 1, Interrupts: 2}, c.Stats())
	require.ErrorIs(t, c.SteerInterrupt(0), nic.ErrNotSupported, "no vector to steer")
}

func TestWaitWithoutInterruptOrBound(t *testing.T) {
	c := Core[int]{Name: "tx1", NoIRQHint: " (poll it)"}
	err := c.WaitInterrupt(context.Background(), time.Time{})
	require.ErrorIs(t, err, nic.ErrNotSupported)
	require.ErrorContains(t, err, "tx1 has no interrupt (poll it)")

	fd, err := eventfd.New()
	require.NoError(t, err)
	defer fd.Close()
	var took uint64
	c.EFD, c.OnTook = fd, func(n uint64) { took += n }
	c.Src = new(int)
	require.True(t, c.Bound())
	require.ErrorIs(t, c.WaitInterrupt(context.Background(), time.Time{}), nic.ErrBound)
	c.Src = nil

	require.NoError(t, fd.Add(1))
	require.NoError(t, c.WaitInterrupt(context.Background(), time.Now().Add(time.Minute)))
	require.Equal(t, uint64(1), c.Interrupts.Load())
	require.Equal(t, uint64(1), took, "OnTook is told")
}
