package nicpair

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/nic"
)

// Send transmits frame on tx for a driver's guest tests, waiting for room
// when the ring is full (flushing and reclaiming), then flushes and
// reclaims what completed. comps is Reclaim's scratch space.
func Send(t testing.TB, tx nic.TxQueue, frame []byte, comps []nic.Completion) {
	t.Helper()
	for {
		err := tx.Send(frame, nil)
		if err == nil {
			break
		}
		require.ErrorIs(t, err, nic.ErrFull)
		require.NoError(t, tx.Flush())
		Reclaim(t, tx, comps)
	}
	require.NoError(t, tx.Flush())
	Reclaim(t, tx, comps)
}

// Reclaim polls q's completions into comps until none are left, each of
// which must be a success.
func Reclaim(t testing.TB, q nic.Queue, comps []nic.Completion) {
	t.Helper()
	for {
		n := q.Poll(comps)
		for _, c := range comps[:n] {
			require.NoError(t, c.Err)
		}
		if n < len(comps) {
			return
		}
	}
}
