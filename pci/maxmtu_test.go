package pci

import (
	"net"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMaxMTU reads each interface's maximum MTU through netlink (read
// only; no device is touched): where the kernel sets one, it is at least
// the current MTU (loopback's is 0, no limit).
func TestMaxMTU(t *testing.T) {
	ifs, err := net.Interfaces()
	require.NoError(t, err)
	for _, ifi := range ifs {
		mtu, err := MaxMTU(ifi.Index)
		require.NoError(t, err, ifi.Name)
		if mtu > 0 {
			require.GreaterOrEqual(t, mtu, ifi.MTU, ifi.Name)
		}
		t.Logf("%s: MTU %d, max %d", ifi.Name, ifi.MTU, mtu)
	}
	_, err = MaxMTU(1 << 30)
	require.ErrorContains(t, err, "not found")
}
