package afxdp

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/internal/vethtest"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/nic/internal/sendcheck"
)

// TestSendFunc runs the in-place send's check on one end of a veth pair,
// a Linux socket reading the other.
func TestSendFunc(t *testing.T) {
	v := vethtest.New(t, 1)
	dev := openIn(t, v.A, "vfx0", nic.Config{})
	p := v.Peer(t)
	tx, err := dev.Tx(0)
	require.NoError(t, err)
	sendcheck.Run(t, tx, p.MAC, dev.MAC(), func(t testing.TB, n int) [][]byte {
		return p.Frames(t, n, sendcheck.EtherType, func() { _ = tx.Flush() })
	})
}
