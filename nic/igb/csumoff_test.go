package igb

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vfnic/vfnic/nic"
)

// TestChecksumOffloadOff: with nic.Config's switches the queues say they
// have no checksum offload and SendL4Checksum declines before touching
// the ring, so that a stack computes checksums itself.
func TestChecksumOffloadOff(t *testing.T) {
	rq, tq := &RxQueue{}, &TxQueue{}
	require.True(t, rq.ChecksumOffload())
	require.True(t, tq.ChecksumOffload())
	rq.noCsum, tq.noCsum = true, true
	require.False(t, rq.ChecksumOffload())
	require.False(t, tq.ChecksumOffload())
	require.ErrorIs(t, tq.SendL4Checksum(make([]byte, 60), nil), nic.ErrNotSupported)
}
