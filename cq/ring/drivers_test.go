package ring

import (
	"github.com/vfnic/vfnic/cq"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDescriptorDoneRingThroughCQ runs an e1000e-style write-back ring (no
// id: the descriptor position is the id; DD bit cleared on consume) through
// a CQ over several laps: the way the e1000e/igb driver will use it.
func TestDescriptorDoneRingThroughCQ(t *testing.T) {
	l := conventionLayouts(8)[4]
	mem := mmap(t, 8*16)
	src, err := NewRingSource(RingConfig{Mem: mem, Layout: l,
		Codes: Codes{Statuses: []Status{{Value: 0, Name: "OK"}, {Value: 1 << 1, Err: cq.ECRC, Name: "CE"}}}})
	require.NoError(t, err)
	src.Ring().Reset()
	c, err := cq.New(cq.Attr{Size: 8, Format: cq.FormatMsg}, cq.Limits{})
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.Driver().AddSource(src))
	tab, err := NewTable(8, 3) // id bits == slot bits: ids are positions
	require.NoError(t, err)
	require.NoError(t, src.BindTable(0, tab))
	dev := &fakeDev{mem: mem, l: l}
	ents := make([]cq.Entry, 8)
	for i := 0; i < 40; i++ {
		id, err := tab.Post(Op{Context: i, Len: 2048, Flags: cq.FlagRecv | cq.FlagMsg})
		require.NoError(t, err)
		require.EqualValues(t, i%8, id, "posted in ring order, the id is the descriptor position")
		st := uint32(0)
		if i%13 == 12 {
			st = 1 << 1 // a CRC error
		}
		dev.write(rawEntry{ln: uint32(60 + i), status: st}, false)
		n, err := c.Read(ents)
		if st != 0 {
			require.ErrorIs(t, err, cq.ErrAvail)
			var ee cq.ErrEntry
			require.NoError(t, c.ReadErr(&ee))
			require.Equal(t, i, ee.Context)
			require.Equal(t, cq.ECRC, ee.Err)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Equal(t, i, ents[0].Context)
		require.Equal(t, 60+i, ents[0].Len)
	}
}

// TestPackedRingThroughCQ runs a virtio packed ring (16-bit buffer ids,
// AVAIL/USED wrap bits read through the aligned 32-bit word) through a CQ,
// completing out of order as virtio devices may.
func TestPackedRingThroughCQ(t *testing.T) {
	l := conventionLayouts(16)[2]
	mem := mmap(t, 16*16)
	src, err := NewRingSource(RingConfig{Mem: mem, Layout: l})
	require.NoError(t, err)
	c, err := cq.New(cq.Attr{Size: 16, Format: cq.FormatMsg}, cq.Limits{})
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.Driver().AddSource(src))
	tab, err := NewTable(16, 16)
	require.NoError(t, err)
	require.NoError(t, src.BindTable(0, tab))
	dev := &fakeDev{mem: mem, l: l}
	ents := make([]cq.Entry, 16)
	ids := map[int]uint32{}
	next := 0
	for round := 0; round < 10; round++ {
		for len(ids) < 6 {
			id, err := tab.Post(Op{Context: next, Len: 1500, Flags: cq.FlagSend | cq.FlagMsg})
			require.NoError(t, err)
			require.Less(t, id, uint32(1<<16))
			ids[next] = id
			next++
		}
		// Complete the newest first.
		var done []int
		for ctx := next - 1; ctx >= next-6; ctx-- {
			dev.write(rawEntry{id: ids[ctx], ln: 100}, false)
			done = append(done, ctx)
		}
		n, err := c.Read(ents)
		require.NoError(t, err)
		require.Equal(t, 6, n)
		for i := range done {
			require.Equal(t, done[i], ents[i].Context)
			delete(ids, done[i])
		}
	}
}

// TestDriverWord: the word a driver posts with (Op.Word) comes back in the
// completion Next takes, and EachPosted lists the operations still posted
// with theirs: the table is a driver's one record of a posting.
func TestDriverWord(t *testing.T) {
	l := conventionLayouts(16)[2]
	mem := mmap(t, 16*16)
	src, err := NewRingSource(RingConfig{Mem: mem, Layout: l})
	require.NoError(t, err)
	tab, err := NewSingleThreadedTable(16, 16)
	require.NoError(t, err)
	require.NoError(t, src.BindTable(0, tab))
	dev := &fakeDev{mem: mem, l: l}
	var ids []uint32
	for i := range 3 {
		id, err := tab.Post(Op{Context: i, Buf: uintptr(0x1000 * (i + 1)), Len: 1500, Flags: cq.FlagRecv | cq.FlagMsg, Word: uint64(100 + i)})
		require.NoError(t, err)
		ids = append(ids, id)
	}
	dev.write(rawEntry{id: ids[1], ln: 100}, false)
	var c Completion
	require.True(t, src.Next(&c))
	src.Publish()
	require.Zero(t, c.Err)
	require.Equal(t, 1, c.Context)
	require.Equal(t, uint64(101), c.Word)
	type posted struct {
		ctx  any
		buf  uintptr
		word uint64
	}
	var got []posted
	tab.EachPosted(func(id uint32, ctx any, buf uintptr, word uint64) { got = append(got, posted{ctx, buf, word}) })
	require.Equal(t, []posted{{0, 0x1000, 100}, {2, 0x3000, 102}}, got)
}
