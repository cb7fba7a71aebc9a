package virtio

import (
	"net"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/nic/internal/sendcheck"
)

// TestSendFunc runs the in-place send's check on both ring layouts: each
// buffer id's buffer keeps the last frame written into it, after its
// virtio-net header.
func TestSendFunc(t *testing.T) {
	forRings(t, func(t *testing.T, packed bool) {
		r := newRig(t, 16, packed, false, 64<<10)
		tx := r.txQueue(t, 1500)
		dst, src := net.HardwareAddr{2, 0, 0, 0, 0, 1}, net.HardwareAddr{2, 0, 0, 0, 0, 2}
		sendcheck.Run(t, tx, dst, src, func(t testing.TB, n int) [][]byte {
			var out [][]byte
			for range n {
				tk, ok := r.dev.take()
				require.True(t, ok, "frame %d of %d", len(out)+1, n)
				out = append(out, append([]byte(nil), tk.data(0)[netHdrLen:]...))
				r.dev.complete(tk.id, 0, tk.ndesc)
			}
			_, ok := r.dev.take()
			require.False(t, ok, "more than %d frames", n)
			return out
		})
	})
}
