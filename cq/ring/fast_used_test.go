package ring

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/doorbell"
)

// splitLayout is virtio's split used ring (nic/virtio.SplitLayout).
func splitLayout(n int) Layout {
	return Layout{Name: "split", EntrySize: 8, Entries: n, Convention: UsedIndex, IndexShift: 16, IndexBits: 16,
		Doorbell: DoorbellCount, Fields: Fields{ID: Field{Off: 0, Bits: 32}, Len: Field{Off: 4, Bits: 32}}}
}

// usedSide is one CQ of TestFastPathMatchesGenericUsedIndex.
type usedSide struct {
	c    *cq.CQ
	src  *RingSource
	tab  *Table
	mem  []byte // header word, then the elements
	cons doorbell.Reg32
}

func newUsedSide(t *testing.T, n int, f cq.Format, generic bool) *usedSide {
	mem := mmap(t, 4096+4+8*n)
	ctl := doorbell.NewWindow(mem[:4096])
	cons, err := ctl.Reg32(0)
	require.NoError(t, err)
	prod, err := doorbell.NewWindow(mem[4096 : 4096+4]).Reg32(0)
	require.NoError(t, err)
	src, err := NewRingSource(RingConfig{Mem: mem[4096+4:], Layout: splitLayout(n),
		Regs: RingRegs{Producer: prod, Doorbell: doorbell.NewDoorbell(cons)}})
	require.NoError(t, err)
	require.NotNil(t, src.fast, "the split used ring takes the fast path")
	require.Equal(t, loopMasked, baseKind(src.fast), "with the masked loop")
	if generic {
		src.fast = nil
	}
	c, err := cq.New(cq.Attr{Size: n, Format: f}, cq.Limits{MaxSize: 1 << 16})
	require.NoError(t, err)
	require.NoError(t, c.Driver().AddSource(src))
	t.Cleanup(func() { _ = c.Close() })
	tab, err := NewTable(n, 16)
	require.NoError(t, err)
	require.NoError(t, src.BindTable(0, tab))
	return &usedSide{c: c, src: src, tab: tab, mem: mem[4096:], cons: cons}
}

// TestFastPathMatchesGenericUsedIndex is the fast-versus-generic
// differential test for the split used ring: the same random device (good
// buffers, unknown and repeated ids, lengths above the posted one, the
// index published in random steps and, at the end of some runs, a
// nonsense index) on two CQs, one of whose sources is forced onto the
// generic loop; every read must return the same completions, errors and
// ring, doorbell and table state.
func TestFastPathMatchesGenericUsedIndex(t *testing.T) {
	withShapes(t, testFastPathMatchesGenericUsedIndex)
}

func testFastPathMatchesGenericUsedIndex(t *testing.T) {
	const n = 32
	for _, f := range []cq.Format{cq.FormatContext, cq.FormatMsg, cq.FormatData, cq.FormatTagged} {
		for seed := uint64(1); seed <= 4; seed++ {
			t.Run(fmt.Sprintf("%s/%d", f, seed), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(seed, uint64(f)))
				sides := [2]*usedSide{newUsedSide(t, n, f, false), newUsedSide(t, n, f, true)}
				type op struct{ id, ln uint32 }
				var posted []op
				var prod uint16 // device's count of elements written
				ctx := 0
				post := func() {
					o := Op{Context: ctx, Len: 1 + rng.IntN(2000), Buf: uintptr(0x1000 * (1 + rng.IntN(64))),
						Flags: cq.FlagRecv | cq.FlagMsg}
					if rng.IntN(3) == 0 {
						o.Flags = cq.FlagSend | cq.FlagMsg
					}
					ctx++
					var ids [2]uint32
					var errs [2]error
					for i, s := range sides {
						ids[i], errs[i] = s.tab.Post(o)
					}
					require.Equal(t, errs[1], errs[0])
					require.Equal(t, ids[1], ids[0])
					if errs[0] == nil {
						posted = append(posted, op{ids[0], uint32(o.Len)})
					}
				}
				write := func() {
					var id, ln uint32
					switch k := rng.IntN(20); {
					case k == 0 || len(posted) == 0:
						id, ln = rng.Uint32N(1<<16), rng.Uint32N(4096) // unknown, or stale
					case k == 1:
						i := rng.IntN(len(posted))
						id, ln = posted[i].id, posted[i].ln+1 // too long: refused, slot released
						posted = append(posted[:i], posted[i+1:]...)
					default:
						i := rng.IntN(len(posted))
						id, ln = posted[i].id, rng.Uint32N(posted[i].ln+1)
						posted = append(posted[:i], posted[i+1:]...)
					}
					for _, s := range sides {
						off := 4 + 8*int(prod%n)
						binary.LittleEndian.PutUint32(s.mem[off:], id)
						binary.LittleEndian.PutUint32(s.mem[off+4:], ln)
					}
					prod++
				}
				publish := func(idx uint16) {
					for _, s := range sides {
						atomic.StoreUint32((*uint32)(unsafe.Pointer(&s.mem[0])), uint32(idx)<<16)
					}
				}
				good, bad := 0, 0
				read := func(step int) {
					k := 1 + rng.IntN(40)
					var ents [2][]cq.Entry
					var ns [2]int
					var errs [2]error
					for i, s := range sides {
						ents[i] = make([]cq.Entry, k)
						for j := range ents[i] {
							ents[i][j] = cq.Entry{Context: "stale", Flags: 0xdead, Len: -1, Buf: 1, Data: 2, Tag: 3, Queue: 4}
						}
						ns[i], errs[i] = s.c.Read(ents[i])
					}
					msg := fmt.Sprintf("step %d, read of %d", step, k)
					require.Equal(t, errs[1], errs[0], msg)
					require.Equal(t, ns[1], ns[0], msg)
					require.Equal(t, ents[1], ents[0], msg)
					good += ns[0]
					if errs[0] == cq.ErrAvail {
						var ee [2]cq.ErrEntry
						for i, s := range sides {
							errs[i] = s.c.ReadErr(&ee[i])
						}
						require.Equal(t, errs[1], errs[0], msg)
						require.Equal(t, ee[1], ee[0], msg)
						bad++
					}
					r0, r1 := sides[0].src.Ring(), sides[1].src.Ring()
					require.Equal(t, r1.Count(), r0.Count(), msg)
					require.Equal(t, r1.Head(), r0.Head(), msg)
					require.Equal(t, r1.BadIndex(), r0.BadIndex(), msg)
					require.Equal(t, sides[1].cons.Read(), sides[0].cons.Read(), msg)
					require.Equal(t, sides[1].tab.Outstanding(), sides[0].tab.Outstanding(), msg)
				}
				steps := diffSteps(300)
				for step := 0; step < steps; step++ {
					for k := rng.IntN(12); k > 0; k-- {
						post()
					}
					consumed := sides[0].src.Ring().Count()
					for k := rng.IntN(16); k > 0 && uint32(prod)-consumed < n; k-- {
						write()
					}
					if rng.IntN(3) != 0 {
						publish(prod)
					}
					for k := 1 + rng.IntN(3); k > 0; k-- {
						read(step)
					}
				}
				if seed%2 == 0 { // a nonsense index stops both rings alike
					publish(prod)
					for step := steps; step < steps+100 && sides[0].src.Ring().Count() != uint32(prod); step++ {
						read(step)
					}
					publish(prod + n + 1)
					for step := steps; step < steps+100 && !sides[0].src.Ring().BadIndex(); step++ {
						read(step)
					}
					require.True(t, sides[0].src.Ring().BadIndex())
				}
				require.Greater(t, good, steps, "successful completions")
				require.Greater(t, bad, steps/20, "error completions")
			})
		}
	}
}

// TestUsedLoopAllocs: reading virtio's packed and split used rings through
// a CQ's fast loops, and re-posting each buffer, allocates nothing, on a
// thread-safe and on a SingleThreaded CQ (run under -race too).
func TestUsedLoopAllocs(t *testing.T) {
	const n = 1024
	for _, l := range []Layout{conventionLayouts(n)[2], splitLayout(n)} {
		for _, single := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/single=%v", l.Name, single), func(t *testing.T) {
				s := newDiffSide(t, l, Codes{}, cq.Attr{Format: cq.FormatData, SingleThreaded: single}, false)
				require.NotNil(t, s.src.fast)
				newTable := NewTable
				if single {
					newTable = NewSingleThreadedTable
				}
				tab, err := newTable(n, 16)
				require.NoError(t, err)
				require.NoError(t, s.src.BindTable(0, tab))
				ctx := any("ctx")
				post := func() uint32 {
					id, err := tab.Post(Op{Context: ctx, Len: 100, Flags: cq.FlagRecv | cq.FlagMsg})
					require.NoError(t, err)
					return id
				}
				for i := 0; i < n-8; i++ {
					s.dev.write(rawEntry{id: post(), ln: 64}, false)
				}
				if s.prod.Valid() {
					s.prod.Write(uint32(n-8) << 16)
				}
				ents := make([]cq.Entry, 8)
				require.Zero(t, testing.AllocsPerRun(100, func() {
					k, err := s.c.Read(ents)
					if err != nil || k != len(ents) {
						t.Fatalf("read %d: %v", k, err)
					}
					for range ents[:k] {
						if _, err := tab.Post(Op{Context: ctx, Len: 100, Flags: cq.FlagRecv | cq.FlagMsg}); err != nil {
							t.Fatal(err)
						}
					}
				}))
			})
		}
	}
}
