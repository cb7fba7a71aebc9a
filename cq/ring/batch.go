package ring

import (
	"math/bits"
	"sync/atomic"
	"unsafe"
)

// The drivers' batch read (NextBatch): the loop a NIC driver runs over
// its own ring, for the layouts of one queue per ring whose entries carry
// no more than an id, a length, a status and the driver's Meta words
// (virtio's packed ring and split used ring, igb's write-back
// descriptors). It takes the common entry (driver-owned, naming an
// operation outstanding in one ring position, a known success status, a
// length within the posted buffer) with no call and no branch on fields
// the layout lacks; every other entry (refused, spanning several
// positions, a hole, a used index beyond the limit) is handed to take,
// the generic path, which decides from its own read. Both fill the same
// Completion for the same entry (batch_test.go).

// batchPlan is what NextBatch's loop reads of a layout, made once with
// the source; nil when the layout has fields the loop does not decode.
type batchPlan struct {
	idx    bool // IDIsIndex: the id is the ring position
	hasLen bool // else the posted length is reported
	idLen  bool // an id and a length alone, no status or Meta (runIDLen)
	status bool // a Status field, looked up in okStatus
	meta   bool
	// id32 and ln32 are the id and length of an idLen plan, each read
	// with one 32-bit load and a mask (ln32's mask 0: no length); idOwn
	// says the id lies in the ownership word, read once for both.
	id32, ln32 word32
	idOwn      bool
	// okStatus is true for the status values the codes call a success.
	okStatus [256]bool
	// shape names a layout the loop has a copy of its own for, with the
	// geometry as constants (shapeNone: the copies that read it from
	// the plan).
	shape  int
	id, ln cfield
	st     cfield
	m0, m1 cfield
}

// newBatchPlan returns the batch loop's plan for q's layout, or nil.
func newBatchPlan(q *RingSource, r *Ring) *batchPlan {
	f := &r.l.Fields
	for _, x := range []Field{f.Queue, f.Opcode, f.Flags, f.Data, f.Tag, f.Src, f.BufOff} {
		if x.Bits != 0 {
			return nil
		}
	}
	if q.hasOp || r.esz > 64 {
		return nil
	}
	p := &batchPlan{idx: r.idx, hasLen: f.Len.Bits != 0, status: f.Status.Bits != 0, meta: r.meta,
		id: r.f[fID], ln: r.f[fLen], st: r.f[fStatus], m0: r.f[fMeta0], m1: r.f[fMeta1]}
	for v := range p.okStatus {
		p.okStatus[v] = q.stat[v].known && q.stat[v].err == 0
	}
	if !p.status && !p.okStatus[0] {
		return nil // every entry reads status 0, which these codes refuse
	}
	var ok1, ok2 bool
	p.id32, ok1 = planWord32(f.ID, int(r.esz))
	p.ln32, ok2 = planWord32(f.Len, int(r.esz))
	p.idOwn = !r.used && p.id32.off == int(r.own)
	p.idLen = !p.idx && !p.status && !p.meta && !r.clear && ok1 && ok2 && (r.used || r.flip)
	switch {
	case !p.idLen || !p.hasLen || p.ln32.mask != 0xffffffff:
	case !r.used && r.esz == 16 && p.idOwn && p.id32.off == 12 && p.id32.mask == 0xffff && p.ln32.off == 8 && r.mask == packedOwn:
		p.shape = shapePacked16
	case r.used && r.esz == 8 && p.id32.off == 0 && p.id32.mask == 0xffffffff && p.ln32.off == 4:
		p.shape = shapeUsed8
	}
	if r.clear && r.esz == 16 && p.idx && p.status && p.hasLen && p.meta && r.own == 8 &&
		f.Status == (Field{Off: 8, Bits: 2}) && f.Len == (Field{Off: 12, Bits: 16}) &&
		f.Meta == [2]Field{{Off: 0, Bits: 64}, {Off: 8, Bits: 64}} {
		p.shape = shapeDD16
	}
	return p
}

// Shapes of entry with a loop of their own (batchPlan.shape).
const (
	shapeNone = iota
	// shapePacked16: 16-byte entries with a 32-bit length at byte 8 and
	// the ownership word at byte 12, whose low 16 bits are the id
	// (virtio's packed ring).
	shapePacked16
	// shapeUsed8: a used-index ring of 8-byte elements, a 32-bit id then
	// a 32-bit length (virtio's split used ring).
	shapeUsed8
	// shapeDD16: 16-byte descriptor-done entries whose id is the
	// position, the DD word at byte 8 with a 2-bit status in its low bits,
	// a 16-bit length at byte 12 and both quadwords as the Meta words
	// (igb's receive write-back).
	shapeDD16
)

// Batched reports whether NextBatch has its own loop for the source's
// layout; without it NextBatch takes every entry with Next's generic
// read.
func (q *RingSource) Batched() bool { return q.plan != nil }

// NextBatch takes up to len(cs) entries into cs, as that many calls of
// Next would, and returns how many: it stops after a refused entry (Err
// set) or at the first entry not handed over. Like Next it is the
// driver's read, serialised by the driver, a batch ended with Publish.
func (q *RingSource) NextBatch(cs []Completion) int {
	tabs := *q.tables.Load()
	n := 0
	for n < len(cs) {
		if p := q.plan; p != nil {
			n += q.runBatch(p, tabs, cs[n:])
			if n == len(cs) {
				break
			}
		}
		// The entry the loop stopped at, read again by the generic path.
		if !q.take(tabs, &cs[n], nil, true) {
			break
		}
		n++
		if cs[n-1].Err != 0 {
			break
		}
	}
	return n
}

// runBatch is NextBatch's loop: it takes entries while they are the
// common kind and returns how many; at any other it stops without
// consuming it.
func (q *RingSource) runBatch(p *batchPlan, tabs []*Table, cs []Completion) int {
	r := q.ring
	t := tableFor(tabs, 0)
	if t == nil || decodeHook != nil {
		return 0 // every entry is refused; a test's hook runs in take
	}
	if p.shape == shapeDD16 {
		return q.runDD16(p, t, cs)
	}
	if p.idLen {
		return q.runIDLen(p, t, cs)
	}
	comp := t.completer()
	ftl := t.ftailLocal
	var raw [8]uint64 // the entry's copy: up to 64 bytes
	e := unsafe.Pointer(&raw[0])
	n := 0
	for n < len(cs) {
		pos := r.head
		if r.used {
			if !r.usedReady() {
				break
			}
		} else if atomic.LoadUint32(r.ownerWord(pos))&r.mask != r.want {
			break
		}
		// The one read of the device's entry: every field below comes
		// from this copy (Meta words overlap the other fields).
		copyEntry(e, r.entry(pos), r.esz)
		id := pos
		if !p.idx {
			id = uint32(p.id.get(e))
		}
		s := comp.at(id)
		if !s.outstanding(id) || s.multi {
			break // not posted, spanning several positions, multi-receive: take's
		}
		if p.status {
			if v := p.st.get(e); v > 0xff || !p.okStatus[v] {
				break
			}
		}
		ln := s.len
		if p.hasLen {
			if ln = uint32(p.ln.get(e)); ln > s.len {
				break
			}
		}
		c := &cs[n]
		c.set(s, id, pos, ln, t.words[id&comp.mask])
		if p.meta {
			c.Meta = [2]uint64{p.m0.get(e), p.m1.get(e)}
		}
		ftl = comp.release(s, id, ftl)
		r.advance()
		n++
	}
	t.stored(q, ftl)
	return n
}

// runIDLen is runBatch for entries of an id and a length alone, each
// loaded in place, once, with one 32-bit load (virtio's packed ring), the
// ring's position held in locals and stored back once.
func (q *RingSource) runIDLen(p *batchPlan, t *Table, cs []Completion) int {
	r := q.ring
	switch {
	case p.shape == shapePacked16:
		return q.runPacked16(t, cs)
	case p.shape == shapeUsed8:
		return q.runUsed8(t, cs)
	case r.used:
		return q.runUsed(p, t, cs)
	}
	comp, ftl := t.completer(), t.ftailLocal
	base, esz, own, omask := r.base, r.esz, r.own, r.mask
	head, want := r.head, r.want
	n := 0
	for ; n < len(cs); n++ {
		e := unsafe.Add(base, uintptr(head)*esz)
		w := atomic.LoadUint32((*uint32)(unsafe.Add(e, own)))
		if w&omask != want {
			break
		}
		id := w // the id shares the ownership word: loaded once
		if !p.idOwn {
			id = *(*uint32)(unsafe.Add(e, p.id32.off))
		}
		id = le32(id) & p.id32.mask
		s := comp.at(id)
		if !s.outstanding(id) || s.multi {
			break // not posted, spanning several positions, multi-receive: take's
		}
		ln := s.len
		if p.ln32.mask != 0 {
			if ln = le32(*(*uint32)(unsafe.Add(e, p.ln32.off))) & p.ln32.mask; ln > s.len {
				break
			}
		}
		cs[n].set(s, id, head, ln, comp.word(t.wordsPtr(), id))
		ftl = comp.release(s, id, ftl)
		if head++; head == r.n {
			head = 0
			want ^= omask // the lap's ownership value flips (idLen: never DD)
		}
	}
	r.head, r.want = head, want
	r.count += uint32(n)
	t.stored(q, ftl)
	return n
}

// runUsed is runIDLen for a used-index ring (virtio's split used ring):
// the producer index is loaded once per run of entries it covers.
func (q *RingSource) runUsed(p *batchPlan, t *Table, cs []Completion) int {
	r := q.ring
	comp, ftl := t.completer(), t.ftailLocal
	n := 0
run:
	for n < len(cs) && r.usedReady() {
		k := min(int((r.prod-r.count)&r.imask), len(cs)-n)
		base, esz, head, m := r.base, r.esz, r.head, uint32(0)
		for ; int(m) < k; m++ {
			e := unsafe.Add(base, uintptr(head)*esz)
			id := le32(*(*uint32)(unsafe.Add(e, p.id32.off))) & p.id32.mask
			s := comp.at(id)
			if !s.outstanding(id) || s.multi {
				r.head, r.count = head, r.count+m
				n += int(m)
				break run
			}
			ln := s.len
			if p.ln32.mask != 0 {
				if ln = le32(*(*uint32)(unsafe.Add(e, p.ln32.off))) & p.ln32.mask; ln > s.len {
					r.head, r.count = head, r.count+m
					n += int(m)
					break run
				}
			}
			cs[n+int(m)].set(s, id, head, ln, t.words[id&comp.mask])
			ftl = comp.release(s, id, ftl)
			if head++; head == r.n {
				head = 0
			}
		}
		r.head, r.count = head, r.count+m
		n += int(m)
	}
	t.stored(q, ftl)
	return n
}

// runPacked16 is runIDLen for shapePacked16, the geometry in constants:
// one 32-bit load of the ownership word, which holds the id, and one of
// the length; the ring's position in locals, stored back once.
func (q *RingSource) runPacked16(t *Table, cs []Completion) int {
	r := q.ring
	comp, ftl, words := t.completer(), t.ftailLocal, t.wordsPtr()
	base, head, want := r.base, r.head, r.want
	n := 0
	for ; n < len(cs); n++ {
		e := unsafe.Add(base, uintptr(head)*16)
		w := atomic.LoadUint32((*uint32)(unsafe.Add(e, 12)))
		if w&packedOwn != want {
			break
		}
		id := le32(w) & 0xffff
		s := comp.at(id)
		if !s.outstanding(id) || s.multi {
			break // not posted, spanning several positions, multi-receive: take's
		}
		ln := le32(*(*uint32)(unsafe.Add(e, 8)))
		if ln > s.len {
			break
		}
		cs[n].set(s, id, head, ln, comp.word(words, id))
		ftl = comp.release(s, id, ftl)
		if head++; head == r.n {
			head = 0
			want ^= packedOwn
		}
	}
	r.head, r.want = head, want
	r.count += uint32(n)
	t.stored(q, ftl)
	return n
}

// packedOwn is shapePacked16's ownership mask: virtio's AVAIL and USED
// flags (bits 7 and 15 of the flags half of the word at byte 12).
const packedOwn = (1<<7 | 1<<15) << 16

// runUsed8 is runUsed for shapeUsed8, the geometry in constants.
func (q *RingSource) runUsed8(t *Table, cs []Completion) int {
	r := q.ring
	comp, ftl, words := t.completer(), t.ftailLocal, t.wordsPtr()
	n := 0
	for n < len(cs) && r.usedReady() {
		k := n + min(int((r.prod-r.count)&r.imask), len(cs)-n)
		base, head, start := r.base, r.head, n
		for ; n < k; n++ {
			e := unsafe.Add(base, uintptr(head)*8)
			id := le32(*(*uint32)(e))
			s := comp.at(id)
			if !s.outstanding(id) || s.multi {
				break
			}
			ln := le32(*(*uint32)(unsafe.Add(e, 4)))
			if ln > s.len {
				break
			}
			cs[n].set(s, id, head, ln, comp.word(words, id))
			ftl = comp.release(s, id, ftl)
			if head++; head == r.n {
				head = 0
			}
		}
		r.head, r.count = head, r.count+uint32(n-start)
		if n < k {
			break // an entry for take
		}
	}
	t.stored(q, ftl)
	return n
}

// runDD16 is runBatch for shapeDD16: the DD word loaded (acquire), then
// the entry copied once as its two quadwords, status and length decoded
// from the copy, and DD cleared as the entry is consumed (Ring.advance)
// with a plain store where the generic path's is a locked exchange:
// nothing needs ordering against it, since the device writes this
// position again only after the driver has posted it anew (and the
// driver's post writes the whole descriptor).
func (q *RingSource) runDD16(p *batchPlan, t *Table, cs []Completion) int {
	r := q.ring
	comp, ftl, words := t.completer(), t.ftailLocal, t.wordsPtr()
	base, head, mask, held := r.base, r.head, r.mask, r.held
	n := 0
	for ; n < len(cs); n++ {
		e := unsafe.Add(base, uintptr(head)*16)
		w := (*uint32)(unsafe.Add(e, 8))
		if atomic.LoadUint32(w)&mask != mask {
			break
		}
		// The one read of the device's entry.
		q0, q1 := *(*uint64)(e), *(*uint64)(unsafe.Add(e, 8))
		s := comp.at(head)
		if !s.outstanding(head) || s.multi || !p.okStatus[le64(q1)&3] {
			break
		}
		ln := uint32(le64(q1)>>32) & 0xffff
		if ln > s.len {
			break
		}
		c := &cs[n]
		c.set(s, head, head, ln, comp.word(words, head))
		c.Meta = [2]uint64{le64(q0), le64(q1)}
		ftl = comp.release(s, head, ftl)
		*w = uint32(q1)&^mask | held
		if head++; head == r.n {
			head = 0
		}
	}
	r.head = head
	r.count += uint32(n)
	t.stored(q, ftl)
	return n
}

// set fills c for the good entry at pos naming id, outstanding in slot s
// with driver word w, of ln bytes: field by field, where a composite
// literal would clear the whole Completion first.
func (c *Completion) set(s *slot, id, pos, ln uint32, w uint64) {
	c.Context, c.Flags, c.Len, c.Buf = s.ctx, s.flags, int(ln), s.rbuf
	c.Err, c.Prov = 0, 0
	c.ID, c.Pos, c.Done, c.Word = id, pos, true, w
}

// stored takes back the free-queue tail a batch loop advanced to ftl,
// listing the table for the flush at the end of the batch.
func (t *Table) stored(q *RingSource, ftl uint32) {
	if ftl != t.ftailLocal {
		t.ftailLocal = ftl
		if !t.dirty {
			q.markDirty(t)
		}
	}
}

// The completing side of the table and the field helpers the batch loops
// use: here, beside the loops, so that the path of an entry from its
// ownership load to the driver's record is this one file.

// completer is the completing side of a Table as a value: what looking up
// and releasing a slot read, so that a read loop can hold it (the fast
// path's tableCursor) and keep the free queue's tail in a register. It has
// three fields so that the compiler keeps a copy in registers. Table.lookup
// and Table.release go through it: there is one implementation of each.
type completer struct {
	// &slots[0] of mask+1 slots (the table's, with their capacity):
	// any id's slot bits name one, and those from len(slots) up are
	// never posted, so an id naming them is refused as not outstanding.
	slots unsafe.Pointer
	mask  uint32         // an id's slot bits, and the free queue's index mask (it holds mask+1 ids)
	freeq unsafe.Pointer // &freeq[0]
}

// completer returns t's completing side.
func (t *Table) completer() completer {
	return completer{slots: unsafe.Pointer(unsafe.SliceData(t.slots)), mask: t.slotMask,
		freeq: unsafe.Pointer(unsafe.SliceData(t.freeq))}
}

// wordsPtr is &words[0], of mask+1 words (the capacity), for word.
func (t *Table) wordsPtr() unsafe.Pointer { return unsafe.Pointer(unsafe.SliceData(t.words)) }

// word returns the driver word of the slot that id's slot bits name, in
// words of mask+1 (Table.wordsPtr): no bound test.
func (c completer) word(words unsafe.Pointer, id uint32) uint64 {
	return *(*uint64)(unsafe.Add(words, uintptr(id&c.mask)*8))
}

// at returns the slot that id's slot bits name. A read loop calls at and
// outstanding itself, where lookup's nil would cost it a merge of two
// paths per entry.
func (c completer) at(id uint32) *slot {
	return (*slot)(unsafe.Add(c.slots, uintptr(id&c.mask)*unsafe.Sizeof(slot{})))
}

// outstanding reports whether s is posted under id, as an operation of one
// ring position: the fast path's test, which refuses a slotSpan.
func (s *slot) outstanding(id uint32) bool {
	return atomic.LoadUint32(&s.state) == slotPosted && s.id == id
}

// release frees slot s, which outstanding found posted under id, into the
// free queue at local tail ftl and returns the next tail; the id becomes
// visible to posters when the table's tail is published (flush).
func (c completer) release(s *slot, id, ftl uint32) uint32 {
	// s.ctx stays until Post overwrites it (see Table).
	// A plain store: posters see the slot again only after taking its id
	// from the free queue, whose tail flush publishes with a release store.
	s.state = slotFree
	// The free queue holds mask+1 ids: the index is in range.
	*(*uint32)(unsafe.Add(c.freeq, uintptr(ftl&c.mask)*4)) = id & c.mask
	return ftl + 1
}

// usedReady is ready for the UsedIndex convention: the entry at the head
// is before the producer index, loaded again (acquire) only when the
// reader has caught up with the value it had.
func (r *Ring) usedReady() bool {
	if (r.prod-r.count)&r.imask != 0 {
		return true
	}
	return r.loadProd()
}

// loadProd loads the producer index (acquire) and reports whether entries
// are ready. Once the device has published an index beyond the entries it
// may have produced (the producer limit, else a ring ahead of the
// reader), the index is nonsense and nothing before it can be trusted
// either: the ring stops. Without the limit, an index less than a ring
// ahead would hand over last lap's entries as new, and a split ring's ids
// carry no generation to refuse them by.
func (r *Ring) loadProd() bool {
	if r.badIndex {
		return false
	}
	p := r.regs.Producer.Read() >> r.ishift & r.imask
	room := r.n
	if r.limited {
		room = (r.limit - r.count) & r.imask
	}
	if (p-r.count)&r.imask > room {
		r.badIndex = true
		return false
	}
	r.prod = p
	return (p-r.count)&r.imask != 0
}

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
