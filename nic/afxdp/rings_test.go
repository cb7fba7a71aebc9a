package afxdp

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/nic"
)

// TestRxRingChecks: each field of a receive descriptor the kernel wrote is
// checked, and a refusal carries its code.
func TestRxRingChecks(t *testing.T) {
	rxChunk := func(b uint64) uint64 { return (fuzzRing + b) << 11 }
	for _, tc := range []struct {
		name   string
		addr   uint64
		length uint32
		opts   uint32
		want   error // nil: a good frame
	}{
		{"good", rxChunk(1) + headroom, 60, 0, nil},
		{"full buffer", rxChunk(1) + headroom, 2048 - headroom, 0, nil},
		{"wrong offset", rxChunk(1) + headroom + 2, 60, 0, cq.ProvBadID},
		{"bits beyond the chunk", rxChunk(1) + headroom | 1<<45, 60, 0, cq.ProvBadID},
		{"high chunk bits", rxChunk(1) + headroom | 1<<20, 60, 0, cq.ProvBadID},
		{"a transmit chunk", 2<<11 + headroom, 60, 0, cq.ProvBadID},
		{"too long", rxChunk(1) + headroom, 2048 - headroom + 1, 0, cq.ProvBadLen},
		{"too short", rxChunk(1) + headroom, 13, 0, cq.ProvBadLen},
		{"options", rxChunk(1) + headroom, 60, 1, cq.ProvBadStatus},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rx, _ := fakePair(t)
			b := make([]byte, descSize)
			binary.LittleEndian.PutUint64(b, tc.addr)
			binary.LittleEndian.PutUint32(b[8:], tc.length)
			binary.LittleEndian.PutUint32(b[12:], tc.opts)
			kernelWrites(&rx.x.rx, b, 1)
			comps := make([]nic.Completion, 2)
			require.Equal(t, 1, rx.Poll(comps))
			c := comps[0]
			if tc.want == nil {
				require.NoError(t, c.Err)
				require.Equal(t, int(tc.length), c.Len)
				require.NoError(t, rx.Repost(c.Buf, nil))
			} else {
				require.ErrorIs(t, c.Err, tc.want)
				require.Nil(t, c.Data)
			}
			posted, lent := rx.bufs.Counts()
			require.Equal(t, posted, rx.Outstanding())
			require.Zero(t, lent)
		})
	}
	t.Run("producer beyond the buffers given", func(t *testing.T) {
		rx, _ := fakePair(t)
		kernelWrites(&rx.x.rx, nil, fuzzRing+1)
		comps := make([]nic.Completion, 2)
		require.Equal(t, 1, rx.Poll(comps))
		require.ErrorIs(t, comps[0].Err, cq.ProvBadIndex)
		require.ErrorIs(t, rx.PostRecv(nil), nic.ErrBroken)
	})
}
