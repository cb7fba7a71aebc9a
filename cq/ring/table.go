package ring

import (
	"errors"
	"fmt"
	"github.com/vfnic/vfnic/cq"
	"math/bits"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Op is an operation a driver posts to a device queue: what its completion
// must be checked against and reported with.
type Op struct {
	// Context is returned in the completion (op_context).
	Context any
	// Buf is the address of the buffer, reported (plus any multi-receive
	// offset) in receive completions.
	Buf uintptr
	// Len is the buffer length: a completion reporting more is refused.
	Len int
	// Flags are the operation's completion flags, e.g. FlagSend|FlagMsg or
	// FlagRecv|FlagMsg. FlagMultiRecv marks a multi-receive buffer: it
	// stays posted until a completion carries FlagMultiRecv.
	Flags cq.Flags
	// Span is the number of ring positions the operation occupies when
	// the completion ring is also the posting ring and one completion is
	// written over the first of them (a virtio packed-ring chain); 0 and
	// 1 mean one. At most 65535.
	Span int
	// Word is the driver's own record of the posting (a descriptor
	// count, a posting order), kept by the table with the operation and
	// given back in its Completion and by EachPosted, so that a driver
	// keeps no per-id array of its own.
	Word uint64
}

// Slot states. An operation that spans several ring positions is posted
// as slotSpan, which the fast path's loops do not take (they step one
// position per entry): they stop at its entry and leave it to take,
// which skips the span.
const (
	slotFree   = 0
	slotPosted = 1
	slotSpan   = 2
)

// slot is 64 bytes on 64-bit platforms: a slot's offset is its index
// shifted, and it sits on one cache line.
type slot struct {
	state uint32 // slotPosted or slotSpan, published with a release store by Post
	id    uint32 // full id of the current posting (index | generation)
	len   uint32
	multi bool
	span  uint16 // ring positions the operation occupies (Op.Span)
	flags cq.Flags
	buf   uintptr
	// rbuf is the Buf of a completion whose flags are the posted ones:
	// buf for a receive, else 0 (recvBuf), computed once at Post.
	rbuf uintptr
	ctx  any
	// refuse is what refuses a completion of this posting among the
	// flags of its codes: the fast path's refuse bit, and the kinds of
	// operation (opKinds) its opcode may not report (opRefuse),
	// computed once at Post so that checking an entry costs one test.
	refuse cq.Flags
}

// Table records the operations posted to one device queue, so that a
// completion is accepted only for an id that is outstanding, with a length
// that fits and an opcode for the kind of operation posted (Op.Flags), and
// completes it exactly once. Ids are slot indexes with a
// generation in the high bits, so a stale or repeated id is refused.
//
// Post may be called from any goroutine (posters are serialised by a
// mutex); completions are taken by the ring source the table is bound to,
// under its CQ's lock. The two sides meet through a single-producer
// single-consumer queue of free ids, so completing takes no lock.
//
// A table made by NewSingleThreadedTable drops the mutex and the atomic
// stores: with a cq.CQ opened SingleThreaded, one goroutine at a time posts
// and reads, so a post and a completion execute no locked instruction.
//
// A completed operation's Op.Context stays in its slot until the slot is
// posted again: clearing it would cost each completion a store with a
// write barrier (5-9% of the read path in bench/run.sh). So a table keeps
// at most Cap contexts reachable, for as long as it is itself reachable.
type Table struct {
	// Read-only after NewTable.
	single   bool // NewSingleThreadedTable
	slots    []slot
	words    []uint64 // Op.Word per slot: beside the slots, which fill a cache line
	slotMask uint32
	slotBits uint
	idMask   uint32
	freeq    []uint32 // slotMask+1 ids: slotMask is also its index mask
	owner    atomic.Pointer[RingSource]

	// The poster's, the shared and the completer's words sit on separate
	// cache lines, so that posting on one core and completing on another
	// do not bounce a line per operation.
	_     [64]byte
	mu    sync.Mutex // posters
	fhead uint32     // next free id to take, guarded by mu
	_     [64]byte
	ftail uint32 // published end of the free queue (atomic)
	_     [64]byte
	// completer side
	ftailLocal uint32
	dirty      bool
}

// NewTable makes a table for n outstanding operations whose ids the device
// echoes in idBits bits (32 for the software device, 16 for virtio buffer
// ids). Ids use ceil(log2 n) bits for the slot and the rest for a
// generation; when idBits equals that, the id is the slot index (rings
// whose id is the descriptor position, posted and completed in order).
func NewTable(n, idBits int) (*Table, error) {
	if n < 1 || n > maxEntries {
		return nil, fmt.Errorf("%w: table of %d operations", cq.ErrInvalid, n)
	}
	sb := uint(bits.Len(uint(n - 1)))
	if idBits < int(sb) || idBits > 32 {
		return nil, fmt.Errorf("%w: %d-bit ids for %d operations", cq.ErrInvalid, idBits, n)
	}
	t := &Table{
		// Capacity for every index an id's slot bits can name: one past
		// n is never posted, so a lookup needs no bound test.
		slots:    make([]slot, n, 1<<sb),
		words:    make([]uint64, n, 1<<sb),
		slotMask: 1<<sb - 1,
		slotBits: sb,
		idMask:   uint32(uint64(1)<<uint(idBits) - 1),
		freeq:    make([]uint32, 1<<sb),
		ftail:    uint32(n),
	}
	t.ftailLocal = t.ftail
	for i := range t.slots {
		t.slots[i].id = uint32(i)
		t.freeq[i] = uint32(i)
	}
	return t, nil
}

// NewSingleThreadedTable is NewTable for a table that one goroutine at a
// time uses: Post, and the reads of the CQ its ring source feeds (a cq.CQ
// opened with Attr.SingleThreaded), come from the same goroutine or are
// ordered by the caller. It takes no lock and publishes with plain stores,
// which that ordering makes sufficient (the Go memory model orders a
// goroutine's own accesses).
func NewSingleThreadedTable(n, idBits int) (*Table, error) {
	t, err := NewTable(n, idBits)
	if err != nil {
		return nil, err
	}
	t.single = true
	return t, nil
}

// Cap returns the number of operations the table holds.
func (t *Table) Cap() int { return len(t.slots) }

// Outstanding returns how many posted operations have not been completed
// (as far as the completer has published).
func (t *Table) Outstanding() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.slots) - int(atomic.LoadUint32(&t.ftail)-t.fhead)
}

// Post records op and returns the id to put in the descriptor. It fails
// with ErrFull when every slot is outstanding.
func (t *Table) Post(op Op) (uint32, error) {
	// One unsigned comparison each: a negative value converts to one
	// above the bound.
	if uint64(op.Len) > 1<<32-1 {
		return 0, fmt.Errorf("%w: post of %d bytes", cq.ErrInvalid, op.Len)
	}
	if uint(op.Span) > 1<<16-1 {
		return 0, fmt.Errorf("%w: operation spanning %d ring positions", cq.ErrInvalid, op.Span)
	}
	state := uint32(slotPosted)
	if op.Span > 1 {
		state = slotSpan
	}
	if !t.single {
		t.mu.Lock()
	}
	if t.fhead == atomic.LoadUint32(&t.ftail) {
		if !t.single {
			t.mu.Unlock()
		}
		return 0, ErrFull
	}
	i := t.freeq[t.fhead&t.slotMask] // freeq holds slotMask+1 ids
	t.fhead++
	s := &t.slots[i]
	gen := (s.id >> t.slotBits) + 1
	s.id = (gen<<t.slotBits | i) & t.idMask
	s.len = uint32(op.Len)
	s.multi = op.Flags&cq.FlagMultiRecv != 0
	s.span = uint16(op.Span)
	s.flags = entryFlags(op.Flags &^ cq.FlagMultiRecv)
	s.buf = op.Buf
	s.rbuf = recvBuf(s.flags, op.Buf)
	s.ctx = op.Context
	t.words[i] = op.Word
	s.refuse = refuse | opRefuse(s.flags)
	if t.single {
		// The completer runs in this goroutine, or after it in an order
		// the caller made: program order publishes the slot.
		s.state = state
		return s.id, nil
	}
	// The release store publishes the slot to the completer; the device's
	// path (doorbell, DMA, ownership word) is invisible to the Go memory
	// model and to the race detector.
	storeRelease32(&s.state, state)
	id := s.id
	t.mu.Unlock()
	return id, nil
}

// PostSlot is Post into slot i, which the caller chooses, for a device
// that reports a buffer rather than an id the driver wrote: AF_XDP's
// rings carry the buffer's address, so its driver keys each buffer to
// the slot of the same index and names it by the slot's id, i. The table
// must have ids without generation bits (NewTable with idBits equal to
// the slot bits) and is posted only through PostSlot, whose posts take
// from the free count as Post's do. Slot i already outstanding, or out of
// range, is an error matching cq.ErrInvalid; ErrFull when no release is
// published yet (the ring source publishes them once per batch).
func (t *Table) PostSlot(i uint32, op Op) (uint32, error) {
	if op.Len < 0 || uint64(op.Len) > 1<<32-1 || op.Span > 1 || op.Flags&cq.FlagMultiRecv != 0 {
		return 0, fmt.Errorf("%w: slot post of %d bytes, span %d, flags %#x", cq.ErrInvalid, op.Len, op.Span, op.Flags)
	}
	if t.idMask != t.slotMask {
		return 0, fmt.Errorf("%w: slot post into a table whose ids carry a generation", cq.ErrInvalid)
	}
	if !t.single {
		t.mu.Lock()
		defer t.mu.Unlock()
	}
	if i >= uint32(len(t.slots)) {
		return 0, fmt.Errorf("%w: slot %d of %d", cq.ErrInvalid, i, len(t.slots))
	}
	s := &t.slots[i]
	if atomic.LoadUint32(&s.state) != slotFree {
		return 0, fmt.Errorf("%w: slot %d is outstanding", cq.ErrInvalid, i)
	}
	if t.fhead == atomic.LoadUint32(&t.ftail) {
		return 0, ErrFull
	}
	t.fhead++
	s.id = i
	s.len = uint32(op.Len)
	s.multi = false
	s.span = 0
	s.flags = entryFlags(op.Flags)
	s.buf = op.Buf
	s.rbuf = recvBuf(s.flags, op.Buf)
	s.ctx = op.Context
	s.refuse = refuse | opRefuse(s.flags)
	if t.single {
		s.state = slotPosted
	} else {
		storeRelease32(&s.state, slotPosted)
	}
	return i, nil
}

// opKinds are the flags that say which kind of operation a completion
// is for: the posted operation's, and those a device's opcode adds
// (Codes.Opcodes).
const opKinds = cq.FlagSend | cq.FlagRecv | cq.FlagRead | cq.FlagWrite | cq.FlagRemoteRead | cq.FlagRemoteWrite

// opRefuse returns the operation kinds that an opcode may not report for
// an operation posted with flags fl: every kind but fl's own, and for a
// receive the remote reads and writes, which consume a receive (verbs'
// IBV_WC_RECV_RDMA_WITH_IMM). An operation posted with no kind (a driver
// whose device tells the kinds apart by queue) refuses none.
func opRefuse(fl cq.Flags) cq.Flags {
	own := fl & opKinds
	switch {
	case own == 0:
		return 0
	case own&cq.FlagRecv != 0:
		own |= cq.FlagRemoteRead | cq.FlagRemoteWrite
	}
	return opKinds &^ own
}

// noSlots is the completer of no table: its one slot is never posted, so
// every id is refused.
var noSlots = completer{slots: unsafe.Pointer(new(slot))}

// lookup returns the outstanding slot for id, or nil.
func (c completer) lookup(id uint32) *slot {
	if s := c.at(id); s.posted(id) {
		return s
	}
	return nil
}

// posted reports whether s is posted under id, spanning one ring position
// or more.
func (s *slot) posted(id uint32) bool {
	return atomic.LoadUint32(&s.state) != slotFree && s.id == id
}

// lookup returns the outstanding slot for id, or nil. Completer side.
func (t *Table) lookup(id uint32) *slot {
	c := t.completer()
	return c.lookup(id)
}

// release frees a slot; the id becomes visible to posters at flush.
// Completer side.
func (t *Table) release(s *slot, id uint32) {
	c := t.completer()
	t.ftailLocal = c.release(s, id, t.ftailLocal)
}

// flush publishes the ids released since the last flush.
func (t *Table) flush() {
	if t.single {
		t.ftail = t.ftailLocal // posters run in this goroutine (NewSingleThreadedTable)
	} else {
		storeRelease32(&t.ftail, t.ftailLocal)
	}
	t.dirty = false
}

// Each calls f with the context of every outstanding operation, in slot
// order: for a driver that completes them itself when its device is gone
// (fi_cq's FI_ECANCELED, verbs' IBV_WC_WR_FLUSH_ERR). Call it only while
// nobody posts to the table or reads the ring it is bound to.
func (t *Table) Each(f func(ctx any)) {
	t.EachID(func(_ uint32, ctx any) { f(ctx) })
}

// EachID is Each with the id each operation was posted under (Post's
// result), for a driver that keeps its own records by id, such as the
// order operations were posted in, which slot order is not once slots
// were freed out of order.
func (t *Table) EachID(f func(id uint32, ctx any)) {
	for i := range t.slots {
		if s := &t.slots[i]; atomic.LoadUint32(&s.state) != slotFree {
			f(s.id, s.ctx)
		}
	}
}

// EachPosted calls f with the id, context, buffer and driver word (Op.Word)
// of every outstanding operation, in slot order: the one record of what a
// closing queue still has posted. Call it only while nobody posts to the
// table or reads the ring it is bound to.
func (t *Table) EachPosted(f func(id uint32, ctx any, buf uintptr, word uint64)) {
	for i := range t.slots {
		if s := &t.slots[i]; atomic.LoadUint32(&s.state) != slotFree {
			f(s.id, s.ctx, s.buf, t.words[i])
		}
	}
}

// word returns the driver word of the operation outstanding under id
// (lookup found it, so its slot is below Cap).
func (t *Table) word(id uint32) uint64 { return t.words[id&t.slotMask] }

// ErrFull means a posted-operation table has no free slot.
var ErrFull = errors.New("cq/ring: no free slot for a posted operation")
