package ring

import (
	"fmt"
	"github.com/vfnic/vfnic/cq"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vfnic/vfnic/doorbell"
)

// conventionLayouts are small rings in the shape of each convention's
// real entry.
func conventionLayouts(entries int) []Layout {
	return []Layout{
		{ // NVMe completion entry: 16 bytes, status+phase in the last word.
			Name: "nvme", EntrySize: 16, Entries: entries, Convention: PhaseBit,
			OwnerOff: 12, OwnerMask: 1 << 16, InitPhase: 1, DetectHoles: true, Doorbell: DoorbellHead,
			Fields: Fields{ID: Field{Off: 12, Bits: 16}, Status: Field{Off: 12, Shift: 17, Bits: 15}, Len: Field{Off: 0, Bits: 32}},
		},
		{ // mlx5-like 64-byte CQE, owner bit in op_own (byte 63).
			Name: "mlx5", EntrySize: 64, Entries: entries, Convention: OwnerIndex,
			OwnerOff: 60, OwnerMask: 1 << 24, DetectHoles: true, Doorbell: DoorbellCount,
			Fields: Fields{ID: Field{Off: 56, Bits: 16}, Len: Field{Off: 44, Bits: 32}, Opcode: Field{Off: 63, Shift: 4, Bits: 4}},
		},
		{ // virtio packed descriptor: addr, len, id u16, flags u16 (AVAIL bit 7, USED bit 15).
			Name: "virtio-packed", EntrySize: 16, Entries: entries, Convention: PackedWrap,
			OwnerOff: 12, OwnerMask: 1<<(16+7) | 1<<(16+15), InitPhase: 1, WrongPhase: 1 << (16 + 7),
			Fields: Fields{ID: Field{Off: 12, Bits: 16}, Len: Field{Off: 8, Bits: 32}},
		},
		{ // vmxnet3 rx completion: gen bit 31 of the last word.
			Name: "vmxnet3", EntrySize: 16, Entries: entries, Convention: GenerationBit,
			OwnerOff: 12, OwnerMask: 1 << 31, InitPhase: 1, DetectHoles: true,
			Fields: Fields{ID: Field{Off: 0, Bits: 12}, Len: Field{Off: 8, Bits: 14}},
		},
		{ // e1000e legacy rx descriptor: DD is bit 0 of the status byte.
			Name: "e1000e", EntrySize: 16, Entries: entries, Convention: DescriptorDone,
			OwnerOff: 12, OwnerMask: 1, IDIsIndex: true, DetectHoles: true, Doorbell: DoorbellHead,
			Fields: Fields{Len: Field{Off: 8, Bits: 16}, Status: Field{Off: 13, Bits: 8}},
		},
	}
}

func newTestRing(t *testing.T, l Layout) (*Ring, *fakeDev) {
	mem := mmap(t, l.EntrySize*l.Entries)
	r, err := newRing(mem, l, RingRegs{})
	require.NoError(t, err)
	r.Reset()
	return r, &fakeDev{mem: mem, l: l}
}

func TestRingConventionsAcrossWraps(t *testing.T) {
	for _, l := range conventionLayouts(8) {
		t.Run(l.Name, func(t *testing.T) {
			r, d := newTestRing(t, l)
			require.False(t, r.ready(), "a fresh ring is empty")
			var raw decoded
			require.False(t, r.take(&raw))
			want := uint32(0)
			// 7 laps of batches of varying size, never more than free.
			for round := 0; round < 40; round++ {
				k := 1 + round%8
				for i := 0; i < k; i++ {
					d.write(rawEntry{id: d.prod % 4096, ln: 100 + d.prod%50}, false)
				}
				require.Equal(t, k, r.pending(64))
				for i := 0; i < k; i++ {
					require.True(t, r.take(&raw), "round %d entry %d", round, i)
					if !l.IDIsIndex {
						require.EqualValues(t, want%4096, raw.ID)
					} else {
						require.EqualValues(t, want%8, raw.ID)
					}
					require.EqualValues(t, 100+want%50, raw.Len)
					want++
				}
				require.False(t, r.ready(), "round %d: nothing beyond what was written", round)
				require.Zero(t, r.pending(64))
			}
			require.Greater(t, want/8, uint32(5), "several wraps")
			require.EqualValues(t, want, r.Count())
		})
	}
}

func TestRingWrongPhaseNeverMisread(t *testing.T) {
	for _, l := range conventionLayouts(8) {
		for _, start := range []int{0, 5, 7} { // wrong entry mid-lap and at the wrap
			t.Run(fmt.Sprintf("%s/at%d", l.Name, start), func(t *testing.T) {
				r, d := newTestRing(t, l)
				var raw decoded
				for i := 0; i < start; i++ { // move the wrong entry's position
					d.write(rawEntry{id: 1, ln: 1}, false)
					require.True(t, r.take(&raw))
				}
				d.write(rawEntry{id: 10, ln: 10}, false)
				d.write(rawEntry{id: 11, ln: 11}, true) // wrong phase
				d.write(rawEntry{id: 12, ln: 12}, false)
				require.True(t, r.take(&raw))
				require.EqualValues(t, 10, raw.Len)
				require.False(t, r.ready(), "the wrong-phase entry is not consumed")
				require.False(t, r.peek(&raw))
				require.Zero(t, r.pending(8))
				if !l.DetectHoles {
					require.False(t, r.hole(), "holes are not detected for %s", l.Name)
					return
				}
				require.True(t, r.hole(), "a valid entry behind a wrong one is a hole")
				r.advance() // what RingSource does after reporting it
				require.True(t, r.take(&raw))
				require.EqualValues(t, 12, raw.Len)
				require.False(t, r.ready())
				require.False(t, r.hole())
			})
		}
	}
}

func TestRingDDClearsOnConsume(t *testing.T) {
	l := conventionLayouts(4)[4]
	r, d := newTestRing(t, l)
	var raw decoded
	d.write(rawEntry{ln: 5}, false)
	require.True(t, r.take(&raw))
	require.Zero(t, d.mem[12]&1, "DD cleared by the reader")
}

func TestRingDoorbellOncePerBatch(t *testing.T) {
	l := simLayout(16)
	mem := mmap(t, 4096+16*64)
	reg, err := doorbell.NewWindow(mem[:4096]).Reg32(0)
	require.NoError(t, err)
	db := doorbell.NewDoorbell(reg)
	r, err := newRing(mem[4096:], l, RingRegs{Doorbell: db})
	require.NoError(t, err)
	d := &fakeDev{mem: mem[4096:], l: l}
	for i := 0; i < 10; i++ {
		d.write(rawEntry{id: uint32(i)}, false)
	}
	var raw decoded
	for r.take(&raw) {
	}
	r.publish()
	r.publish()
	require.EqualValues(t, 1, db.Rings(), "one doorbell write for the batch, none for a repeat")
	require.EqualValues(t, 10, reg.Read())
}

func TestRingOverrunRegister(t *testing.T) {
	l := simLayout(4)
	mem := mmap(t, 4096+4*64)
	reg, err := doorbell.NewWindow(mem[:4096]).Reg32(16)
	require.NoError(t, err)
	r, err := newRing(mem[4096:], l, RingRegs{Overrun: reg, OverrunMask: 1})
	require.NoError(t, err)
	d := &fakeDev{mem: mem[4096:], l: l}
	d.write(rawEntry{id: 1}, false)
	reg.Write(1)
	require.False(t, r.overrun(), "an entry is still at the head")
	var raw decoded
	require.True(t, r.take(&raw))
	require.True(t, r.overrun())
}

func TestLayoutValidation(t *testing.T) {
	good := simLayout(8)
	require.NoError(t, good.Validate())
	bad := []func(l *Layout){
		func(l *Layout) { l.EntrySize = 6 },
		func(l *Layout) { l.EntrySize = 66 },
		func(l *Layout) { l.Entries = 0 },
		func(l *Layout) { l.Entries = maxEntries + 1 },
		func(l *Layout) { l.Convention = 0 },
		func(l *Layout) { l.Convention = OwnerIndex; l.InitPhase = 0; l.Entries = 6 },
		func(l *Layout) { l.Convention = OwnerIndex; l.InitPhase = 1 },
		func(l *Layout) { l.InitPhase = 2 },
		func(l *Layout) { l.OwnerOff = 62 },
		func(l *Layout) { l.OwnerOff = 64 },
		func(l *Layout) { l.OwnerMask = 0 },
		func(l *Layout) { l.Fields.Len = Field{Off: 62, Bits: 32} },
		func(l *Layout) { l.Fields.Tag = Field{Off: 0, Bits: 65} },
		func(l *Layout) { l.Fields.Flags = Field{Off: 12, Bits: 9} },
		func(l *Layout) { l.Fields.ID = Field{Off: -1, Bits: 8} },
		func(l *Layout) { l.Doorbell = 9 },
	}
	for i, mod := range bad {
		l := good
		mod(&l)
		require.ErrorIs(t, l.Validate(), cq.ErrInvalid, "case %d", i)
	}
	_, err := newRing(make([]byte, 100), good, RingRegs{})
	require.ErrorIs(t, err, cq.ErrInvalid, "ring memory too small")
}

func TestFieldAtEndOfEntry(t *testing.T) {
	// A 32-bit field in the last bytes of a 16-byte entry is read by a load
	// that ends at the entry's end, never beyond.
	l := conventionLayouts(2)[2]
	mem, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	require.NoError(t, err)
	defer unix.Munmap(mem)
	// Put the ring in the last 32 bytes of the mapping: an overlong load
	// would fault.
	ring := mem[4096-32:]
	r, err := newRing(ring, l, RingRegs{})
	require.NoError(t, err)
	d := &fakeDev{mem: ring, l: l}
	d.write(rawEntry{id: 0xbeef, ln: 77}, false)
	d.write(rawEntry{id: 0xcafe, ln: 78}, false)
	var raw decoded
	require.True(t, r.take(&raw))
	require.True(t, r.take(&raw))
	require.EqualValues(t, 0xcafe, raw.ID)
	require.EqualValues(t, 78, raw.Len)
}
