package ring

import (
	"encoding/binary"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/doorbell"
)

// usedRing is a virtio split used ring read through Next: 8-byte {id, len}
// elements after a 4-byte header whose upper half is the producer index.
type usedRing struct {
	mem []byte
	src *RingSource
	tab *Table
}

func newUsedRing(t *testing.T, n int) *usedRing {
	mem := mmap(t, 4+8*n)
	prod, err := doorbell.NewWindow(mem[:4]).Reg32(0)
	require.NoError(t, err)
	src, err := NewRingSource(RingConfig{Mem: mem[4:], Regs: RingRegs{Producer: prod}, Layout: Layout{
		Name: "split", EntrySize: 8, Entries: n, Convention: UsedIndex, IndexShift: 16, IndexBits: 16,
		Fields: Fields{ID: Field{Off: 0, Bits: 32}, Len: Field{Off: 4, Bits: 32}},
	}})
	require.NoError(t, err)
	tab, err := NewTable(n, 3)
	require.NoError(t, err)
	require.NoError(t, src.BindTable(0, tab))
	return &usedRing{mem: mem, src: src, tab: tab}
}

// put writes element i of the device's sequence without publishing it.
func (u *usedRing) put(seq uint16, id, ln uint32) {
	off := 4 + 8*int(seq%uint16(u.src.ring.n))
	binary.LittleEndian.PutUint32(u.mem[off:], id)
	binary.LittleEndian.PutUint32(u.mem[off+4:], ln)
}

// publish stores the producer index (release).
func (u *usedRing) publish(idx uint16) {
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&u.mem[0])), uint32(idx)<<16)
}

func TestUsedIndexRing(t *testing.T) {
	u := newUsedRing(t, 8)
	var ids []uint32
	for i := range 8 {
		id, err := u.tab.Post(Op{Context: i, Len: 100, Flags: cq.FlagRecv | cq.FlagMsg})
		require.NoError(t, err)
		ids = append(ids, id)
	}
	var c Completion
	require.False(t, u.src.Next(&c), "index 0: nothing")
	// Entries written but not published are not read.
	u.put(0, ids[3], 60)
	u.put(1, ids[1], 61)
	require.False(t, u.src.Next(&c))
	u.publish(2)
	require.True(t, u.src.Next(&c))
	require.Equal(t, Completion{Context: 3, Flags: cq.FlagRecv | cq.FlagMsg, Len: 60, ID: ids[3], Pos: 0, Done: true}, c)
	require.True(t, u.src.Next(&c))
	require.Equal(t, 1, c.Context)
	require.False(t, u.src.Next(&c))
	u.src.Publish()
	// A bad id and a length beyond the buffer are refused, one by one,
	// and the ring goes on; the 16-bit index wraps.
	u.put(2, 0xdead, 10)
	u.put(3, ids[5], 101)
	u.put(4, ids[6], 100)
	u.publish(5)
	require.True(t, u.src.Next(&c))
	require.Equal(t, cq.ProvBadID, c.Prov)
	require.False(t, c.Done)
	require.True(t, u.src.Next(&c))
	require.Equal(t, cq.ProvBadLen, c.Prov)
	require.Equal(t, 5, c.Context, "a refused entry that names an operation completes it")
	require.True(t, c.Done)
	require.True(t, u.src.Next(&c))
	require.Zero(t, c.Err)
	require.Equal(t, 6, c.Context)
	// An index more than a ring ahead: refused once, then the ring stops.
	u.publish(5 + 9)
	require.True(t, u.src.Next(&c))
	require.Equal(t, cq.ProvBadIndex, c.Prov)
	require.True(t, u.src.ring.BadIndex())
	require.False(t, u.src.Next(&c))
	require.Zero(t, u.src.Pending(8))
}

func TestUsedIndexWraps(t *testing.T) {
	u := newUsedRing(t, 4)
	var c Completion
	idx := uint16(0)
	for round := range 70000 / 3 {
		var ids [3]uint32
		for i := range ids {
			id, err := u.tab.Post(Op{Context: round, Len: 64})
			require.NoError(t, err)
			ids[i] = id
		}
		for i, id := range ids {
			u.put(idx+uint16(i), id, 64)
		}
		idx += 3
		u.publish(idx)
		require.Equal(t, 3, u.src.Pending(8))
		for range 3 {
			require.True(t, u.src.Next(&c))
			require.Zero(t, c.Err, "round %d", round)
		}
		require.False(t, u.src.Next(&c))
		u.src.Publish()
	}
}

// With a producer limit (the driver's available index), a used index that
// runs ahead of it, even by less than a ring, is a bad index: the entries
// it covers are last lap's, and those naming buffers posted again would
// pass the id check. Within the limit the ring reads as before, across
// the 16-bit wrap.
func TestUsedIndexProducerLimit(t *testing.T) {
	u := newUsedRing(t, 8)
	r := u.src.Ring()
	r.SetProducerLimit(0)
	var c Completion
	post := func(n int) []uint32 {
		ids := make([]uint32, n)
		for i := range ids {
			id, err := u.tab.Post(Op{Context: i, Len: 100, Flags: cq.FlagRecv | cq.FlagMsg})
			require.NoError(t, err)
			ids[i] = id
		}
		return ids
	}
	// Lap 1: 8 made available and used.
	ids := post(8)
	r.SetProducerLimit(8)
	for i, id := range ids {
		u.put(uint16(i), id, 60)
	}
	u.publish(8)
	for range 8 {
		require.True(t, u.src.Next(&c))
		require.Zero(t, c.Err)
	}
	u.src.Publish()
	// Lap 2: 2 made available (limit 10), none used, index 16: the six
	// entries of lap 1 beyond them name ids posted again.
	post(2)
	r.SetProducerLimit(10)
	u.publish(16)
	require.Equal(t, 1, u.src.Pending(8), "the refusal waits to be read")
	require.True(t, u.src.Next(&c))
	require.Equal(t, cq.ProvBadIndex, c.Prov)
	require.Equal(t, cq.EIO, c.Err)
	require.False(t, c.Done)
	require.True(t, r.BadIndex())
	require.False(t, u.src.Next(&c), "stopped: nothing of the bad index is read")
	require.Zero(t, u.src.Pending(8))
	require.Equal(t, 2, u.tab.Outstanding(), "the two still posted stay so")

	// Up to the limit, across the 16-bit wrap of both indexes.
	u = newUsedRing(t, 8)
	r = u.src.Ring()
	idx := uint16(0)
	for round := range 70000 / 5 {
		ids := post(5)
		r.SetProducerLimit(uint32(idx + 5))
		for i, id := range ids {
			u.put(idx+uint16(i), id, 64)
		}
		// Used one at a time, to the limit exactly.
		for i := range 5 {
			u.publish(idx + uint16(i) + 1)
			require.True(t, u.src.Next(&c))
			require.Zero(t, c.Err, "round %d", round)
		}
		idx += 5
		require.False(t, u.src.Next(&c))
		u.src.Publish()
	}
	post(1)
	r.SetProducerLimit(uint32(idx + 1))
	u.publish(idx + 2)
	require.True(t, u.src.Next(&c))
	require.Equal(t, cq.ProvBadIndex, c.Prov, "one beyond the limit, after the wrap")
}

func TestUsedIndexLayoutChecks(t *testing.T) {
	l := Layout{Name: "split", EntrySize: 8, Entries: 8, Convention: UsedIndex, IndexShift: 16, IndexBits: 16}
	require.NoError(t, l.Validate())
	bad := l
	bad.IndexShift = 20
	require.ErrorIs(t, bad.Validate(), cq.ErrInvalid)
	bad = l
	bad.Entries = 1 << 16
	require.ErrorIs(t, bad.Validate(), cq.ErrInvalid)
	bad = l
	bad.DetectHoles = true
	require.ErrorIs(t, bad.Validate(), cq.ErrInvalid)
	_, err := NewRingSource(RingConfig{Mem: mmap(t, 64), Layout: l})
	require.ErrorIs(t, err, cq.ErrInvalid, "no producer index word")
}
