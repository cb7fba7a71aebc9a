package queue

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vfnic/vfnic/nic"
)

func TestCountAndStats(t *testing.T) {
	c := Core{Name: "rx0", Pair: 3, Vector: -1}
	require.Equal(t, 3, c.Index())
	c.Count(0, 0, 0)
	c.Count(5, 2, 900)
	c.Count(4, 0, 100)
	c.Interrupts.Add(2)
	c.Notifies.Add(1)
	require.Equal(t, nic.QueueStats{Packets: 7, Bytes: 1000, Errors: 2, Notifies: 1, Interrupts: 2}, c.Stats())
	require.Error(t, c.SteerInterrupt(0), "no vector to steer")
}
