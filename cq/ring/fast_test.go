package ring

import (
	"encoding/binary"
	"fmt"
	"github.com/vfnic/vfnic/cq"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/vfnic/vfnic/doorbell"
)

// The fast path (fast.go) must behave exactly as the generic loop: these
// tests run the same device writes, posts and reads through two CQs, one
// whose source takes the fast path and one forced onto the generic loop,
// and compare everything a caller can see.

func TestFastPathSelection(t *testing.T) {
	conv := conventionLayouts(8)
	cases := []struct {
		name  string
		l     Layout
		codes Codes
		fast  bool
	}{
		{"sim", simLayout(8), simCodes(), true},
		{"nvme: status bit field across bytes", conv[0], Codes{}, false},
		{"mlx5: opcode in the high nibble", conv[1], Codes{}, true},
		{"virtio: id in the ownership word", conv[2], Codes{}, true},
		{"vmxnet3: 12-bit id, 14-bit length", conv[3], Codes{}, true},
		{"e1000e: descriptor done, id is the index", conv[4], Codes{}, false},
		{"status bit field across two bytes", func() Layout { l := simLayout(8); l.Fields.Status = Field{Off: 7, Shift: 5, Bits: 4}; return l }(), simCodes(), false},
		{"id at a bit offset", func() Layout { l := simLayout(8); l.Fields.ID.Shift = 4; l.Fields.ID.Bits = 28; return l }(), simCodes(), false},
		{"length wider than 32 bits", func() Layout { l := simLayout(8); l.Fields.Len.Bits = 40; return l }(), simCodes(), false},
		{"32-bit load past the entry", func() Layout { l := simLayout(8); l.Fields.BufOff = Field{Off: 62, Bits: 16}; return l }(), simCodes(), false},
		{"64-bit load of data past the entry", func() Layout { l := simLayout(8); l.Fields.Data = Field{Off: 60, Bits: 32}; l.OwnerOff = 52; return l }(), simCodes(), false},
		{"32-bit data in the last 8 bytes", func() Layout { l := simLayout(8); l.Fields.Data = Field{Off: 56, Bits: 32}; l.OwnerOff = 52; return l }(), simCodes(), true},
		{"opcode flags use the refuse bit", simLayout(8), Codes{Opcodes: []Opcode{{Value: 1, Flags: 1 << 63}}}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			mem := mmap(t, c.l.Entries*c.l.EntrySize)
			src, err := NewRingSource(RingConfig{Mem: mem, Layout: c.l, Codes: c.codes})
			require.NoError(t, err)
			require.Equal(t, c.fast, src.fast != nil)
			require.NoError(t, src.Attach(cq.FormatMsg))
			if c.fast {
				require.Equal(t, int(cq.FormatMsg-cq.FormatContext)*loopKinds+src.fast.kind, src.fast.sel, "the loop for the format")
			}
		})
	}
}

// diffSide is one of the two CQs of a differential run; generic forces
// its source onto the generic loop.
type diffSide struct {
	c    *cq.CQ
	src  *RingSource
	dev  *fakeDev
	tabs map[uint32]*Table
	cons doorbell.Reg32
	over doorbell.Reg32
	prod doorbell.Reg32 // UsedIndex: the producer index word (control page, byte 20)
}

// diffRun drives a fast and a generic CQ over the same layout with the
// same random device behaviour.
type diffRun struct {
	t      *testing.T
	rng    *rand.Rand
	l      Layout
	codes  Codes
	sides  [2]*diffSide // fast, generic
	queues []uint32     // bound queues
	idBits int
	// The device's view: posted operations it has not completed.
	pending []diffOp
	done    []diffOp // completed ones, for duplicates
	ctx     int
	// What the run exercised, to check it covers what it should.
	good, bad, switches int
	lastWrong           bool
	holes               []uint32 // device counts of wrong-phase entries and skipped positions not yet mended
	// spans: some operations span 2 to maxSpan ring positions (Op.Span),
	// and the device skips the rest of an operation's positions after
	// writing its entry (skip), as virtio's packed ring does.
	spans   bool
	skip    int
	spanned int // entries of such operations written
}

// maxSpan is the most ring positions an operation of a run with spans
// takes.
const maxSpan = 4

type diffOp struct {
	queue uint32
	id    uint32
	len   uint32
	multi bool
	recv  bool
	write bool   // an RMA write: the opcode is WRITE
	used  uint32 // bytes of a multi-receive buffer completed so far
	span  int    // Op.Span
}

// layoutCodes returns codes as a driver of layout l would have them: no
// opcodes when its entries have no opcode field, as every entry would
// then report opcode 0's kind of operation whatever was posted.
func layoutCodes(l Layout, codes Codes) Codes {
	if l.Fields.Opcode.Bits == 0 {
		codes.Opcodes = nil
	}
	return codes
}

func newDiffSide(t *testing.T, l Layout, codes Codes, attr cq.Attr, generic bool) *diffSide {
	codes = layoutCodes(l, codes)
	mem := mmap(t, 4096+l.Entries*l.EntrySize)
	w := doorbell.NewWindow(mem[:4096])
	cons, err := w.Reg32(0)
	require.NoError(t, err)
	over, err := w.Reg32(16)
	require.NoError(t, err)
	regs := RingRegs{Doorbell: doorbell.NewDoorbell(cons), Overrun: over, OverrunMask: 1}
	if l.Convention == UsedIndex {
		regs.Producer, err = w.Reg32(20)
		require.NoError(t, err)
	}
	src, err := NewRingSource(RingConfig{Mem: mem[4096:], Layout: l, Codes: codes, Regs: regs})
	require.NoError(t, err)
	src.Ring().Reset() // no entry looks written on the first lap
	if generic {
		src.fast = nil
	}
	attr.Size = l.Entries
	c, err := cq.New(attr, cq.Limits{MaxSize: 1 << 16})
	require.NoError(t, err)
	require.NoError(t, c.Driver().AddSource(src))
	t.Cleanup(func() { _ = c.Close() })
	return &diffSide{c: c, src: src, dev: &fakeDev{mem: mem[4096:], l: l}, tabs: map[uint32]*Table{}, cons: cons, over: over, prod: regs.Producer}
}

func newDiffRun(t *testing.T, seed uint64, l Layout, codes Codes, attr cq.Attr) *diffRun {
	d := &diffRun{t: t, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), l: l, codes: layoutCodes(l, codes)}
	d.sides[0] = newDiffSide(t, l, codes, attr, false)
	d.sides[1] = newDiffSide(t, l, codes, attr, true)
	require.NotNil(t, d.sides[0].src.fast, "layout %s should take the fast path", l.Name)
	d.idBits = 32
	if l.Fields.ID.Bits < 32 {
		d.idBits = l.Fields.ID.Bits
	}
	d.queues = []uint32{0}
	if l.Fields.Queue.Bits > 0 {
		d.queues = append(d.queues, 1, 3)
	}
	for _, qn := range d.queues {
		d.bind(qn)
	}
	return d
}

// bind gives queue qn a new table of 32 operations on both sides.
func (d *diffRun) bind(qn uint32) {
	for _, s := range d.sides {
		tab, err := NewTable(32, d.idBits)
		require.NoError(d.t, err)
		s.src.UnbindTable(qn)
		require.NoError(d.t, s.src.BindTable(qn, tab))
		s.tabs[qn] = tab
	}
	d.pending = slices.DeleteFunc(d.pending, func(o diffOp) bool { return o.queue == qn })
	d.done = slices.DeleteFunc(d.done, func(o diffOp) bool { return o.queue == qn })
}

// post posts one operation on both sides (same id on both).
func (d *diffRun) post() {
	qn := d.queues[d.rng.IntN(len(d.queues))]
	maxLen := uint64(1)<<min(d.l.Fields.Len.Bits, 12) - 1
	op := Op{Context: d.ctx, Len: 1 + int(d.rng.Uint64N(maxLen)), Buf: uintptr(0x100000 * (1 + d.rng.IntN(100)))}
	d.ctx++
	switch d.rng.IntN(6) {
	case 0:
		op.Flags = cq.FlagSend | cq.FlagMsg
	case 1:
		op.Flags = cq.FlagRMA | cq.FlagWrite
	case 2:
		op.Flags = cq.FlagRecv | cq.FlagMsg
		if d.l.Fields.Flags.Bits > 0 && d.codes.FlagBits[2] == cq.FlagMultiRecv {
			op.Flags |= cq.FlagMultiRecv // the device can release it
		}
	default:
		op.Flags = cq.FlagRecv | cq.FlagMsg
	}
	if d.spans && op.Flags&cq.FlagMultiRecv == 0 && d.rng.IntN(3) == 0 {
		op.Span = 2 + d.rng.IntN(maxSpan-1)
	}
	var ids [2]uint32
	var errs [2]error
	for i, s := range d.sides {
		ids[i], errs[i] = s.tabs[qn].Post(op)
	}
	require.Equal(d.t, errs[0], errs[1])
	if errs[0] != nil {
		require.ErrorIs(d.t, errs[0], ErrFull)
		return
	}
	require.Equal(d.t, ids[0], ids[1], "both tables give the same id")
	d.pending = append(d.pending, diffOp{queue: qn, id: ids[0], len: uint32(op.Len),
		multi: op.Flags&cq.FlagMultiRecv != 0, recv: op.Flags&cq.FlagRecv != 0, write: op.Flags&cq.FlagWrite != 0, span: op.Span})
}

// fits returns a random value that fits f.
func (d *diffRun) fits(f Field) uint64 {
	if f.Bits == 0 {
		return 0
	}
	if f.Bits >= 64 {
		return d.rng.Uint64()
	}
	return d.rng.Uint64() & (1<<uint(f.Bits) - 1)
}

// entry makes the device's next completion: mostly a valid one for a
// pending operation, sometimes one of the ways a device goes wrong. d.skip
// is set to the positions the device skips after it.
func (d *diffRun) entry() (rawEntry, bool) {
	d.skip = 0
	f := d.l.Fields
	e := rawEntry{data: d.fits(f.Data), tag: d.fits(f.Tag), src: d.fits(f.Src), srcValid: d.rng.IntN(2) == 0,
		syndrome: uint32(d.fits(f.Syndrome))}
	// Device flag bits: HAS_DATA, TAGGED and MORE at random, MULTI_RECV
	// when a multi-receive buffer is used up.
	e.flags = uint32(d.fits(f.Flags)) &^ (1 << 2)
	wrong := false
	if len(d.pending) == 0 || d.rng.IntN(24) == 0 {
		// An entry naming no pending operation.
		qn := d.queues[d.rng.IntN(len(d.queues))]
		switch d.rng.IntN(4) {
		case 0:
			e.id = uint32(d.fits(f.ID))
		case 1:
			if len(d.done) > 0 {
				o := d.done[d.rng.IntN(len(d.done))]
				qn, e.id = o.queue, o.id // a duplicate or stale id
			}
		case 2:
			if f.Queue.Bits > 0 {
				qn = 2 // not bound
			}
		case 3:
			// A wrong ownership bit, never twice in a row: a hole is
			// found by the valid entry after it.
			wrong = d.l.DetectHoles && !d.lastWrong
		}
		d.lastWrong = wrong
		e.queue, e.ln = qn, uint32(d.fits(f.Len))&0xff
		e.opcode, e.status = d.goodCodes(diffOp{})
		return e, wrong
	}
	d.lastWrong = false
	k := d.rng.IntN(len(d.pending))
	o := &d.pending[k]
	e.queue, e.id = o.queue, o.id
	e.opcode, e.status = d.goodCodes(*o)
	room := o.len - o.used
	e.ln = uint32(d.rng.Uint64N(uint64(room) + 1))
	if f.BufOff.Bits > 0 {
		e.bufOff = o.used
	}
	release := !o.multi
	if o.multi {
		o.used += e.ln
		if d.rng.IntN(3) == 0 || f.BufOff.Bits == 0 {
			e.flags |= 1 << 2 // MULTI_RECV: the buffer is released
			release = true
		}
	}
	// The ways a valid entry goes wrong (the slot is released all the same;
	// not for a multi-receive buffer, which a success would leave posted).
	switch d.rng.IntN(40) + 40*bool2int(o.multi) {
	case 0:
		e.ln = o.len + 1 + uint32(d.rng.IntN(10)) // more than posted
		if uint64(e.ln) > 1<<min(uint(f.Len.Bits), 32)-1 {
			e.ln = o.len
		}
	case 1:
		if f.BufOff.Bits > 0 {
			e.bufOff = o.len // beyond the buffer
		}
	case 2:
		e.status = uint32(d.fits(f.Status)) // any status: unknown or an error
	case 3:
		e.opcode = uint32(d.fits(f.Opcode)) // any opcode
	}
	if o.span > 1 {
		// Refused or not, the entry completes the operation, and the
		// reader skips its positions.
		d.skip = o.span - 1
		d.spanned++
	}
	if release {
		d.done = append(d.done, *o)
		d.pending = slices.Delete(d.pending, k, k+1)
	}
	return e, false
}

func bool2int(b bool) int {
	if b {
		return 1
	}
	return 0
}

// goodCodes returns an opcode for the kind of operation o is and a status
// the codes define as success.
func (d *diffRun) goodCodes(o diffOp) (opcode, status uint32) {
	if d.codes.Opcodes != nil {
		switch {
		case o.recv && d.rng.IntN(4) == 0:
			opcode = 4 // RECV_RDMA_WITH_IMM: remote CQ data
		case o.recv:
			opcode = 1 // RECV
		case o.write:
			opcode = 2 // WRITE
		default:
			opcode = 0 // SEND
		}
	}
	return opcode, 0
}

// write puts e into both rings, over random bytes where no field is.
func (d *diffRun) write(e rawEntry, wrongPhase bool) {
	if wrongPhase {
		d.holes = append(d.holes, d.sides[0].dev.prod)
	}
	esz := d.l.EntrySize
	junk := make([]byte, esz)
	for i := range junk {
		junk[i] = byte(d.rng.Uint32())
	}
	for _, s := range d.sides {
		pos := int(s.dev.prod%uint32(d.l.Entries)) * esz
		ent := s.dev.mem[pos : pos+esz]
		own := binary.LittleEndian.Uint32(ent[d.l.OwnerOff:])
		copy(ent, junk)
		// The ownership bits keep their value until the device writes them
		// last.
		w := binary.LittleEndian.Uint32(junk[d.l.OwnerOff:])
		binary.LittleEndian.PutUint32(ent[d.l.OwnerOff:], w&^d.l.OwnerMask|own&d.l.OwnerMask)
		s.dev.write(e, wrongPhase)
	}
}

// skipSpan moves the device past the positions after an operation's
// entry (d.skip). It does not write them: they keep the last lap's
// ownership value, not handed over, until mend gives them this lap's
// once the reader has passed them (as a driver posting again rewrites a
// virtio chain's positions).
func (d *diffRun) skipSpan() {
	for range d.skip {
		d.holes = append(d.holes, d.sides[0].dev.prod)
		for _, s := range d.sides {
			s.dev.prod++
		}
	}
	d.skip = 0
}

// mend gives the wrong-phase entries and skipped positions the reader has
// passed the ownership bits of their lap, as if the device had written
// them right: with a one-bit phase, the wrong value is the right one for
// the next lap, and the reader would take the stale entry for a new one.
func (d *diffRun) mend() {
	count := d.sides[0].src.Ring().Count()
	d.holes = slices.DeleteFunc(d.holes, func(prod uint32) bool {
		if int32(count-prod) <= 0 {
			return false
		}
		n := uint32(d.l.Entries)
		for _, s := range d.sides {
			p := (*uint32)(unsafe.Pointer(&s.dev.mem[int(prod%n)*d.l.EntrySize+d.l.OwnerOff]))
			atomic.StoreUint32(p, atomic.LoadUint32(p)&^d.l.OwnerMask|ownValue(d.l, prod/n))
		}
		return true
	})
}

// free is the number of entries the device may write.
func (d *diffRun) free() int {
	s := d.sides[0]
	return d.l.Entries - int(s.dev.prod-s.src.Ring().Count())
}

// read reads both CQs the same way and compares what they return.
func (d *diffRun) read(step int) {
	n := 1 + d.rng.IntN(40)
	var ents [2][]cq.Entry
	var addrs [2][]cq.Addr
	var ns [2]int
	var errs [2]error
	from := d.rng.IntN(8) == 0 // ReadFrom takes the generic loop on both
	probe := d.rng.IntN(16) == 0
	for i, s := range d.sides {
		ents[i] = make([]cq.Entry, n)
		for j := range ents[i] {
			ents[i][j] = cq.Entry{Context: "stale", Flags: 0xdead, Len: -1, Buf: 1, Data: 2, Tag: 3, Queue: 4}
		}
		switch {
		case probe:
			ns[i], errs[i] = s.c.Read(nil)
		case from:
			addrs[i] = make([]cq.Addr, n)
			ns[i], errs[i] = s.c.ReadFrom(ents[i], addrs[i])
		default:
			ns[i], errs[i] = s.c.Read(ents[i])
		}
	}
	msg := fmt.Sprintf("step %d (read of %d)", step, n)
	require.Equal(d.t, errs[1], errs[0], msg)
	require.Equal(d.t, ns[1], ns[0], msg)
	require.Equal(d.t, ents[1], ents[0], msg)
	require.Equal(d.t, addrs[1], addrs[0], msg)
	d.good += ns[0]
	for j := 1; j < ns[0]; j++ {
		if ents[0][j].Queue != ents[0][j-1].Queue {
			d.switches++
		}
	}
	if errs[0] == cq.ErrAvail || d.rng.IntN(8) == 0 {
		var ee [2]cq.ErrEntry
		for i, s := range d.sides {
			errs[i] = s.c.ReadErr(&ee[i])
		}
		require.Equal(d.t, errs[1], errs[0], msg)
		require.Equal(d.t, ee[1], ee[0], msg)
		if errs[0] == nil {
			d.bad++
		}
	}
	for i := range d.sides {
		r := d.sides[i].src.Ring()
		require.Equal(d.t, d.sides[1].src.Ring().Head(), r.Head(), msg)
		require.Equal(d.t, d.sides[1].src.Ring().Count(), r.Count(), msg)
		require.Equal(d.t, d.sides[1].src.Ring().Phase(), r.Phase(), msg)
		require.Equal(d.t, d.sides[1].cons.Read(), d.sides[i].cons.Read(), msg)
	}
	for qn := range d.sides[0].tabs {
		require.Equal(d.t, d.sides[1].tabs[qn].Outstanding(), d.sides[0].tabs[qn].Outstanding(), "%s queue %d", msg, qn)
	}
}

// run does steps random rounds of posts, device writes and reads.
func (d *diffRun) run(steps int) {
	for step := 0; step < steps; step++ {
		for k := d.rng.IntN(16); k > 0; k-- {
			d.post()
		}
		room := 1
		if d.spans {
			room = maxSpan
		}
		for k := d.rng.IntN(32); k > 0 && d.free() > room && (len(d.pending) > 0 || d.rng.IntN(4) == 0); k-- {
			e, wrong := d.entry()
			d.write(e, wrong)
			d.skipSpan()
		}
		// A new table on a queue. Not with spans: the entries of the old
		// table's operations still in the ring would then name nothing,
		// and the reader would not skip what the device skipped after
		// them (it cannot know their span).
		if d.rng.IntN(100) == 0 && len(d.queues) > 1 && !d.spans {
			d.bind(d.queues[1+d.rng.IntN(len(d.queues)-1)])
		}
		for k := 1 + d.rng.IntN(4); k > 0; k-- {
			d.read(step)
			d.mend()
		}
	}
	// The end: an overrun, after which both drain and turn fatal alike.
	for _, s := range d.sides {
		s.over.Write(1)
	}
	for step := steps; step < steps+100; step++ {
		d.read(step)
		n0, err0 := d.sides[0].c.Read(make([]cq.Entry, 1))
		n1, err1 := d.sides[1].c.Read(make([]cq.Entry, 1))
		require.Equal(d.t, n1, n0)
		require.Equal(d.t, err1, err0)
		if err0 == cq.ErrOverrun {
			return
		}
	}
	d.t.Fatal("no overrun after the ring drained")
}

// fastLayouts are layouts that take the fast path, with every kind of
// field it handles: 8- to 32-bit words, absent fields, code fields that
// are whole bytes or bit fields, ids in the ownership word, and every
// flipping convention.
func fastLayouts(entries int) []Layout {
	conv := conventionLayouts(entries)
	narrow := simLayout(entries)
	narrow.Name = "narrow"
	narrow.Fields = Fields{
		ID: Field{Off: 1, Bits: 12}, Queue: Field{Off: 5, Bits: 8}, Opcode: Field{Off: 9, Shift: 5, Bits: 3},
		Status: Field{Off: 9, Shift: 0, Bits: 4}, Len: Field{Off: 10, Bits: 14}, Flags: Field{Off: 14, Shift: 2, Bits: 5},
		Data: Field{Off: 17, Bits: 32}, Tag: Field{Off: 27, Bits: 48}, BufOff: Field{Off: 40, Bits: 16},
		Syndrome: Field{Off: 44, Bits: 24},
	}
	sparse := simLayout(entries)
	sparse.Name = "sparse"
	sparse.Convention, sparse.OwnerOff, sparse.OwnerMask, sparse.InitPhase = GenerationBit, 0, 1<<3, 0
	sparse.Fields = Fields{ID: Field{Off: 48, Bits: 16}, Len: Field{Off: 8, Bits: 32}}
	owner := simLayout(entries)
	owner.Name = "owner-index"
	owner.Convention, owner.InitPhase = OwnerIndex, 0
	wide := Layout{Name: "wide", EntrySize: 32, Entries: entries, Convention: GenerationBit,
		OwnerOff: 28, OwnerMask: 1 << 7, InitPhase: 1, DetectHoles: true, Doorbell: DoorbellHead,
		Fields: Fields{
			Data: Field{Off: 0, Bits: 64}, ID: Field{Off: 8, Bits: 32}, Len: Field{Off: 12, Bits: 32},
			BufOff: Field{Off: 16, Bits: 32}, Queue: Field{Off: 20, Bits: 16}, Opcode: Field{Off: 22, Bits: 8},
			Status: Field{Off: 23, Shift: 4, Bits: 4}, Flags: Field{Off: 24, Bits: 8},
		},
	}
	return []Layout{simLayout(entries), narrow, sparse, owner, wide, conv[1], conv[2], conv[3]}
}

// diffSteps is the number of rounds of a differential run.
func diffSteps(n int) int {
	if raceEnabled {
		return n / 3
	}
	return n
}

// withShapes runs f with the shape copies of the loops on and off: the
// rings of a known shape then run through both copies.
func withShapes(t *testing.T, f func(t *testing.T)) {
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprintf("shapes=%v", on), func(t *testing.T) {
			useShapes = on
			defer func() { useShapes = true }()
			f(t)
		})
	}
}

// TestShapeLoops: the layouts that mirror the drivers' take the copies
// made for their shape, for every format; a layout that differs in one
// offset, or a ring whose codes add flags, takes the kind's copy.
func TestShapeLoops(t *testing.T) {
	packed, moved := conventionLayouts(8)[2], simLayout(8)
	moved.Fields.Tag.Off += 4
	for _, c := range []struct {
		l     Layout
		codes Codes
		want  string
	}{
		{simLayout(8), simCodes(), "Sim"},
		{packed, Codes{}, "Masked"},
		{splitLayout(8), Codes{}, "Masked"},
		{moved, simCodes(), "Natural"},
		{packed, Codes{Opcodes: []Opcode{{Value: 0, Flags: cq.FlagSend}}}, "Masked"},
	} {
		for _, f := range []cq.Format{cq.FormatContext, cq.FormatMsg, cq.FormatData, cq.FormatTagged} {
			mem := mmap(t, 4+c.l.Entries*c.l.EntrySize)
			cfg := RingConfig{Mem: mem[4:], Layout: c.l, Codes: c.codes}
			if c.l.Convention == UsedIndex {
				var err error
				cfg.Regs.Producer, err = doorbell.NewWindow(mem[:4]).Reg32(0)
				require.NoError(t, err)
			}
			src, err := NewRingSource(cfg)
			require.NoError(t, err)
			require.NoError(t, src.Attach(f))
			fname := map[cq.Format]string{cq.FormatContext: "Context", cq.FormatMsg: "Msg", cq.FormatData: "Data", cq.FormatTagged: "Tagged"}[f]
			require.Equal(t, "readPhase"+fname+c.want, src.Loop(), c.l.Name)
		}
	}
	l := conventionLayouts(8)[4] // descriptor done: the generic loop
	src, err := NewRingSource(RingConfig{Mem: mmap(t, l.Entries*l.EntrySize), Layout: l})
	require.NoError(t, err)
	require.Equal(t, "generic", src.Loop())
}

func TestFastPathMatchesGeneric(t *testing.T) { withShapes(t, testFastPathMatchesGeneric) }

func testFastPathMatchesGeneric(t *testing.T) {
	formats := []cq.Format{cq.FormatContext, cq.FormatMsg, cq.FormatData, cq.FormatTagged}
	steps := diffSteps(300)
	for li, l := range fastLayouts(32) {
		for _, codes := range []Codes{simCodes(), {}} {
			for _, f := range formats {
				name := fmt.Sprintf("%s/%s/codes=%v", l.Name, f, codes.Statuses != nil)
				t.Run(name, func(t *testing.T) {
					d := newDiffRun(t, uint64(li*100+int(f)), l, codes, cq.Attr{Format: f})
					require.Equal(t, l.Name == "test64" || l.Name == "owner-index" || l.Name == "wide",
						baseKind(d.sides[0].src.fast) == loopNatural, "natural widths")
					d.run(steps)
					require.Greater(t, d.good, 4*steps, "successful completions")
					require.Greater(t, d.bad, steps/3, "error completions")
					if len(d.queues) > 1 {
						require.Greater(t, d.switches, steps, "changes of queue within a read")
					}
				})
			}
		}
	}
}

// TestFastPathMatchesGenericSpans: operations that span several ring
// positions (Op.Span, a virtio packed-ring chain) are read alike, the ring
// skipping the rest of each after its entry. The fast loops step one
// position per entry; they leave such an entry to take.
func TestFastPathMatchesGenericSpans(t *testing.T) {
	steps := diffSteps(200)
	for li, l := range fastLayouts(32) {
		for _, codes := range []Codes{simCodes(), {}} {
			for _, f := range []cq.Format{cq.FormatContext, cq.FormatTagged} {
				t.Run(fmt.Sprintf("%s/%s/codes=%v", l.Name, f, codes.Statuses != nil), func(t *testing.T) {
					d := newDiffRun(t, uint64(li*100+int(f)), l, codes, cq.Attr{Format: f})
					d.spans = true
					d.run(steps)
					require.Greater(t, d.good, 4*steps, "successful completions")
					require.Greater(t, d.bad, steps/3, "error completions")
					require.Greater(t, d.spanned, steps/2, "entries of operations spanning positions")
				})
			}
		}
	}
}

func TestFastPathMatchesGenericRandomLayouts(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	steps := diffSteps(150)
	for i := 0; i < 30; i++ {
		l := randomFastLayout(rng, 16)
		f := cq.Format(1 + rng.IntN(4))
		codes := simCodes()
		if rng.IntN(3) == 0 {
			codes = Codes{FlagBits: codes.FlagBits}
		}
		t.Run(fmt.Sprintf("%d/%s", i, f), func(t *testing.T) {
			t.Logf("layout %+v", l)
			d := newDiffRun(t, uint64(i), l, codes, cq.Attr{Format: f})
			d.run(steps)
			require.Greater(t, d.good, 2*steps, "successful completions")
			require.Greater(t, d.bad, steps/10, "error completions")
		})
	}
}

// randomFastLayout places the fields of a layout the fast path takes at
// random byte positions of a 32- or 64-byte entry, with random widths.
func randomFastLayout(rng *rand.Rand, entries int) Layout {
	esz := 32 + 32*rng.IntN(2)
	l := Layout{Name: "random", EntrySize: esz, Entries: entries, Convention: PhaseBit,
		OwnerOff: esz - 4, OwnerMask: 1 << uint(rng.IntN(32)), InitPhase: uint32(rng.IntN(2)),
		DetectHoles: rng.IntN(2) == 0, Doorbell: DoorbellCount}
	switch rng.IntN(4) {
	case 1:
		l.Convention, l.InitPhase = OwnerIndex, 0
	case 2:
		l.Convention, l.DetectHoles = PackedWrap, false
		l.OwnerMask |= 1 << uint(rng.IntN(32))
	case 3:
		l.Convention = GenerationBit
	}
	used := make([]bool, esz-4)
	place := func(bytes int) (int, bool) {
		for try := 0; try < 20; try++ {
			off := rng.IntN(len(used) - bytes + 1)
			if !slices.Contains(used[off:off+bytes], true) {
				for i := off; i < off+bytes; i++ {
					used[i] = true
				}
				return off, true
			}
		}
		return 0, false
	}
	word := func(widths []int, optional bool) Field {
		if optional && rng.IntN(4) == 0 {
			return Field{}
		}
		bits := widths[rng.IntN(len(widths))]
		off, ok := place((bits + 7) / 8)
		if !ok {
			return Field{}
		}
		return Field{Off: off, Bits: bits}
	}
	code := func(minBits int) Field {
		if rng.IntN(4) == 0 {
			return Field{}
		}
		bits := minBits + rng.IntN(9-minBits)
		off, ok := place(1)
		if !ok {
			return Field{}
		}
		return Field{Off: off, Shift: rng.IntN(9 - bits), Bits: bits}
	}
	f := &l.Fields
	f.ID = word([]int{12, 16, 24, 32}, false)
	f.Len = word([]int{14, 16, 24, 32}, false)
	f.Queue = word([]int{8, 16, 32}, true)
	f.BufOff = word([]int{16, 32}, true)
	f.Status = code(3)
	f.Opcode = code(3)
	f.Flags = code(4)
	f.Data = word([]int{32, 64}, true)
	f.Tag = word([]int{40, 64}, true)
	f.Syndrome = word([]int{16, 32}, true)
	if f.ID.Bits == 0 || f.Len.Bits == 0 { // no room: a plain layout
		return simLayout(entries)
	}
	return l
}

// TestFastPathTableChanges checks that the fast path notices a table
// unbound or replaced between reads: it keeps the last table it used.
func TestFastPathTableChanges(t *testing.T) {
	h := newHarness(t, cq.Attr{Format: cq.FormatData}, 16, 4)
	require.NotNil(t, h.src.fast)
	ents := make([]cq.Entry, 4)
	id := h.post("a", 64, cq.FlagRecv|cq.FlagMsg)
	h.complete(rawEntry{id: id, opcode: 1, ln: 10})
	n, err := h.c.Read(ents)
	require.NoError(t, err)
	require.Equal(t, 1, n)

	h.src.UnbindTable(h.queue)
	h.complete(rawEntry{id: h.post("b", 64, cq.FlagRecv|cq.FlagMsg), opcode: 1, ln: 10})
	_, err = h.c.Read(ents)
	require.ErrorIs(t, err, cq.ErrAvail)
	var ee cq.ErrEntry
	require.NoError(t, h.c.ReadErr(&ee))
	require.Equal(t, cq.ProvBadQueue, ee.ProvErrno, "the unbound queue is refused")

	tab2, err := NewTable(4, 32)
	require.NoError(t, err)
	require.NoError(t, h.src.BindTable(h.queue, tab2))
	id2, err := tab2.Post(Op{Context: "c", Len: 64, Flags: cq.FlagRecv | cq.FlagMsg})
	require.NoError(t, err)
	h.complete(rawEntry{id: id2, opcode: 1, ln: 20})
	n, err = h.c.Read(ents)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, "c", ents[0].Context, "completed through the new table")
	require.Zero(t, tab2.Outstanding())
}

// TestFastPathAllocs checks that the fast loops, for every format and for
// natural and masked fields, allocate nothing, also when consecutive
// entries name different queues (tables).
func TestFastPathAllocs(t *testing.T) {
	ls := fastLayouts(1024)
	for _, l := range []Layout{ls[0], ls[1]} { // natural, masked
		for _, f := range []cq.Format{cq.FormatContext, cq.FormatMsg, cq.FormatData, cq.FormatTagged} {
			t.Run(fmt.Sprintf("%s/%s", l.Name, f), func(t *testing.T) {
				s := newDiffSide(t, l, simCodes(), cq.Attr{Format: f}, false)
				require.NotNil(t, s.src.fast)
				var tabs [2]*Table
				for qn := range tabs {
					tab, err := NewTable(1024, 32)
					require.NoError(t, err)
					require.NoError(t, s.src.BindTable(uint32(qn), tab))
					tabs[qn] = tab
				}
				ctx := any("ctx")
				for i := 0; i < 1000; i++ {
					qn := uint32(i/3) % 2 // a change of queue every third entry
					id, err := tabs[qn].Post(Op{Context: ctx, Len: 100, Flags: cq.FlagRecv | cq.FlagMsg})
					require.NoError(t, err)
					s.dev.write(rawEntry{id: id, queue: qn, opcode: 1, ln: 64, flags: 1, data: uint64(i)}, false)
				}
				ents := make([]cq.Entry, 8)
				require.Zero(t, testing.AllocsPerRun(100, func() {
					if n, err := s.c.Read(ents); err != nil || n != len(ents) {
						t.Fatalf("read %d: %v", n, err)
					}
				}))
			})
		}
	}
}

// BenchmarkReadTwoQueues is BenchmarkReadFilledRing with completions of two
// queues (a send and a receive queue, as cq/qpsim binds them) alternating
// entry by entry: the worst case for the fast path's table cursor.
func BenchmarkReadTwoQueues(b *testing.B) {
	const lap = 4096
	l := simLayout(lap)
	mem := mmap(b, lap*64)
	src, err := NewRingSource(RingConfig{Mem: mem, Layout: l, Codes: simCodes()})
	if err != nil {
		b.Fatal(err)
	}
	c, err := cq.New(cq.Attr{Size: lap, Format: cq.FormatData}, cq.Limits{MaxSize: lap})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	if err := c.Driver().AddSource(src); err != nil {
		b.Fatal(err)
	}
	var tabs [2]*Table
	for qn := range tabs {
		if tabs[qn], err = NewTable(lap, 32); err != nil {
			b.Fatal(err)
		}
		if err := src.BindTable(uint32(qn), tabs[qn]); err != nil {
			b.Fatal(err)
		}
	}
	dev := &fakeDev{mem: mem, l: l}
	ctxs := make([]any, lap)
	for i := range ctxs {
		ctxs[i] = i
	}
	benchLaps(b, c, lap, func() {
		for i := 0; i < lap; i++ {
			qn := uint32(i % 2)
			id, err := tabs[qn].Post(Op{Context: ctxs[i], Len: 1500, Flags: cq.FlagRecv | cq.FlagMsg})
			if err != nil {
				b.Fatal(err)
			}
			dev.write(rawEntry{id: id, queue: qn, opcode: 1, ln: 64}, false)
		}
	})
}
