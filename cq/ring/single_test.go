package ring

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/vfnic/vfnic/cq"
)

// TestSingleThreadedTable runs a SingleThreaded CQ with a table from
// NewSingleThreadedTable for several laps, re-posting each buffer as its
// completion is read (an RX loop): every completion arrives once, in
// order, with its context, the table fills up and drains as a locking one
// does, and nothing allocates.
func TestSingleThreadedTable(t *testing.T) {
	for _, single := range []bool{false, true} {
		const n = 64
		h := newHarness(t, cq.Attr{Format: cq.FormatData, SingleThreaded: single}, n, n)
		ctxs := make([]any, n)
		ids := make([]uint32, n)
		for i := range ctxs {
			ctxs[i] = i
			ids[i] = h.post(ctxs[i], 128, cq.FlagRecv|cq.FlagMsg)
		}
		_, err := h.tab.Post(Op{Len: 1})
		require.ErrorIs(t, err, ErrFull)
		require.Equal(t, n, h.tab.Outstanding())
		ents := make([]cq.Entry, 8)
		next := 0
		lap := func() {
			for i := 0; i < n; i++ {
				h.complete(rawEntry{id: ids[i], opcode: 1, ln: 64})
			}
			for got := 0; got < n; {
				k, err := h.c.Read(ents)
				require.NoError(t, err)
				for _, e := range ents[:k] {
					require.Equal(t, next%n, e.Context)
					require.EqualValues(t, 64, e.Len)
					id, err := h.tab.Post(Op{Context: e.Context, Len: 128, Buf: 0x10000, Flags: cq.FlagRecv | cq.FlagMsg})
					require.NoError(t, err)
					ids[next%n] = id
					next++
				}
				got += k
			}
			_, err := h.c.Read(ents)
			require.ErrorIs(t, err, cq.ErrAgain)
		}
		for i := 0; i < 3; i++ {
			lap()
		}
		require.Equal(t, n, h.tab.Outstanding(), "single=%v", single)
		allocs := testing.AllocsPerRun(5, lap)
		require.Zero(t, allocs, "single=%v", single)
	}
}

// BenchmarkReadRepost is an RX loop on a ring the device wrote for a lap:
// read a batch of 32, re-post each buffer. ns/op is per completion and
// counts the reads and the re-posts; "single" is a SingleThreaded CQ with
// a NewSingleThreadedTable (no locked instruction per completion),
// "locking" the thread-safe pair.
func BenchmarkReadRepost(b *testing.B) {
	for _, single := range []bool{false, true} {
		name := "locking"
		if single {
			name = "single"
		}
		b.Run(name, func(b *testing.B) {
			const lap = 4096
			h := newHarness(b, cq.Attr{Format: cq.FormatData, SingleThreaded: single}, lap, lap)
			ctxs := make([]any, lap)
			ids := make([]uint32, lap)
			for i := range ctxs {
				ctxs[i] = i
				ids[i] = h.post(ctxs[i], 1500, cq.FlagRecv|cq.FlagMsg)
			}
			ents := make([]cq.Entry, 32)
			b.ReportAllocs()
			b.ResetTimer()
			for done := 0; done < b.N; {
				b.StopTimer()
				for i := 0; i < lap; i++ {
					h.dev.write(rawEntry{id: ids[i], queue: h.queue, opcode: 1, ln: 64}, false)
				}
				b.StartTimer()
				for got := 0; got < lap; {
					k, err := h.c.Read(ents)
					if err != nil {
						b.Fatal(err)
					}
					for j := range ents[:k] {
						id, err := h.tab.Post(Op{Context: ents[j].Context, Len: 1500, Flags: cq.FlagRecv | cq.FlagMsg})
						if err != nil {
							b.Fatal(err)
						}
						ids[(got+j)%lap] = id
					}
					got += k
				}
				done += lap
			}
		})
	}
}

// The fast loops find a slot with one shift of its index, and every index
// an id's slot bits can name has a slot that is never posted beyond Cap.
func TestSlotGeometry(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) == 8 {
		require.Equal(t, uintptr(64), unsafe.Sizeof(slot{}), "a slot is a cache line")
	}
	tab, err := NewTable(5, 16)
	require.NoError(t, err)
	require.Equal(t, 5, tab.Cap())
	c := tab.completer()
	require.Equal(t, uint32(7), c.mask)
	for i := 0; i < 5; i++ {
		id, err := tab.Post(Op{Len: 1})
		require.NoError(t, err)
		require.True(t, c.at(id).outstanding(id))
	}
	for id := uint32(5); id < 8; id++ {
		require.False(t, c.at(id).outstanding(id), "index %d is past the table", id)
		require.Nil(t, c.lookup(id))
	}
	require.False(t, noSlots.at(3).outstanding(3), "no table refuses every id")
}

// Each and EachID visit the outstanding operations in slot order, a
// spanning one included, with the ids Post returned.
func TestTableEachID(t *testing.T) {
	tab, err := NewTable(4, 8)
	require.NoError(t, err)
	var ids []uint32
	for i := range 4 {
		id, err := tab.Post(Op{Context: i, Len: 8, Span: i % 2 * 3})
		require.NoError(t, err)
		ids = append(ids, id)
	}
	s := tab.lookup(ids[2])
	require.NotNil(t, s)
	tab.release(s, ids[2])
	tab.flush()
	id, err := tab.Post(Op{Context: 4, Len: 8})
	require.NoError(t, err)
	require.Equal(t, uint32(2), id&3, "the freed slot, a generation on")
	type visit struct {
		id  uint32
		ctx any
	}
	var got []visit
	tab.EachID(func(id uint32, ctx any) { got = append(got, visit{id, ctx}) })
	require.Equal(t, []visit{{ids[0], 0}, {ids[1], 1}, {id, 4}, {ids[3], 3}}, got)
	var ctxs []any
	tab.Each(func(ctx any) { ctxs = append(ctxs, ctx) })
	require.Equal(t, []any{0, 1, 4, 3}, ctxs)
}
