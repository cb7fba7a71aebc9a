package ring

import (
	"encoding/binary"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/cq"
)

// TestHeld: a descriptor-done ring with Layout.Held leaves that value, not
// zero, in a consumed entry's ownership word (the other bits cleared of
// the DD bits only), for devices that take back an entry whose word reads
// zero (AF_PACKET's TPACKET_V2 slots); Held must lie outside the mask and
// only the descriptor-done convention takes it.
func TestHeld(t *testing.T) {
	const n, esz, held = 4, 16, 1 << 28
	mem := mmap(t, n*esz)
	l := Layout{Name: "held", EntrySize: esz, Entries: n, Convention: DescriptorDone, OwnerMask: 1, Held: held,
		IDIsIndex: true, Fields: Fields{Len: Field{Off: 8, Bits: 32}}}
	src, err := NewRingSource(RingConfig{Mem: mem, Layout: l})
	require.NoError(t, err)
	tab, err := NewTable(n, 2)
	require.NoError(t, err)
	require.NoError(t, src.BindTable(0, tab))
	_, err = tab.PostSlot(0, Op{Context: "a", Len: 100, Flags: cq.FlagRecv | cq.FlagMsg})
	require.NoError(t, err)
	binary.LittleEndian.PutUint32(mem[8:], 60)
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&mem[0])), 1|8) // DD and another status bit
	var c Completion
	require.True(t, src.Next(&c))
	require.Zero(t, c.Err)
	require.Equal(t, "a", c.Context)
	require.EqualValues(t, held|8, atomic.LoadUint32((*uint32)(unsafe.Pointer(&mem[0]))))
	require.False(t, src.Next(&c), "held is not ready")

	for _, bad := range []Layout{
		func() Layout { b := l; b.Held = 1; return b }(),                             // inside the mask
		func() Layout { b := l; b.Convention, b.OwnerOff = PhaseBit, 0; return b }(), // another convention
	} {
		_, err := NewRingSource(RingConfig{Mem: mem, Layout: bad})
		require.ErrorIs(t, err, cq.ErrInvalid)
	}
}
