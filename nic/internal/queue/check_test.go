package queue

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/nic"
)

func TestQueueAt(t *testing.T) {
	qs := []string{"rx0", "rx1"}
	q, err := QueueAt(qs, 1, "dev", "receive")
	require.NoError(t, err)
	require.Equal(t, "rx1", q)
	for _, i := range []int{-1, 2} {
		_, err := QueueAt(qs, i, "dev", "receive")
		require.ErrorIs(t, err, nic.ErrInvalid)
		require.ErrorContains(t, err, "dev: receive queue")
	}
}

func TestCheckBind(t *testing.T) {
	c, err := cq.New(cq.Attr{Size: 8}, cq.Limits{DefaultSize: 8, MaxSize: 8})
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, CheckBind("dev", false, c, 1, 2, nic.Recv|nic.Send))
	require.ErrorIs(t, CheckBind("dev", true, c, 0, 2, nic.Recv), nic.ErrClosed)
	for name, err := range map[string]error{
		"nil CQ":      CheckBind("dev", false, nil, 0, 2, nic.Recv),
		"pair -1":     CheckBind("dev", false, c, -1, 2, nic.Recv),
		"pair 2 of 2": CheckBind("dev", false, c, 2, 2, nic.Recv),
		"direction 0": CheckBind("dev", false, c, 0, 2, 0),
		"direction 4": CheckBind("dev", false, c, 0, 2, 4),
	} {
		require.ErrorIs(t, err, nic.ErrInvalid, name)
	}
}
