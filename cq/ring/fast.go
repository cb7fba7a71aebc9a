package ring

import (
	"github.com/vfnic/vfnic/cq"
	"math/bits"
	"sync/atomic"
	"unsafe"
)

// The fast path: RingSource.Poll for a Read, specialised once, when the
// source is made and when it joins its CQ, so that the loop run per entry
// does no work the layout and the CQ's format do not need. The generic
// loop (pollGeneric) decodes any Layout; it serves ReadFrom, ReadErr and
// the layouts the fast path does not take, and it is the reference the
// fast path is tested against (fast_test.go): both accept and refuse the
// same entries and produce the same completions, error completions and
// ring, doorbell and table state.
//
// A layout takes the fast path (compilePlan) when the ring has neither
// IDIsIndex nor the DescriptorDone convention, whose per-entry branches
// the loop leaves out, and when every field the loop reads is byte-aligned
// and can be read with one load and a mask, no shift: the id, queue,
// length and buffer offset with a 32-bit load, the data and tag with a
// 64-bit one, and the status, opcode and flags from a single byte each.
//
// What it saves per entry, against the generic loop:
//   - field offsets and masks are read from one struct behind one pointer
//     (fastPath), not spilled and reloaded as two dozen locals, and with no
//     variable shift; when the id, length, buffer offset and data have
//     natural widths (32, 32, 32 and 64 bits), no mask at all;
//   - the status, opcode and flag bytes index 256-entry tables that have
//     the field's shift and width, and the unknown-or-failed test, built in;
//   - the posted-operation table's completer state is held by a cursor and
//     looked up again only when an entry names another queue;
//   - the ring is read in segments that end at its end, with no wrap test
//     per entry;
//   - the CQ's format and the field widths are type parameters, so each
//     combination is a loop of its own, in which fields outside the format
//     are stored as constant zeros rather than masked.

// word32 is a field the fast path reads with a 32-bit load and a mask.
type word32 struct {
	off  int // from the ownership word (fastPlan.rebase)
	mask uint32
}

// word64 is a field the fast path reads with a 64-bit load and a mask.
type word64 struct {
	off  int // from the ownership word (fastPlan.rebase)
	mask uint64
}

// fastPlan is how the fast path decodes an entry. An absent field has a
// zero mask, so it reads as 0 as in the generic loop; an absent code field
// reads byte 0 through a table that gives every value the meaning of 0.
type fastPlan struct {
	id, queue, ln, bufOff word32
	data, tag             word64
	// Offsets of the status, opcode and flags bytes; the tables
	// (fastPath.status, op, bits) are indexed by the whole byte.
	st, op, fl int
}

// byteCode is a code field (status, opcode, flags) that lies in one byte.
type byteCode struct {
	off   int
	shift uint
	mask  uint64
}

// value extracts the field from the whole byte b.
func (c byteCode) value(b int) uint64 { return uint64(b) >> c.shift & c.mask }

// compilePlan returns the fast path's plan for l and its code fields, or
// false when the layout needs the generic loop.
func compilePlan(l *Layout) (p fastPlan, st, op, fl byteCode, ok bool) {
	if l.IDIsIndex || l.Convention == DescriptorDone || l.Convention == UsedIndex {
		return fastPlan{}, st, op, fl, false
	}
	f, esz := &l.Fields, l.EntrySize
	var oks [9]bool
	p.id, oks[0] = planWord32(f.ID, esz)
	p.queue, oks[1] = planWord32(f.Queue, esz)
	p.ln, oks[2] = planWord32(f.Len, esz)
	p.bufOff, oks[3] = planWord32(f.BufOff, esz)
	p.data, oks[4] = planWord64(f.Data, esz)
	p.tag, oks[5] = planWord64(f.Tag, esz)
	st, oks[6] = planByte(f.Status)
	op, oks[7] = planByte(f.Opcode)
	fl, oks[8] = planByte(f.Flags)
	for _, o := range oks {
		if !o {
			return fastPlan{}, st, op, fl, false
		}
	}
	p.st, p.op, p.fl = st.off, op.off, fl.off
	return p, st, op, fl, true
}

// planWord32 compiles a field for a 32-bit load at its first byte: it must
// start on a byte boundary and end within 32 bits and within the entry.
func planWord32(f Field, esz int) (word32, bool) {
	if f.Bits == 0 {
		return word32{}, true
	}
	off := f.Off + f.Shift/8
	if f.Shift%8 != 0 || f.Bits > 32 || off+4 > esz {
		return word32{}, false
	}
	return word32{off: off, mask: uint32(uint64(1)<<uint(f.Bits) - 1)}, true
}

// planWord64 compiles a field for a 64-bit load at its first byte.
func planWord64(f Field, esz int) (word64, bool) {
	if f.Bits == 0 {
		return word64{}, true
	}
	off := f.Off + f.Shift/8
	if f.Shift%8 != 0 || off+8 > esz {
		return word64{}, false
	}
	mask := ^uint64(0)
	if f.Bits < 64 {
		mask = 1<<uint(f.Bits) - 1
	}
	return word64{off: off, mask: mask}, true
}

// planByte compiles a code field that lies within one byte; the table
// indexed by that byte applies the field's shift and width, so a bit field
// costs no more than a whole byte.
func planByte(f Field) (byteCode, bool) {
	if f.Bits == 0 {
		return byteCode{}, true
	}
	if f.Shift%8+f.Bits > 8 {
		return byteCode{}, false
	}
	return byteCode{off: f.Off + f.Shift/8, shift: uint(f.Shift % 8), mask: 1<<uint(f.Bits) - 1}, true
}

// rebase makes the plan's offsets relative to byte own of the entry, the
// ownership word, which is where the loop holds its pointer.
func (p *fastPlan) rebase(own int) {
	for _, off := range []*int{&p.id.off, &p.queue.off, &p.ln.off, &p.bufOff.off,
		&p.data.off, &p.tag.off, &p.st, &p.op, &p.fl} {
		*off -= own
	}
}

// fastPath is a RingSource's fast path: everything its per-entry loop
// reads, behind one pointer. The loop stores into ents and into the slots,
// which the compiler cannot tell apart from this memory, so it loads these
// values again for each entry; a load from here folds into the instruction
// that uses it, which costs less than the spills and reloads of as many
// locals.
type fastPath struct {
	format  cq.Format // the CQ's (Attach); 0 before, which reads like FormatContext
	natural bool      // the id, length, buffer offset and data have natural widths

	// The ring, as Ring has it. The loop steps from ownership word to
	// ownership word: base+own, then esz apart.
	base     unsafe.Pointer
	esz, own uintptr
	omask    uint32
	want     uint32 // Ring.want for the segment being read

	plan fastPlan
	cur  tableCursor
	src  *RingSource // for tableCursor.enter
	tabs []*Table    // the tables bound for the batch being read

	// By the whole byte of the status, opcode and flags fields: the
	// opcode's flags and the device flag bits as the generic loop has
	// them, with refuse set for an unknown opcode and for a status that
	// is not a known success, so that one test covers both.
	status [256]cq.Flags // 0 or refuse
	op     [256]cq.Flags
	bits   [256]cq.Flags
}

// refuse marks an unknown opcode or a failed status in fastPath's tables.
// No libfabric completion flag uses bit 63; a source whose codes do keeps
// the generic loop.
const refuse cq.Flags = 1 << 63

// newFastPath returns the fast path of source q over ring r, or nil when
// the layout or the codes need the generic loop. q's code tables must be
// built.
func newFastPath(q *RingSource, r *Ring) *fastPath {
	plan, st, op, fl, ok := compilePlan(&r.l)
	if !ok {
		return nil
	}
	plan.rebase(int(r.own))
	f := &r.l.Fields
	fp := &fastPath{base: r.base, esz: r.esz, own: r.own, omask: r.mask, plan: plan,
		cur: tableCursor{queue: noQueue}, src: q,
		natural: f.ID.Bits == 32 && f.Len.Bits == 32 && f.BufOff.Bits == 32 && f.Data.Bits == 64}
	for b := range 256 {
		if sc := q.stat[st.value(b)]; !sc.known || sc.err != 0 {
			fp.status[b] = refuse
		}
		oc := q.op[op.value(b)]
		fp.op[b] = oc.flags
		if !oc.known {
			fp.op[b] |= refuse
		}
		fp.bits[b] = q.bits[fl.value(b)]
		if (oc.flags|fp.bits[b])&refuse != 0 {
			return nil
		}
	}
	return fp
}

// setFormat records the CQ's format (Attach), which picks the loop.
func (fp *fastPath) setFormat(f cq.Format) { fp.format = f }

// The CQ formats as types, for fastRun's first type parameter. Their sizes
// differ, so each is compiled separately, and unsafe.Sizeof of the
// parameter, which tells them apart, is a constant in each.
type (
	shapeContext uint8  // FormatContext
	shapeMsg     uint16 // FormatMsg
	shapeData    uint32 // FormatData
	shapeTagged  uint64 // FormatTagged
)

type formatShape interface {
	shapeContext | shapeMsg | shapeData | shapeTagged
}

// The field widths as types, for fastRun's second type parameter: natural
// when the id, length and buffer offset are 32-bit fields and the data a
// 64-bit one, read with plain loads; masked for the other layouts. A mask
// costs a load and an AND per field, which is measurable per entry.
type (
	wordsMasked  uint8
	wordsNatural uint16
)

type wordsShape interface {
	wordsMasked | wordsNatural
}

// run calls the loop compiled for the source's format and field widths on
// the count entries from first, and returns how many it moved and why it
// stopped. The switch is cheaper than a call through a function value,
// which for a generic function goes through a wrapper.
func (fp *fastPath) run(first *cq.Entry, count int, eoff uintptr) (int, int) {
	var at *cq.Entry
	var why int
	switch {
	case fp.natural && fp.format == cq.FormatData:
		at, why = fastRun[shapeData, wordsNatural](fp, first, count, eoff)
	case fp.natural && fp.format == cq.FormatMsg:
		at, why = fastRun[shapeMsg, wordsNatural](fp, first, count, eoff)
	case fp.natural && fp.format == cq.FormatTagged:
		at, why = fastRun[shapeTagged, wordsNatural](fp, first, count, eoff)
	case fp.natural:
		at, why = fastRun[shapeContext, wordsNatural](fp, first, count, eoff)
	case fp.format == cq.FormatData:
		at, why = fastRun[shapeData, wordsMasked](fp, first, count, eoff)
	case fp.format == cq.FormatMsg:
		at, why = fastRun[shapeMsg, wordsMasked](fp, first, count, eoff)
	case fp.format == cq.FormatTagged:
		at, why = fastRun[shapeTagged, wordsMasked](fp, first, count, eoff)
	default:
		at, why = fastRun[shapeContext, wordsMasked](fp, first, count, eoff)
	}
	if why == runFull {
		return count, why
	}
	// The loop stopped at the entry at, which it did not consume. (It
	// returns a pointer rather than the count, so that first and count need
	// not stay live through it.)
	return int((uintptr(unsafe.Pointer(at)) - uintptr(unsafe.Pointer(first))) / unsafe.Sizeof(cq.Entry{})), why
}

// pollFast is RingSource.Poll for a Read on a source with a fast path, when
// no error entry is staged and the ring did not overrun. It moves up to
// len(ents) completions into ents as the generic loop does: the same checks
// in the same order, the same stop at the first entry that is not
// driver-owned or that is refused (left at the head for endBatch to
// stage), the same end of batch.
//
// The per-entry loop (fastRun) runs over segments of ents that end at the
// end of the ring, so that it has no wrap test; this loop wraps the ring.
func (q *RingSource) pollFast(ents []cq.Entry) (int, State) {
	fp := q.fast
	tabs := *q.tables.Load()
	fp.tabs = tabs
	r := q.ring
	fp.cur.resume(tabs)
	n, why := 0, runFull
	for n < len(ents) {
		fp.want = r.want
		var k int
		k, why = fp.run(&ents[n], min(len(ents)-n, int(r.n-r.head)), uintptr(r.head)*fp.esz)
		n += k
		r.head += uint32(k)
		r.count += uint32(k)
		if r.head == r.n {
			r.head = 0
			r.want ^= r.mask
		}
		if why != runFull {
			break
		}
	}
	fp.cur.leave(q)
	return q.endBatch(n, why == runStopped, why == runFailed, tabs)
}

// Why fastRun returned.
const (
	runFull    = iota // it filled its segment
	runStopped        // the next entry is not driver-owned
	runFailed         // the next entry is refused
)

// noQueue is a queue number no table is bound to (BindTable refuses
// maxQueue and up).
const noQueue = ^uint32(0)

// tableCursor is the posted-operation table fastRun completes into, with
// the completer's state of the table (Table.lookup, Table.release) copied
// out. It is kept from batch to batch and checked against the bound tables
// at the start of each.
type tableCursor struct {
	queue uint32 // the queue of t (noQueue: none)
	t     *Table // nil when queue is not bound
	slots []slot // t.slots; nil when t is nil, so that every id is refused
	smask uint32 // t.slotMask
	qmask uint32 // t.qmask
	freeq *uint32
	ftl   uint32 // t.ftailLocal, advanced by releases
}

// resume starts a batch: since the last one, the table may have been
// unbound or replaced, and the generic loop may have released ids into it.
func (c *tableCursor) resume(tabs []*Table) {
	if c.queue < uint32(len(tabs)) && c.t != nil && tabs[c.queue] == c.t {
		c.ftl = c.t.ftailLocal
		return
	}
	*c = tableCursor{queue: noQueue}
}

// enter leaves the current table and takes the one bound to queue qn
// (none, when no table is). Once per change of queue.
func (c *tableCursor) enter(q *RingSource, tabs []*Table, qn uint32) {
	c.leave(q)
	*c = tableCursor{queue: qn, t: tableFor(tabs, qn)}
	if t := c.t; t != nil {
		c.slots, c.smask, c.qmask, c.ftl = t.slots, t.slotMask, t.qmask, t.ftailLocal
		c.freeq = unsafe.SliceData(t.freeq)
	}
}

// leave stores the free-queue tail back into the table and lists the table
// for the flush at the end of the batch when ids were released.
func (c *tableCursor) leave(q *RingSource) {
	t := c.t
	if t == nil || c.ftl == t.ftailLocal {
		return
	}
	t.ftailLocal = c.ftl
	if !t.dirty {
		q.markDirty(t)
	}
}

// fastRun is the per-entry loop of pollFast. It fills the count (at least
// 1) entries from first, reading the ring from byte eoff, and does not
// reach past the end of the ring. It returns why it stopped and, unless it
// filled them all, the entry it stopped at. Each entry: the ownership word
// loaded atomically, then the queue, the id against the posted slot, the
// status, opcode and length; then the completion, and the slot's release.
//
// It is not inlined, so that each compiled loop has the registers to
// itself.
//
//go:noinline
func fastRun[F formatShape, W wordsShape](fp *fastPath, first *cq.Entry, count int, eoff uintptr) (*cq.Entry, int) {
	var format F
	var words W
	fsize := unsafe.Sizeof(format)   // 1, 2, 4, 8: context, msg, data, tagged
	nat := unsafe.Sizeof(words) == 2 // wordsNatural
	c := &fp.cur
	ftl := c.ftl
	why := runFull
	// ow points at the entry's ownership word, the fields at offsets from
	// it; neither it nor ent ever points past the ring or past ents, as
	// the test for the last entry comes before the steps.
	ow := unsafe.Add(fp.base, eoff+fp.own)
	ent := first
	last := (*cq.Entry)(unsafe.Add(unsafe.Pointer(first), uintptr(count-1)*unsafe.Sizeof(cq.Entry{})))
run:
	for {
		// The inner loop reads entries of the cursor's queue; an entry of
		// another queue leaves it, so that the change of tables, a call,
		// sits outside the loop's straight path.
		for {
			if (atomic.LoadUint32((*uint32)(ow))^fp.want)&fp.omask != 0 {
				why = runStopped
				break run
			}
			if load32(ow, fp.plan.queue) != c.queue {
				break
			}
			// An unbound queue has no slots: the entry is refused here,
			// and stageHead tells a bad queue from a bad id.
			id := word(ow, fp.plan.id, nat)
			si := int(id & c.smask)
			if si >= len(c.slots) {
				why = runFailed
				break run
			}
			s := &c.slots[si]
			if atomic.LoadUint32(&s.state) != slotPosted || s.id != id {
				why = runFailed
				break run
			}
			codes := fp.status[code(ow, fp.plan.st)] | fp.op[code(ow, fp.plan.op)]
			ln, off := word(ow, fp.plan.ln, nat), word(ow, fp.plan.bufOff, nat)
			if codes&refuse != 0 || !fits(ln, off, s.len) {
				why = runFailed
				break run
			}
			fl := entryFlags(s.flags | codes | fp.bits[code(ow, fp.plan.fl)])
			// Fields outside the format stay zero (constants once
			// compiled).
			var eFlags cq.Flags
			var eLen int
			var eBuf uintptr
			var eData, eTag uint64
			if fsize >= 2 { // FormatMsg and up
				eFlags, eLen = fl, int(ln)
			}
			if fsize >= 4 { // FormatData and up
				if fl&cq.FlagRecv != 0 {
					eBuf = s.buf + uintptr(off)
				}
				if fl&cq.FlagRemoteCQData != 0 {
					eData = dword(ow, fp.plan.data, nat)
				}
			}
			if fsize >= 8 && fl&(cq.FlagTagged|cq.FlagRecv) == cq.FlagTagged|cq.FlagRecv {
				eTag = load64(ow, fp.plan.tag)
			}
			ent.Context = s.ctx
			ent.Flags, ent.Len, ent.Buf, ent.Data, ent.Tag = eFlags, eLen, eBuf, eData, eTag
			ent.Queue = c.queue
			if !s.multi || fl&cq.FlagMultiRecv != 0 {
				// Table.release with the table's state in the cursor.
				// The free queue holds qmask+1 ids, so the index is in
				// range.
				s.ctx = nil
				s.state = slotFree
				*(*uint32)(unsafe.Add(unsafe.Pointer(c.freeq), uintptr(ftl&c.qmask)*4)) = s.id & c.smask // si
				ftl++
			}
			if ent == last {
				c.ftl = ftl
				return last, runFull
			}
			ow = unsafe.Add(ow, fp.esz)
			ent = (*cq.Entry)(unsafe.Add(unsafe.Pointer(ent), unsafe.Sizeof(cq.Entry{})))
		}
		// The entry at ow names another queue: take its table, then read
		// the entry again from the top.
		c.ftl = ftl
		c.enter(fp.src, fp.tabs, load32(ow, fp.plan.queue))
		ftl = c.ftl
	}
	c.ftl = ftl
	return ent, why
}

// word reads a 32-bit field: a plain load when the fields have natural
// widths, else masked. natural is a constant where fastRun calls it, so
// only one of the two is compiled there.
func word(ow unsafe.Pointer, w word32, natural bool) uint32 {
	if natural {
		return le32(*(*uint32)(unsafe.Add(ow, w.off)))
	}
	return load32(ow, w)
}

// dword reads a 64-bit field as word does.
func dword(ow unsafe.Pointer, w word64, natural bool) uint64 {
	if natural {
		return le64(*(*uint64)(unsafe.Add(ow, w.off)))
	}
	return load64(ow, w)
}

// load32 reads the 32-bit word at ow+w.off, masked.
func load32(ow unsafe.Pointer, w word32) uint32 {
	return le32(*(*uint32)(unsafe.Add(ow, w.off))) & w.mask
}

// load64 reads the 64-bit word at ow+w.off, masked.
func load64(ow unsafe.Pointer, w word64) uint64 {
	return le64(*(*uint64)(unsafe.Add(ow, w.off))) & w.mask
}

// code reads the byte at ow+off.
func code(ow unsafe.Pointer, off int) uint8 { return *(*uint8)(unsafe.Add(ow, off)) }

// le32 turns a little-endian value as loaded into the host's order.
func le32(v uint32) uint32 {
	if bigEndian {
		return bits.ReverseBytes32(v)
	}
	return v
}

// le64 turns a little-endian value as loaded into the host's order.
func le64(v uint64) uint64 {
	if bigEndian {
		return bits.ReverseBytes64(v)
	}
	return v
}
