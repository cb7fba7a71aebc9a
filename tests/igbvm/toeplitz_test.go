package igbvm

import (
	"encoding/binary"
	"net"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestToeplitz checks the hash against the verification values of
// Microsoft's RSS specification (IPv4 with TCP ports).
func TestToeplitz(t *testing.T) {
	for _, c := range []struct {
		src, dst     string
		sport, dport uint16
		want         uint32
	}{
		{"66.9.149.187", "161.142.100.80", 2794, 1766, 0x51ccc178},
		{"199.92.111.2", "65.69.140.83", 14230, 4739, 0xc626b0ea},
	} {
		in := make([]byte, 12)
		copy(in[0:4], net.ParseIP(c.src).To4())
		copy(in[4:8], net.ParseIP(c.dst).To4())
		binary.BigEndian.PutUint16(in[8:10], c.sport)
		binary.BigEndian.PutUint16(in[10:12], c.dport)
		require.Equal(t, c.want, toeplitz(rssKey, in), "%s:%d", c.src, c.sport)
	}
}
