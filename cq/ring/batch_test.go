package ring

import (
	"math/bits"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vfnic/vfnic/cq"
)

// batchSide is one of two identical rings: one read with NextBatch, the
// other with Next, one entry at a time.
type batchSide struct {
	src *RingSource
	tab *Table
	dev *fakeDev
}

func newBatchSide(t *testing.T, l Layout, codes Codes) batchSide {
	mem := mmap(t, l.EntrySize*l.Entries)
	src, err := NewRingSource(RingConfig{Mem: mem, Layout: l, Codes: codes})
	require.NoError(t, err)
	src.Ring().Reset()
	idBits := 16
	if l.IDIsIndex {
		idBits = bits.Len(uint(l.Entries - 1)) // ids are positions
	}
	tab, err := NewSingleThreadedTable(l.Entries, idBits)
	require.NoError(t, err)
	require.NoError(t, src.BindTable(0, tab))
	return batchSide{src: src, tab: tab, dev: &fakeDev{mem: mem, l: l}}
}

// TestNextBatchIsNext: for the drivers' layouts (an id and a length, a
// status, descriptor-done with ids that are positions), NextBatch takes
// the same entries as Next called once per entry, into the same
// Completions, with the same ring and table state after, whatever the
// entries (good, a bad id, a bad length, a failed status, a wrong phase)
// and the batch sizes.
func TestNextBatchIsNext(t *testing.T) {
	l := conventionLayouts(16)
	// igb's receive write-back (nic/igb's rxLayout): DD is bit 0 of the
	// 2-bit status, so a written entry's status reads 1 (DD) or 3.
	igb := Layout{Name: "igb", EntrySize: 16, Entries: 16, Convention: DescriptorDone, OwnerOff: 8, OwnerMask: 1,
		IDIsIndex: true, DetectHoles: true,
		Fields: Fields{Status: Field{Off: 8, Bits: 2}, Len: Field{Off: 12, Bits: 16}, Meta: [2]Field{{Off: 0, Bits: 64}, {Off: 8, Bits: 64}}}}
	layouts := []struct {
		l     Layout
		codes Codes
		bad   uint32 // a status value the codes fail
		shape int
	}{
		{l[2], Codes{}, 1, shapePacked16}, // virtio packed
		{l[0], Codes{}, 1, shapeNone},     // nvme: a status field, 0 the only success
		{l[4], Codes{Statuses: []Status{{Value: 0, Name: "ok"}, {Value: 1, Err: cq.EIO, Name: "err"}}}, 1, shapeNone}, // DD, ids are positions
		{igb, Codes{Statuses: []Status{{Value: 1, Name: "DD"}, {Value: 3, Err: cq.EIO, Name: "err"}}}, 2, shapeDD16},
	}
	for _, c := range layouts {
		t.Run(c.l.Name, func(t *testing.T) {
			p := newBatchSide(t, c.l, c.codes).src.plan
			require.NotNil(t, p, "the layout takes the batch loop")
			require.Equal(t, c.shape, p.shape, "the layout's loop")
			rng := rand.New(rand.NewPCG(1, uint64(len(c.l.Name))))
			a, b := newBatchSide(t, c.l, c.codes), newBatchSide(t, c.l, c.codes)
			n := uint32(c.l.Entries)
			var ids []uint32
			ctx, taken, refused := 0, 0, 0
			defer func() { t.Logf("%d completions, %d refused", taken, refused) }()
			for round := range 300 {
				// Post up to a ring's worth, the same on both sides.
				for a.tab.Outstanding() < int(n)-1 && len(ids) < int(n)-1 {
					op := Op{Context: ctx, Buf: uintptr(0x1000 + ctx), Len: 200, Flags: cq.FlagRecv | cq.FlagMsg, Word: uint64(ctx)}
					ia, err := a.tab.Post(op)
					require.NoError(t, err)
					ib, err := b.tab.Post(op)
					require.NoError(t, err)
					require.Equal(t, ia, ib)
					ids = append(ids, ia)
					ctx++
				}
				// The device completes some, in order, a few of them bad.
				k := rng.IntN(len(ids) + 1)
				start := a.dev.prod
				for range k {
					if a.dev.prod-start+2 > n {
						break // the device never writes over what the driver has not read
					}
					e := rawEntry{id: ids[0], ln: uint32(64 + rng.IntN(100))}
					if c.l.IDIsIndex {
						e.id = a.dev.prod % n
					}
					switch rng.IntN(40) {
					case 0:
						if !c.l.IDIsIndex {
							// Not posted: refused, and the operation's
							// own entry follows.
							bad := e
							bad.id ^= 0x8000 // the slot, another generation
							a.dev.write(bad, false)
							b.dev.write(bad, false)
						}
					case 1:
						e.ln = 500 // beyond the buffer
					case 2:
						e.status = c.bad
					case 3:
						if !c.l.IDIsIndex && c.l.DetectHoles { // read as a hole
							a.dev.write(e, true) // a wrong phase, then the entry
							b.dev.write(e, true)
						}
					}
					a.dev.write(e, false)
					b.dev.write(e, false)
					ids = ids[1:]
				}
				var got, want []Completion
				cs := make([]Completion, 1+rng.IntN(8))
				for {
					m := a.src.NextBatch(cs[:1+rng.IntN(len(cs))])
					for _, c := range cs[:m] {
						if c.Err == 0 {
							c.OLen = 0 // a refused entry's alone: left as it was by the batch loop
						}
						got = append(got, c)
					}
					a.src.Publish()
					if m == 0 {
						break
					}
				}
				var one Completion
				for b.src.Next(&one) {
					want = append(want, one)
				}
				b.src.Publish()
				require.Equal(t, want, got, "round %d", round)
				for _, c := range got {
					taken++
					if c.Err != 0 {
						refused++
					}
				}
				require.Equal(t, b.src.Ring().Count(), a.src.Ring().Count())
				require.Equal(t, b.dev.mem, a.dev.mem, "ring memory (consumed entries' ownership) round %d", round)
				require.Equal(t, b.tab.Outstanding(), a.tab.Outstanding())
				require.Equal(t, len(ids), a.tab.Outstanding(), "round %d", round)
			}
		})
	}
}
