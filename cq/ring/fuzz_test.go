package ring

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vfnic/vfnic/cq"
)

// fuzzLayouts are the ring formats FuzzRingSource decodes: the software
// device's, one of each ownership convention (virtio packed among them)
// and virtio's split used ring.
func fuzzLayouts(entries int) []Layout {
	return append(append([]Layout{simLayout(entries)}, conventionLayouts(entries)...), splitLayout(entries))
}

// FuzzRingSource fills a ring with arbitrary bytes, as a device that
// writes garbage would, after the driver posted operations, and reads it
// through two CQs: one on the fast path (when the layout has one) and one
// on the generic loop. Both must give the same completions, error
// completions and ring state, nothing may panic, and every posted-
// operation table must account for each slot exactly once afterwards: no
// slot leaked (free but never handed out again) and none handed out twice.
//
// Input: byte 0 picks the layout, byte 1 the CQ format (bits 0-1) and
// the codes (bit 2: none, as virtio has, else the software device's), byte
// 2 how many operations are posted per queue, byte 3 whether the device
// flags an overrun at the end (bit 0) and, on a UsedIndex ring, its
// producer index (bits 1-7); the rest is the ring's memory.
func FuzzRingSource(f *testing.F) {
	for _, seed := range ringSeeds() {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) { readFuzzedRing(t, data) })
}

// ringSeeds are FuzzRingSource's seed corpus: for each layout, the entries
// a well-behaved device writes for the operations posted, then the same
// with bytes flipped.
func ringSeeds() [][]byte {
	var seeds [][]byte
	for li, l := range fuzzLayouts(fuzzEntries) {
		// Seeds: entries a well-behaved device writes for the operations
		// posted, then the same with bytes flipped.
		mem := make([]byte, l.EntrySize*l.Entries)
		dev := &fakeDev{mem: mem, l: l}
		for i := range 6 {
			// Table ids carry a generation above the slot: the first
			// posting of slot i is 1<<4 | i in a 16-slot table.
			dev.write(rawEntry{id: 1<<4 | uint32(i), ln: 8, opcode: 1}, false)
		}
		var used byte // UsedIndex: the producer index says 6 entries
		if l.Convention == UsedIndex {
			used = 6 << 1
		}
		seeds = append(seeds, append([]byte{byte(li), 3, 8, used}, mem...))
		bad := append([]byte(nil), mem...)
		for i := 3; i < len(bad); i += 7 {
			bad[i] ^= 0x5a
		}
		seeds = append(seeds, append([]byte{byte(li), 2, 6, used | 1}, bad...))
		if l.Convention == UsedIndex || l.Name == "virtio-packed" {
			// No codes, as nic/virtio reads them: the id-and-length loop.
			seeds = append(seeds, append([]byte{byte(li), 2 | 4, 8, used}, mem...),
				append([]byte{byte(li), 2 | 4, 6, used | 1}, bad...))
		}
	}
	return seeds
}

// readFuzzedRing is FuzzRingSource's body; it returns the successful and
// the error completions read.
func readFuzzedRing(t *testing.T, data []byte) (good, bad int) {
	if len(data) < 4 {
		return 0, 0
	}
	ls := fuzzLayouts(fuzzEntries)
	l := ls[int(data[0])%len(ls)]
	format := cq.Format(1 + int(data[1])%4)
	codes := simCodes()
	if data[1]&4 != 0 {
		codes = Codes{}
	}
	posts := int(data[2]) % (fuzzEntries + 1)
	overrun := data[3]&1 != 0
	body := data[4:]

	var sides [2]*diffSide
	for i := range sides {
		sides[i] = newDiffSide(t, l, codes, cq.Attr{Format: format}, i == 1)
	}
	idBits := min(32, l.Fields.ID.Bits)
	if l.IDIsIndex {
		idBits = 4 // 16 operations: the id is the ring position
	}
	queues := []uint32{0}
	if l.Fields.Queue.Bits > 0 {
		queues = append(queues, 1, 3)
	}
	for _, s := range sides {
		for _, qn := range queues {
			tab, err := NewTable(fuzzEntries, idBits)
			require.NoError(t, err)
			require.NoError(t, s.src.BindTable(qn, tab))
			s.tabs[qn] = tab
		}
		for _, qn := range queues {
			for i := range posts {
				_, err := s.tabs[qn].Post(Op{Context: fmt.Sprint(qn, i), Len: 64 + i,
					Buf: uintptr(0x10000 * (i + 1)), Flags: cq.FlagRecv | cq.FlagMsg})
				require.NoError(t, err)
			}
		}
		copy(s.dev.mem, body)
		if overrun {
			s.over.Write(1)
		}
		if l.Convention == UsedIndex {
			s.prod.Write(uint32(data[3]>>1) << 16)
		}
	}

	ents := [2][]cq.Entry{make([]cq.Entry, 7), make([]cq.Entry, 7)}
	var ee [2]cq.ErrEntry
	idle := 0
	for step := 0; step < 8*fuzzEntries && idle < 2; step++ {
		k := 1 + step%7
		var ns [2]int
		var errs [2]error
		for i, s := range sides {
			if step%11 == 10 {
				ns[i], errs[i] = s.c.Read(nil)
			} else {
				ns[i], errs[i] = s.c.Read(ents[i][:k])
			}
		}
		msg := fmt.Sprintf("layout %s step %d", l.Name, step)
		require.Equal(t, errs[1], errs[0], msg)
		require.Equal(t, ns[1], ns[0], msg)
		require.Equal(t, ents[1][:ns[1]], ents[0][:ns[0]], msg)
		good += ns[0]
		if errs[0] == cq.ErrAvail || step%5 == 4 {
			for i, s := range sides {
				errs[i] = s.c.ReadErr(&ee[i])
			}
			require.Equal(t, errs[1], errs[0], msg)
			require.Equal(t, ee[1], ee[0], msg)
			if errs[0] == nil {
				bad++
			}
		}
		if errs[0] == cq.ErrAgain || errs[0] == cq.ErrOverrun {
			idle++
		} else {
			idle = 0
		}
		for _, s := range sides {
			require.Equal(t, sides[1].src.Ring().Head(), s.src.Ring().Head(), msg)
			require.Equal(t, sides[1].src.Ring().Count(), s.src.Ring().Count(), msg)
		}
	}
	for _, s := range sides {
		for qn, tab := range s.tabs {
			checkTable(t, tab, fmt.Sprintf("layout %s queue %d", l.Name, qn))
		}
	}
	return good, bad
}

// fuzzEntries is the ring size of the fuzz targets.
const fuzzEntries = 16

// checkTable posts into t until it is full and checks that it hands out
// every slot that is not outstanding exactly once: a leaked slot makes the
// count short, a slot freed twice comes out twice.
func checkTable(t *testing.T, tab *Table, msg string) {
	t.Helper()
	out := tab.Outstanding()
	require.GreaterOrEqual(t, out, 0, msg)
	require.LessOrEqual(t, out, tab.Cap(), msg)
	seen := map[uint32]bool{}
	for {
		id, err := tab.Post(Op{Len: 1})
		if err != nil {
			require.ErrorIs(t, err, ErrFull, msg)
			break
		}
		si := id & tab.slotMask
		require.False(t, seen[si], "%s: slot %d handed out twice", msg, si)
		seen[si] = true
	}
	require.Equal(t, tab.Cap()-out, len(seen), "%s: slots leaked", msg)
	require.Equal(t, tab.Cap(), tab.Outstanding(), msg)
}

// TestRingSeeds runs FuzzRingSource's seeds and checks that they reach
// both the success and the refusal paths on every layout.
func TestRingSeeds(t *testing.T) {
	seeds := ringSeeds()
	for i := 0; i < len(seeds); i += 2 {
		good, _ := readFuzzedRing(t, seeds[i])
		require.Positive(t, good, "seed %d completes", i)
		_, bad := readFuzzedRing(t, seeds[i+1])
		require.Positive(t, bad, "seed %d is refused", i+1)
	}
}
