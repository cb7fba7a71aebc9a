package softnic_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/nic/internal/sendcheck"
)

// TestSendFunc runs the in-place send's check across a software pair:
// transmit buffer i keeps the last frame of table slot i.
func TestSendFunc(t *testing.T) {
	a, b := pair(t, nic.Config{QueueSize: 64})
	tx, err := a.Tx(0)
	require.NoError(t, err)
	rx, err := b.Rx(0)
	require.NoError(t, err)
	fill(t, rx)
	sendcheck.Run(t, tx, b.MAC(), a.MAC(), func(t testing.TB, n int) [][]byte {
		frames, errs := recv(t.(*testing.T), rx, n)
		for _, err := range errs {
			require.NoError(t, err)
		}
		return frames
	})
}
