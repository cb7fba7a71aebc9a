package ring

import (
	"fmt"
	"github.com/vfnic/vfnic/cq"
	"io"
	"math/bits"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Notifier arms a device's completion interrupt, the device-specific part
// of blocking: mlx5 writes an arm doorbell with the consumer index, virtio
// clears its used-buffer notification suppression, e1000e unmasks an
// interrupt cause. consumed is the ring's consumer count (Ring.Count), so a
// device can fire at once for entries it wrote before the arm.
type Notifier interface {
	Arm(consumed uint32, solicitedOnly bool, threshold int) error
}

// Status describes one value of a device's status field.
type Status struct {
	// Value is the status field's value (below 256).
	Value uint32
	// Err is the completion error for this status; 0 means success.
	Err cq.Errno
	// Name is shown by StrError.
	Name string
}

// Opcode describes one value of a device's opcode field.
type Opcode struct {
	// Value is the opcode field's value (below 256).
	Value uint32
	// Flags are added to the posted operation's flags.
	Flags cq.Flags
	// Name is shown in errors.
	Name string
}

// Codes give meaning to a device's status, opcode and flag values. Values
// outside the lists (and any value from 256 up) are refused with an error
// completion.
type Codes struct {
	// Statuses lists the status values; nil means 0 is success and nothing
	// else is defined.
	Statuses []Status
	// Opcodes lists the opcode values; nil means the opcode is not checked
	// and flags come from the posted operation alone. The kind of
	// operation an opcode's Flags name (FlagSend, FlagRecv, FlagRead,
	// FlagWrite, FlagRemoteRead, FlagRemoteWrite) must be the one posted
	// under the entry's id (Op.Flags; a receive also takes a remote read
	// or write), or the entry is refused with cq.ProvBadOp.
	Opcodes []Opcode
	// FlagBits maps bit i of the device flags field to completion flags:
	// FlagRemoteCQData makes Data valid, FlagTagged makes Tag valid (and
	// replaces FlagMsg), FlagMultiRecv releases a multi-receive buffer.
	FlagBits [8]cq.Flags
}

type statusCode struct {
	err   cq.Errno
	known bool
}

type opCode struct {
	flags cq.Flags
	known bool
}

// RingConfig configures a RingSource.
type RingConfig struct {
	// Mem holds the ring entries (DMA memory the device writes).
	Mem []byte
	// Layout describes the entries.
	Layout Layout
	// Regs are the doorbell and overrun registers.
	Regs RingRegs
	// Codes give meaning to status, opcode and flag values.
	Codes Codes
	// Notifier arms the device's interrupt; nil when it has none.
	Notifier Notifier
	// Closer releases the device ring when the CQ closes; may be nil.
	Closer io.Closer
}

// RingSource is a Source over one device completion ring: it reads entries
// with a Ring, checks each against the posted-operation tables bound to
// it, and converts it to the CQ's format in a single pass with no call per
// entry. Error entries are staged one at a time, in ring order.
type RingSource struct {
	ring  *Ring
	stat  [256]statusCode
	op    [256]opCode
	hasOp bool
	bits  [256]cq.Flags
	names map[uint32]string

	tables atomic.Pointer[[]*Table] // by queue number; copied on write
	bindMu sync.Mutex

	notifier Notifier
	closer   io.Closer

	// Format masks: all ones for the fields the CQ's format has.
	attached bool
	mFlags   cq.Flags
	mLen     int
	mBuf     uintptr
	mData    uint64
	mTag     uint64

	// fast is the fast path (fast.go), made with the source when the
	// layout allows it; its loop is chosen by Attach for the CQ's format.
	// Nil when the generic loop must be used.
	fast *fastPath
	// plan is the drivers' batch loop's (NextBatch), nil when the
	// layout needs take for every entry.
	plan *batchPlan

	staged       bool
	overrun      bool
	badIndexSeen bool // the UsedIndex refusal was reported
	closed       bool
	errEnt       cq.ErrEntry
	errData      []byte
	errLen       int
	ent          []byte // the copy of the entry being taken (take)
	dirty        []*Table
	scratch      [1]cq.Entry
}

// NewRingSource makes a source over cfg.Mem.
func NewRingSource(cfg RingConfig) (*RingSource, error) {
	r, err := newRing(cfg.Mem, cfg.Layout, cfg.Regs)
	if err != nil {
		return nil, err
	}
	q := &RingSource{ring: r, notifier: cfg.Notifier, closer: cfg.Closer,
		names: map[uint32]string{}, errData: make([]byte, cfg.Layout.EntrySize), ent: make([]byte, cfg.Layout.EntrySize),
		dirty: make([]*Table, 0, 16)}
	if cfg.Codes.Statuses == nil {
		q.stat[0] = statusCode{known: true}
	}
	for _, s := range cfg.Codes.Statuses {
		if s.Value >= 256 {
			return nil, fmt.Errorf("%w: layout %q: status value %d above 255", cq.ErrInvalid, cfg.Layout.Name, s.Value)
		}
		q.stat[s.Value] = statusCode{err: s.Err, known: true}
		q.names[s.Value] = s.Name
	}
	for _, o := range cfg.Codes.Opcodes {
		if o.Value >= 256 {
			return nil, fmt.Errorf("%w: layout %q: opcode %d above 255", cq.ErrInvalid, cfg.Layout.Name, o.Value)
		}
		q.op[o.Value] = opCode{flags: o.Flags, known: true}
		q.hasOp = true
	}
	if !q.hasOp {
		for i := range q.op {
			q.op[i].known = true
		}
	}
	for v := range q.bits {
		var f cq.Flags
		for b := 0; b < 8; b++ {
			if v&(1<<b) != 0 {
				f |= cfg.Codes.FlagBits[b]
			}
		}
		q.bits[v] = f
	}
	q.fast = newFastPath(q, r)
	q.plan = newBatchPlan(q, r)
	empty := []*Table{}
	q.tables.Store(&empty)
	return q, nil
}

// Ring returns the ring reader (for layers that walk raw entries).
func (q *RingSource) Ring() *Ring { return q.ring }

// Loop names the loop a Read runs over the ring for the CQ's format: a
// function a CPU profile shows (readPhaseDataVirtioPacked, ...), or
// "generic" when the layout or the codes need the generic loop. A driver's
// test checks with it that its layout takes the loop made for it.
func (q *RingSource) Loop() string {
	if q.fast == nil {
		return "generic"
	}
	return loopNames[q.fast.sel]
}

// maxQueue bounds queue numbers so the lookup table stays small.
const maxQueue = 1 << 16

// BindTable routes completions whose Queue field is queue to t. A table
// belongs to one source.
func (q *RingSource) BindTable(queue uint32, t *Table) error {
	if queue >= maxQueue {
		return fmt.Errorf("%w: queue %d", cq.ErrInvalid, queue)
	}
	if !t.owner.CompareAndSwap(nil, q) && t.owner.Load() != q {
		return fmt.Errorf("%w: table already bound to another ring", cq.ErrInvalid)
	}
	q.bindMu.Lock()
	defer q.bindMu.Unlock()
	old := *q.tables.Load()
	if int(queue) < len(old) && old[queue] != nil && old[queue] != t {
		return fmt.Errorf("%w: queue %d already bound", cq.ErrInvalid, queue)
	}
	n := len(old)
	if int(queue) >= n {
		n = int(queue) + 1
	}
	tabs := make([]*Table, n)
	copy(tabs, old)
	tabs[queue] = t
	q.tables.Store(&tabs)
	return nil
}

// UnbindTable stops routing queue; later completions for it are refused
// (ProvBadQueue).
func (q *RingSource) UnbindTable(queue uint32) {
	q.bindMu.Lock()
	defer q.bindMu.Unlock()
	old := *q.tables.Load()
	if int(queue) >= len(old) || old[queue] == nil {
		return
	}
	tabs := make([]*Table, len(old))
	copy(tabs, old)
	tabs[queue] = nil
	q.tables.Store(&tabs)
}

// Attach implements cq.Source.
func (q *RingSource) Attach(f cq.Format) error {
	if q == nil {
		return fmt.Errorf("%w: nil ring source", cq.ErrInvalid)
	}
	if q.attached {
		return fmt.Errorf("%w: ring %q already attached to a CQ", cq.ErrInvalid, q.ring.l.Name)
	}
	q.attached = true
	if f >= cq.FormatMsg {
		q.mFlags, q.mLen = ^cq.Flags(0), -1
	}
	if f >= cq.FormatData {
		q.mBuf, q.mData = ^uintptr(0), ^uint64(0)
	}
	if f >= cq.FormatTagged {
		q.mTag = ^uint64(0)
	}
	if q.fast != nil {
		q.fast.setFormat(f)
	}
	return nil
}

// pollOther is Poll for all but a Read on the fast path: a probe (no
// entries), ReadFrom (addrs), a source without a fast path, and a source
// with an error entry staged or a ring overrun.
func (q *RingSource) pollOther(ents []cq.Entry, addrs []cq.Addr) (int, cq.SourceState) {
	if len(ents) == 0 {
		// A probe: stage an error entry at the head and notice an
		// overrun, consuming nothing else (errOnly stores no entry, so
		// scratch stays empty).
		return q.poll(q.scratch[:], nil, true)
	}
	return q.poll(ents, addrs, false)
}

// Completion is one entry taken from a ring (NextBatch, Next), the
// drivers' record: what a NIC queue needs to write its own record (a
// nic.Completion, or a CQ's cq.Entry) and nothing a NIC never reports
// (remote data, tags, source addresses), so that the batch loop writes
// few fields per entry. Every field the device wrote was loaded once,
// checked against the posted operation, and everything in it was
// decided from that one read. The CQ's generic path keeps the fields
// of the full fi_cq record beside it (entry).
type Completion struct {
	// Context is the posted operation's (op_context), for a good
	// completion and a refused one that named an outstanding operation.
	Context any
	// Buf is a receive's posted buffer (plus a multi-receive offset);
	// 0 for other operations.
	Buf uintptr
	// Len is the bytes the device reported; a layout without a Len field
	// reports the posted length.
	Len int
	// Flags are the operation's completion flags (cq.Entry.Flags).
	Flags cq.Flags
	// Word is the driver word the operation was posted with (Op.Word),
	// when the entry named an outstanding one.
	Word uint64
	// Err is 0 for a good completion. For an entry the reader refused it
	// is the error (cq.EIO for an entry that breaks the device contract,
	// the status's errno for the device's own error status), and Prov the
	// provider error number: the device status value or a cq.Prov* code.
	Err  cq.Errno
	Prov cq.ProvErrno
	// ID is the id the entry named; Pos the ring position it was read at.
	ID, Pos uint32
	// Done says the operation the entry named is complete and its id
	// free again: set for every good completion but the non-final ones of
	// a multi-receive buffer, and for a refused entry that named an
	// outstanding operation.
	Done bool
	// OLen is the number of bytes the device reported beyond the posted
	// buffer, for a refused entry whose status says so; the batch loop
	// does not write it for a good one.
	OLen int
	// Meta are the layout's Meta fields; the batch loop writes them only
	// for a layout that has some.
	Meta [2]uint64
}

// entry is a Completion with the fields of the full fi_cq record that
// only the CQ's generic path reports (take fills them when given x), a
// CQ's entry being written from it.
type entry struct {
	Completion
	x extra
}

// extra are the fields of a CQ's entry that a NIC never reports.
type extra struct {
	Data, Tag uint64
	Queue     uint32
	Src       cq.Addr
}

// Next takes the next entry of the ring into c and consumes it; false when
// the device has handed over no further entry. A refused entry is consumed
// too, and returned with c.Err set (it never stops the ring, except a
// UsedIndex ring whose producer index is nonsense: Ring.BadIndex). It is
// the driver's read, for sources that are not attached to a CQ (a NIC
// queue that writes its own records); calls must be serialised, and a
// batch of them ended with Publish.
func (q *RingSource) Next(c *Completion) bool {
	return q.take(*q.tables.Load(), c, nil, true)
}

// Publish ends a batch of Next calls: it rings the consumer doorbell once
// and hands the ids released since the last batch back to posters.
func (q *RingSource) Publish() {
	q.ring.publish()
	q.flushDirty()
}

// flushDirty publishes the ids released into the tables listed dirty.
func (q *RingSource) flushDirty() {
	for _, t := range q.dirty {
		t.flush()
	}
	q.dirty = q.dirty[:0]
}

// take is the one way an entry is consumed, by Next, by the CQ's generic
// loop and for every error entry: the ownership word (or the producer
// index) is loaded first, then every field once, into a local copy; the
// posted operation is looked up and checked from that copy alone. A good
// entry is released and consumed only with consume (a probe for an error
// at the head leaves it); a refused one is always consumed, with c.Err
// set, its raw bytes in errData and the slot it named, if any, released.
// It returns false when the head is not handed over.
func (q *RingSource) take(tabs []*Table, c *Completion, x *extra, consume bool) bool {
	r := q.ring
	pos := r.head
	if !r.ready() {
		switch {
		case r.used && r.badIndex && !q.badIndexSeen:
			q.badIndexSeen = true
			q.errLen = 0
			*c = Completion{Err: cq.EIO, Prov: cq.ProvBadIndex, Pos: pos}
			x.clear()
			return true
		case r.hole():
			*c = Completion{Err: cq.EIO, Prov: cq.ProvBadPhase, Pos: pos}
			x.clear()
			q.errLen = copy(q.errData, r.entryBytes(pos)) // not interpreted
			r.consumeHole()
			return true
		}
		return false
	}
	// The one read of the device's entry: a copy, decoded and decided
	// from; a device that rewrites the entry later changes nothing.
	copyEntry(unsafe.Pointer(&q.ent[0]), r.entry(pos), r.esz)
	if decodeHook != nil {
		decodeHook(pos)
	}
	// Fields are taken from the copy as they are needed; absent ones
	// read as 0.
	e := unsafe.Pointer(&q.ent[0])
	id := uint32(r.f[fID].get(e))
	if r.idx {
		id = pos
	}
	qn := uint32(r.f[fQueue].get(e))
	*c = Completion{ID: id, Pos: pos}
	if x != nil {
		x.clear()
		x.Queue = qn
	}
	if r.meta {
		c.Meta = [2]uint64{r.f[fMeta0].get(e), r.f[fMeta1].get(e)}
	}
	t := tableFor(tabs, qn)
	var s *slot
	if t != nil {
		s = t.lookup(id)
	}
	if s == nil {
		c.Err, c.Prov = cq.EIO, cq.ProvBadID
		if t == nil {
			c.Prov = cq.ProvBadQueue
		}
		q.refused(pos, 1)
		return true
	}
	status, bufOff := r.f[fStatus].get(e), uint32(r.f[fBufOff].get(e))
	sc, oc := q.codes(status, r.f[fOpcode].get(e))
	// An opcode for another kind of operation than the one posted adds
	// none of its flags: the error completion reports the posted one.
	badOp := oc.flags&s.refuse&opKinds != 0
	if badOp {
		oc.flags = 0
	}
	fl := entryFlags(s.flags | oc.flags | q.bits[r.f[fFlags].get(e)&0xff])
	ln := uint32(r.f[fLen].get(e))
	hasLen := r.f[fLen].mask != 0
	if !hasLen {
		ln = s.len
	}
	c.Context = s.ctx
	c.Word = t.word(id)
	c.Flags = fl
	if fl&cq.FlagRecv != 0 && bufOff <= s.len {
		c.Buf = s.buf + uintptr(bufOff)
	}
	if x != nil {
		if fl&cq.FlagRemoteCQData != 0 {
			x.Data = r.f[fData].get(e)
		}
		if fl&(cq.FlagTagged|cq.FlagRecv) == cq.FlagTagged|cq.FlagRecv {
			x.Tag = r.f[fTag].get(e)
		}
		if fl&cq.FlagRecv != 0 && r.f[fSrc].mask != 0 && (r.srcOK || r.f[fSrcValid].get(e) != 0) {
			x.Src = cq.Addr(r.f[fSrc].get(e))
		}
	}
	switch {
	case !sc.known:
		c.Err, c.Prov = cq.EIO, cq.ProvBadStatus
	case sc.err != 0:
		c.Err, c.Prov = sc.err, cq.ProvErrno(status)
		if ln > s.len {
			c.OLen = int(ln - s.len)
		}
		ln = min(ln, s.len)
	case !oc.known:
		c.Err, c.Prov = cq.EIO, cq.ProvBadOpcode
	case badOp:
		c.Err, c.Prov = cq.EIO, cq.ProvBadOp
	case hasLen && !fits(ln, bufOff, s.len):
		c.Err, c.Prov = cq.EIO, cq.ProvBadLen
		ln = min(ln, s.len)
	}
	c.Len = int(ln)
	span := uint32(s.span)
	if c.Err != 0 {
		c.Done = true
		t.release(s, id)
		if !t.dirty {
			q.markDirty(t)
		}
		q.refused(pos, span)
		return true
	}
	if !consume {
		return true
	}
	if !s.multi || fl&cq.FlagMultiRecv != 0 {
		c.Done = true
		t.release(s, id)
		if !t.dirty {
			q.markDirty(t)
		}
	}
	r.advance()
	r.skip(span)
	return true
}

// clear resets the extra fields of a CQ's entry, if any.
func (x *extra) clear() {
	if x != nil {
		*x = extra{Src: cq.AddrNotAvail}
	}
}

// copyEntry copies an entry of n bytes (a multiple of 4) in 8-byte words:
// entries are small, and a call to memmove costs more than the copy.
func copyEntry(dst, src unsafe.Pointer, n uintptr) {
	i := uintptr(0)
	for ; i+8 <= n; i += 8 {
		*(*uint64)(unsafe.Add(dst, i)) = *(*uint64)(unsafe.Add(src, i))
	}
	if i < n {
		*(*uint32)(unsafe.Add(dst, i)) = *(*uint32)(unsafe.Add(src, i))
	}
}

// refused consumes the head entry, refused, keeping the copy it was
// decided from as the error data. Cold path.
func (q *RingSource) refused(pos, span uint32) {
	q.errLen = copy(q.errData, q.ent)
	q.ring.advance()
	q.ring.skip(span)
}

// decodeHook, when set by a test, runs after each entry is copied, where a
// device may rewrite the entry.
var decodeHook func(pos uint32)

// poll reads one batch with the generic loop, through take. With errOnly
// it consumes nothing but an error entry at the head (for ReadErr and a
// Read of zero entries).
func (q *RingSource) poll(ents []cq.Entry, addrs []cq.Addr, errOnly bool) (int, cq.SourceState) {
	if q.staged {
		return 0, cq.SourceError
	}
	if q.overrun {
		return 0, cq.SourceOverrun
	}
	tabs := *q.tables.Load()
	n, stopped := 0, false
	var c entry
	for errOnly || n < len(ents) {
		if !q.take(tabs, &c.Completion, &c.x, !errOnly) {
			stopped = true
			break
		}
		if c.Err != 0 {
			q.stage(&c)
			break
		}
		if errOnly {
			break
		}
		q.store(&ents[n], &c)
		if addrs != nil {
			addrs[n] = c.x.Src
		}
		n++
	}
	r := q.ring
	if stopped && r.overrun() {
		q.overrun = true
	}
	return q.finishBatch(n)
}

// store writes a good completion into a CQ entry, with the fields outside
// the CQ's format left zero.
func (q *RingSource) store(e *cq.Entry, c *entry) {
	e.Context = c.Context
	e.Flags = c.Flags & q.mFlags
	e.Len = c.Len & q.mLen
	e.Buf = c.Buf & q.mBuf
	e.Data = c.x.Data & q.mData
	e.Tag = c.x.Tag & q.mTag
	e.Queue = c.x.Queue
}

// endBatch finishes a batch of n entries read by the fast loop: when it
// stopped at an entry not handed over (stopped), take decides about the
// head from its own read (an error is staged, a hole consumed, a good
// entry left for the next batch); then the overrun check, one doorbell
// and the release of freed ids.
func (q *RingSource) endBatch(n int, stopped bool, tabs []*Table) (int, cq.SourceState) {
	if stopped {
		var c entry
		if q.take(tabs, &c.Completion, &c.x, false) && c.Err != 0 {
			q.stage(&c)
		}
	}
	if stopped && !q.staged && q.ring.overrun() {
		q.overrun = true
	}
	return q.finishBatch(n)
}

// finishBatch rings the doorbell once, publishes the released ids and
// says how the batch ended.
func (q *RingSource) finishBatch(n int) (int, cq.SourceState) {
	q.Publish()
	switch {
	case q.staged:
		return n, cq.SourceError
	case q.overrun && n == 0:
		return 0, cq.SourceOverrun
	}
	return n, cq.SourceOK
}

func (q *RingSource) markDirty(t *Table) {
	if len(q.dirty) == cap(q.dirty) {
		t.flush() // keep the list fixed-size: flush now instead
		return
	}
	t.dirty = true
	q.dirty = append(q.dirty, t)
}

// tableFor returns the table bound to queue qn, or nil.
func tableFor(tabs []*Table, qn uint32) *Table {
	if qn < uint32(len(tabs)) {
		return tabs[qn]
	}
	return nil
}

// codes returns what a status and an opcode value mean; values from 256 up
// are unknown.
func (q *RingSource) codes(st, op uint64) (sc statusCode, oc opCode) {
	if st < 256 {
		sc = q.stat[st]
	}
	if op < 256 {
		oc = q.op[op]
	}
	return sc, oc
}

// entryFlags completes a completion's flags: a tagged message is reported
// as FlagTagged alone, not also FlagMsg.
func entryFlags(fl cq.Flags) cq.Flags {
	if fl&cq.FlagTagged != 0 {
		fl &^= cq.FlagMsg
	}
	return fl
}

// recvBuf returns buf for a receive (fl has FlagRecv), else 0, without a
// branch.
func recvBuf(fl cq.Flags, buf uintptr) uintptr {
	return buf & -uintptr(fl&cq.FlagRecv/cq.FlagRecv)
}

// fits reports whether ln bytes from offset off lie within a posted buffer
// of size bytes (written so that it cannot overflow).
func fits(ln, off, size uint32) bool { return ln <= size && off <= size-ln }

// stage makes the refused completion c, already consumed by take, the
// pending error completion (ReadErr). Cold path.
func (q *RingSource) stage(c *entry) {
	q.errEnt = cq.ErrEntry{Entry: cq.Entry{Context: c.Context, Flags: c.Flags, Len: c.Len, Buf: c.Buf, Data: c.x.Data, Tag: c.x.Tag, Queue: c.x.Queue},
		OLen: c.OLen, Err: c.Err, ProvErrno: c.Prov}
	q.staged = true
}

// Pending implements cq.Source.
func (q *RingSource) Pending(max int) int {
	if q.staged {
		return 1 + q.ring.pending(max-1)
	}
	if q.overrun {
		return max
	}
	n := q.ring.pending(max)
	if n == 0 && (q.ring.hole() || q.ring.overrun()) {
		return max
	}
	if n == 0 && q.ring.badIndex && !q.badIndexSeen {
		return min(max, 1) // the refusal waits to be read
	}
	return n
}

// ReadErr implements cq.Source.
func (q *RingSource) ReadErr(e *cq.ErrEntry) ([]byte, bool) {
	if !q.staged {
		// errOnly stops before an entry is stored, so scratch stays
		// empty: it only gives the loop room for one entry.
		q.poll(q.scratch[:], nil, true)
		if !q.staged {
			return nil, false
		}
	}
	data := e.ErrData
	*e = q.errEnt
	e.ErrData = data
	q.staged = false
	return q.errData[:q.errLen], true
}

// Arm implements cq.Source.
func (q *RingSource) Arm(solicitedOnly bool, threshold int) error {
	if q.notifier == nil {
		return nil
	}
	if threshold <= 0 {
		// Counted from the entries visible now, not from the consumer
		// index: one written after this count is beyond it and fires, so
		// nothing is lost between the count and the arm.
		return q.notifier.Arm(q.ring.count+uint32(q.ring.pending(int(q.ring.n))), solicitedOnly, 1)
	}
	return q.notifier.Arm(q.ring.count, solicitedOnly, threshold)
}

// StrError implements cq.Source: the device's status names, with the vendor
// syndrome taken from the raw entry in errData.
func (q *RingSource) StrError(provErrno cq.ProvErrno, errData []byte) (string, bool) {
	if provErrno < 0 {
		return "", false
	}
	name, ok := q.names[uint32(provErrno)]
	if !ok {
		return "", false
	}
	msg := fmt.Sprintf("%s: status %s (%d)", q.ring.l.Name, name, provErrno)
	if sf := q.ring.f[fSyndrome]; sf.mask != 0 && len(errData) >= q.ring.l.EntrySize {
		msg += fmt.Sprintf(", syndrome %#x", sf.get(unsafe.Pointer(&errData[0])))
	}
	return msg, true
}

// Close implements cq.Source.
func (q *RingSource) Close() error {
	if q.closed {
		return nil
	}
	q.closed = true
	if q.closer != nil {
		return q.closer.Close()
	}
	return nil
}

// Remap moves the reader to new ring memory of entries entries, a power of
// two: the device side of a resize (ibv_resize_cq) has written there, in
// order, the entries not yet consumed, the entry for consumer count x at
// position x mod entries with the ownership value of lap x / entries, and
// the not-ready value at every other position. The consumer count goes on
// from where it was, so the device's producer count and the doorbell stay
// valid. Call it only while nobody reads the ring and the device does not
// write it; mem must stay mapped while the source is used.
func (q *RingSource) Remap(mem []byte, entries int) error {
	old := q.ring
	if old.l.Convention == DescriptorDone || old.idx {
		return fmt.Errorf("%w: remapping a %v ring", cq.ErrNotSupported, old.l.Convention)
	}
	if entries < 1 || entries&(entries-1) != 0 {
		return fmt.Errorf("%w: remap to %d entries (need a power of two)", cq.ErrInvalid, entries)
	}
	l := old.l
	l.Entries = entries
	r, err := newRing(mem, l, old.regs)
	if err != nil {
		return err
	}
	r.count = old.count
	// A UsedIndex reader goes on from the index it loaded, against the
	// same producer limit.
	r.prod, r.badIndex, r.limited, r.limit = old.prod, old.badIndex, old.limited, old.limit
	r.head = r.count & (r.n - 1)
	if (r.count>>uint(bits.TrailingZeros32(r.n)))&1 == 1 {
		r.want ^= r.mask // an odd lap
	}
	q.ring = r
	if q.fast != nil {
		q.fast.base = r.base
	}
	return nil
}
