package igb

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/vfnic/vfnic/cq"
	cqring "github.com/vfnic/vfnic/cq/ring"
	"github.com/vfnic/vfnic/dma"
	"github.com/vfnic/vfnic/doorbell"
	"github.com/vfnic/vfnic/eventfd"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/nic/internal/canceled"
	qcore "github.com/vfnic/vfnic/nic/internal/queue"
	"github.com/vfnic/vfnic/nic/internal/rxbuf"
)

// Errors returned on the data path, prepared once so returning them does
// not allocate.
var (
	errNoBuffer  = fmt.Errorf("%w: every receive buffer is lent out (Release some)", nic.ErrFull)
	errNoDesc    = fmt.Errorf("%w: no free descriptor (read completions first)", nic.ErrFull)
	errFrameSize = fmt.Errorf("%w: frame outside [%d, MaxFrame] bytes", nic.ErrFrameSize, nic.MinFrame)
	errClosed    = nic.ErrClosed

	errBadID       = fmt.Errorf("%w: igb: DD on a descriptor that was not posted (queue broken)", cq.ProvBadID)
	errBadLen      = fmt.Errorf("%w: igb: write-back length beyond the posted buffer or below an Ethernet header", cq.ProvBadLen)
	errBadPhase    = fmt.Errorf("%w: igb: descriptor without DD before one with DD (queue broken)", cq.ProvBadPhase)
	errMultiBuffer = fmt.Errorf("%w: igb: descriptor without EOP, or the rest of such a frame", cq.ProvMultiBuffer)
	errBadStatus   = fmt.Errorf("%w: igb: write-back status the device may not write (%w)", cq.ProvBadStatus, nic.ErrDeviceFailed)
	errRxError     = fmt.Errorf("%w: igb: write-back with RXE (a frame received in error, which the driver does not ask the device to store)", nic.ErrDeviceStatus)
)

// queue is what receive and transmit queues share: the descriptor ring,
// its reader, its tail doorbell, its interrupt vector and counters. All
// of it is guarded by mu, whichever way the queue is read (Poll, or the
// CQ it feeds).
type queue struct {
	// Core: the lock, closed state, the CQ fed (Src), name, pair index,
	// vector, interrupt eventfd and counters.
	qcore.Core[cqSource]

	qnum uint32 // 2*index for receive, 2*index+1 for transmit (cq.Entry.Queue)
	rx   bool
	n    uint32
	desc []byte // n descriptors in DMA memory
	r    *ring
	tail uint32 // position of the next descriptor to post
	out  int    // descriptors posted and not yet completed
	db   *doorbell.Doorbell

	eims, eimc doorbell.Reg32 // interrupt unmask/mask, zero when no vector
	eicr       doorbell.Reg32 // interrupt causes (write 1 to clear)
	vbit       uint32         // the vector's bit in EIMS/EIMC
	armed      bool
	// shared is the vector the queue shares with the other queue of its
	// pair (nil when it has one of its own or none); slot is its bit in
	// shared.armed.
	shared *sharedVec
	slot   uint8

	// receive
	bufs   rxbuf.Pool
	bufLen uint32
	posBuf []uint32 // per descriptor: the pool buffer posted there
	meta   []rxMeta // per pool buffer: the write-back of the frame lent
	rss    bool     // RSS on: the write-back carries the hash
	skip   bool     // the next frame is the rest of one without EOP

	// transmit
	pool *dma.Pool // buffer i for descriptor i
	// transmit: context descriptors (txoffload.go)
	silent  []bool       // per descriptor: a context descriptor the device has not passed yet
	ctxOut  int          // context descriptors among out
	ctxs    [2]txContext // what the device's contexts 0 and 1 hold (zero, which no frame matches, until written)
	ctxNext uint8        // the context the next new one replaces

	broken bool
	// flushed are the operations outstanding when the queue closed while
	// it fed a CQ, which reads each as a flushed error completion.
	flushed canceled.List
}

// Size implements nic.Queue.
func (q *queue) Size() int { return int(q.n) }

// Outstanding implements nic.Queue.
func (q *queue) Outstanding() int {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	return q.out - q.ctxOut
}

// usable returns why the queue cannot take an operation. Called locked.
func (q *queue) usable() error {
	switch {
	case q.Closed:
		return q.CloseErr
	case q.broken:
		return nic.ErrBroken
	}
	return nil
}

// room reports whether a descriptor can be posted: one always stays empty,
// since head == tail means an empty ring to the device.
func (q *queue) room() bool { return q.out < int(q.n)-1 }

// Flush implements nic.Queue: the tail register, once per batch (the
// doorbell skips an unchanged value and orders the descriptor stores
// before it).
func (q *queue) Flush() error {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if err := q.usable(); err != nil {
		return err
	}
	before := q.db.Rings()
	q.db.Ring(q.tail)
	if q.db.Rings() != before {
		q.Notifies.Add(1)
	}
	return nil
}

// Ready counts up to max completions written and not yet read.
func (q *queue) Ready(max int) int {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if q.Closed || q.broken || !q.settle() {
		return 0
	}
	return q.r.pending(max)
}

// arm clears the queue's stale interrupt cause (raised for completions
// already read while the vector was masked) and unmasks the vector; the
// caller polls once more afterwards, which covers entries written before.
// Called locked.
func (q *queue) arm() {
	switch {
	case q.shared != nil:
		q.shared.arm(q.slot)
		q.armed = true
	case q.eims.Valid():
		if q.eicr.Valid() {
			q.eicr.Write(q.vbit)
		}
		q.eims.Write(q.vbit)
		q.armed = true
	}
}

// disarm masks it again (a shared vector once neither queue is armed).
// Called locked.
func (q *queue) disarm() {
	if q.armed {
		if q.shared != nil {
			q.shared.disarm(q.slot)
		} else {
			q.eimc.Write(q.vbit)
		}
		q.armed = false
	}
}

// Slots of the queues of a pair in sharedVec.armed.
const (
	slotRx uint8 = 1
	slotTx uint8 = 2
)

// sharedVec is the MSI-X vector of a queue pair whose receive and
// transmit queues share it (Device's perPair mode). Both sleep on its one
// eventfd, so it keeps which of them are armed: one queue's read masks
// the vector (EIMC) only when the other is not asleep on it too, and an
// interrupt taken by one is passed on to the other (it may be for the
// other's completions) as a wake-up on the same eventfd, counted in
// kicks so that it is not passed on again. A wake-up is a hint either way:
// a woken reader polls its queue, and one that finds nothing sleeps again.
type sharedVec struct {
	bit              uint32
	efd              *eventfd.FD
	eims, eimc, eicr doorbell.Reg32

	mu    sync.Mutex
	armed uint8 // slotRx | slotTx

	kicks [slotTx + 1]atomic.Uint64 // wake-ups passed to each slot, not yet taken
}

// arm unmasks the vector for the queue in slot, clearing a stale cause
// first unless the other queue is armed (its cause went out as an
// interrupt already, or will when the EITR interval ends).
func (v *sharedVec) arm(slot uint8) {
	v.mu.Lock()
	if v.armed == 0 {
		v.eicr.Write(v.bit)
	}
	v.armed |= slot
	v.eims.Write(v.bit)
	v.mu.Unlock()
}

// disarm masks the vector once no queue is armed on it.
func (v *sharedVec) disarm(slot uint8) {
	v.mu.Lock()
	v.armed &^= slot
	if v.armed == 0 {
		v.eimc.Write(v.bit)
	}
	v.mu.Unlock()
}

// took accounts for n counts the queue in slot took from the eventfd:
// wake-ups passed to it are its own; so are those passed to the other
// queue, which was then not asleep (eventfd wakes sleepers in turn, the
// first one first) and polls again before it sleeps. The rest are
// interrupts, and go on to the other queue when it is armed.
func (v *sharedVec) took(slot uint8, n uint64) {
	n -= takeUpTo(&v.kicks[slot], n)
	n -= takeUpTo(&v.kicks[slot^(slotRx|slotTx)], n)
	if n == 0 {
		return
	}
	v.mu.Lock()
	other := v.armed&^slot != 0
	v.mu.Unlock()
	if other {
		v.kicks[slot^(slotRx|slotTx)].Add(1)
		_ = v.efd.Add(1)
	}
}

// takeUpTo takes up to n from c and returns how much it took.
func takeUpTo(c *atomic.Uint64, n uint64) uint64 {
	for {
		k := c.Load()
		t := min(k, n)
		if t == 0 || c.CompareAndSwap(k, k-t) {
			return t
		}
	}
}

// tookShared passes n interrupts taken from the queue's eventfd on to
// the other queue of its pair, which shares the vector (Core.OnTook).
func (q *queue) tookShared(n uint64) { q.shared.took(q.slot, n) }

// Arm implements nic.Queue. The device raises one interrupt per written
// descriptor (subject to EITR moderation), not per threshold, so the
// threshold is left to SRead's re-poll.
func (q *queue) Arm(threshold int) error {
	q.TakeLeft()
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if err := q.usable(); err != nil {
		return err
	}
	if q.EFD == nil || !q.eims.Valid() {
		return q.NoInterrupt()
	}
	q.arm()
	return nil
}

// Interrupt implements nic.Queue: nil without a vector
// (NoQueueInterrupts), and the same eventfd for both queues of a pair
// that share one. A program that waits on it itself rather than through
// WaitInterrupt reads both queues of such a pair after a wake-up (the
// interrupt may be for either), from one thread: an lcore.Core that
// serves both does, while two cores that each serve one could take each
// other's interrupt.
func (q *queue) Interrupt() *eventfd.FD { return q.EFD }

// close marks the queue closed; later operations return why (nic.ErrClosed,
// or an error wrapping it and nic.ErrRemoved when the kernel took the
// device back). A second close does nothing.
//
// Receive buffers still posted go back to the pool, once: the device no
// longer owns them, and their operations complete with nothing to lend.
// A queue that feeds a cq.CQ keeps every operation still posted, in ring
// (posting) order, for the CQ to read as flushed (cq.ECANCELED) after
// what it read before, and wakes a reader blocked on the CQ; a queue that
// feeds none reports nothing, its Poll returning 0 as before.
//
// The ring is not read again, not even for descriptors the device had
// written back: teardown resets the device and unmaps the DMA memory
// right after the queues close, so a later read would fault, and a
// receive completion would lend the caller a frame in memory about to
// go. A descriptor the device completed but nobody read is reported
// flushed: a flushed completion says the driver cannot report the
// outcome, not that nothing happened (a frame may have gone out).
func (q *queue) close(why error) {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if q.Closed {
		return
	}
	q.Closed = true
	q.CloseErr = why
	if q.rx {
		q.bufs.RecyclePosted()
	}
	if q.Src == nil || q.r == nil {
		return
	}
	q.keepFlushed()
	if q.flushed.Len() > 0 && q.Src.irq != nil {
		// As a last interrupt would: a reader asleep on the CQ wakes to
		// read them (the device's vectors go quiet now).
		_ = q.Src.irq.Add(1)
	}
}

// keepFlushed keeps a flushed completion for each operation the table
// still holds, in posting order, leaving out context descriptors (the
// queue's own). The table's slots are ring positions, visited from 0:
// when the outstanding run wraps past the end of the ring (more
// outstanding than the tail's position), the first tail slots visited
// were posted last. Called locked, closing.
func (q *queue) keepFlushed() {
	var ctxs []any
	q.r.tab.Each(func(ctx any) { ctxs = append(ctxs, ctx) })
	if t := int(q.tail); len(ctxs) > t {
		ctxs = append(ctxs[t:], ctxs[:t]...)
	}
	for _, ctx := range ctxs {
		if ctx != any(ctxSlot) {
			q.flushed.Add(ctx, q.Pair, cq.ECANCELED)
		}
	}
}

// next takes the next completion into c, for Poll and for the CQ the
// queue feeds alike: cq/ring's single read and checks of the write-back
// descriptor (DD, the length against the posted buffer, the EOP status,
// and the offload words into c.Meta, all from one copy), then the queue's
// bookkeeping. A descriptor without EOP and the rest of its frame complete
// with cq.ETRUNC (provMultiBuffer); a frame with RXE (provRxError) or
// shorter than an Ethernet header (cq.ProvBadLen) with cq.EIO, as virtio
// refuses a short one; DD where nothing was posted, or a hole, breaks the
// queue: the ring and the posted descriptors are out of step. The buffer
// of a refused entry goes back to the pool (c.Buf is then 0), its context
// kept. Called locked; the caller ends a batch with finish.
func (q *queue) next(c *cqring.Completion) bool {
again:
	if q.Closed || q.broken || !q.settle() || !q.r.src.Next(c) {
		return false
	}
	c.Queue = q.qnum
	if !c.Done {
		q.broken = true // an entry that named no posted descriptor
		return true
	}
	q.out--
	if !q.rx {
		if c.Context == any(ctxSlot) {
			q.ctxOut-- // a context descriptor (SendChecksum): the queue's own
			goto again
		}
		return true
	}
	b := q.posBuf[c.Pos]
	switch {
	case c.Prov == provMultiBuffer:
		q.skip = true // the rest of the frame follows
	case c.Err == 0 && q.skip:
		q.skip = false // the last part of a frame without EOP
		c.Err, c.Prov = cq.ETRUNC, provMultiBuffer
	case c.Err == 0 && uint32(c.Meta[1])&rxdErrRXE != 0:
		// RCTL.SBP is off: a device that hands over a bad frame anyway
		// misbehaves, and its frame is not one to deliver.
		c.Err, c.Prov = cq.EIO, provRxError
	case c.Err == 0 && c.Len < nic.MinFrame:
		c.Err, c.Prov = cq.EIO, cq.ProvBadLen
	}
	if c.Err != 0 {
		q.bufs.Recycle(b) // a buffer this queue posted at c.Pos
		c.Buf = 0
		return true
	}
	q.bufs.Lend(b)
	q.meta[b] = rxMeta{c.Meta[0], c.Meta[1]}
	return true
}

// finish ends a batch of n completions, errs of them errors: the ring
// reader publishes what it freed, the counters move, and an armed vector
// is masked again, unless the queue feeds a CQ, whose request-notify lasts
// until the interrupt fires (a read must not cancel it). Called locked.
func (q *queue) finish(n, errs int, bytes uint64) {
	q.r.src.Publish()
	if n == 0 {
		return
	}
	if q.Src == nil {
		q.disarm()
	}
	q.Count(n, errs, bytes)
}

// errOf maps the code of a refused completion to the nic error it carries
// (prepared errors: nothing is allocated).
func errOf(prov cq.ProvErrno) error {
	switch prov {
	case cq.ProvBadID, cq.ProvBadQueue:
		return errBadID
	case cq.ProvBadLen:
		return errBadLen
	case cq.ProvBadPhase:
		return errBadPhase
	case provMultiBuffer:
		return errMultiBuffer
	case provRxError:
		return errRxError
	}
	return errBadStatus
}

// poll implements Poll for both directions. Called locked.
func (q *queue) poll(out []nic.Completion) int {
	n, errs := 0, 0
	var bytes uint64
	var c cqring.Completion
	for n < len(out) && q.next(&c) {
		o := &out[n]
		n++
		if c.Err != 0 {
			*o = nic.Completion{Context: c.Context, Len: c.Len, Queue: q.Pair, Err: errOf(c.Prov)}
			errs++
			break
		}
		*o = nic.Completion{Context: c.Context, Len: c.Len, Queue: q.Pair}
		if q.rx {
			o.Buf = c.Buf
			o.Data = q.bufs.Bytes(c.Buf, c.Len)
		}
		bytes += uint64(c.Len)
	}
	q.finish(n, errs, bytes)
	return n
}

// Poll implements nic.Queue.
func (q *queue) Poll(out []nic.Completion) int {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	switch {
	case q.Closed:
		return 0
	case q.Src != nil && len(out) > 0:
		// A bound queue says so, instead of an empty read that looks
		// like an idle queue.
		out[0] = nic.Completion{Queue: q.Pair, Err: nic.ErrBound}
		return 1
	}
	return q.poll(out)
}

// SRead implements nic.Queue.
func (q *queue) SRead(ctx context.Context, out []nic.Completion, threshold int, timeout time.Duration) (int, error) {
	q.Mu.Lock()
	bound := q.Src != nil
	q.Mu.Unlock()
	if bound {
		return 0, fmt.Errorf("%w (queue %s)", nic.ErrBound, q.Name)
	}
	return nic.SRead(ctx, q, out, threshold, timeout)
}

// postTail records an operation for the descriptor at the tail. The table
// hands out positions in ring order; any other position means the ring
// and the table disagree, and breaks the queue. Called locked, with room.
func (q *queue) postTail(ctx any, buf uintptr, length int) error {
	pos, err := q.r.post(ctx, buf, length, q.rx)
	if err == nil && pos != q.tail {
		q.broken = true
		err = fmt.Errorf("%w: igb %s: table position %d, tail %d", nic.ErrBroken, q.Name, pos, q.tail)
	}
	return err
}

// advance hands the descriptor written at the tail over and moves the
// tail (the device sees it at the next Flush).
func (q *queue) advance() {
	q.out++
	if q.tail++; q.tail == q.n {
		q.tail = 0
	}
}

// writeDesc stores a read-format descriptor: the buffer address, then the
// second quadword, which for a receive descriptor clears DD (hdr_addr 0).
func (q *queue) writeDesc(pos uint32, addr, word1 uint64) {
	p := unsafe.Pointer(&q.desc[uintptr(pos)*descSize])
	atomic.StoreUint64((*uint64)(p), addr)
	atomic.StoreUint64((*uint64)(unsafe.Add(p, 8)), word1)
}

// RxQueue is an igb receive queue (nic.RxQueue).
type RxQueue struct{ queue }

var (
	_ nic.RxQueue          = (*RxQueue)(nil)
	_ nic.InterruptSteerer = (*RxQueue)(nil)
)

// MaxFrame implements nic.RxQueue.
func (q *RxQueue) MaxFrame() int { return int(q.bufLen) }

// PostRecv implements nic.RxQueue.
func (q *RxQueue) PostRecv(ctx any) error {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if err := q.usable(); err != nil {
		return err
	}
	if !q.room() {
		return errNoDesc
	}
	b, ok := q.bufs.Get()
	if !ok {
		return errNoBuffer
	}
	return q.post(b, ctx)
}

// PostRecvBuf is PostRecv that also returns the buffer the frame will land
// in (MaxFrame bytes, starting at the address its completion reports as
// Buf), for callers that match posts to completions by buffer. The device
// owns the bytes until the completion is read.
func (q *RxQueue) PostRecvBuf(ctx any) ([]byte, error) {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if err := q.usable(); err != nil {
		return nil, err
	}
	if !q.room() {
		return nil, errNoDesc
	}
	b, ok := q.bufs.Get()
	if !ok {
		return nil, errNoBuffer
	}
	if err := q.post(b, ctx); err != nil {
		return nil, err
	}
	return q.bufs.Buf(b)[:q.bufLen], nil
}

// post lends pool buffer b to the device at the tail. Called locked with
// room.
func (q *RxQueue) post(b uint32, ctx any) error {
	if err := q.postTail(ctx, q.bufs.Start(b), int(q.bufLen)); err != nil {
		q.bufs.Recycle(b)
		return err
	}
	q.bufs.Posted(b)
	q.posBuf[q.tail] = b
	q.writeDesc(q.tail, q.bufs.Addr(b), 0)
	q.advance()
	return nil
}

// Repost implements nic.RxQueue.
func (q *RxQueue) Repost(buf uintptr, ctx any) error {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if err := q.usable(); err != nil {
		return err
	}
	b, err := q.bufs.Lent(buf)
	if err != nil {
		return err
	}
	if !q.room() {
		return errNoDesc
	}
	return q.post(b, ctx)
}

// Release implements nic.RxQueue.
func (q *RxQueue) Release(buf uintptr) error {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if q.Closed {
		return nic.ErrClosed
	}
	return q.bufs.Release(buf)
}

// Frame implements nic.RxQueue.
func (q *RxQueue) Frame(buf uintptr, length int) ([]byte, error) {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if q.Closed {
		return nil, nic.ErrClosed
	}
	return q.bufs.Frame(buf, length, int(q.bufLen))
}

// TxQueue is an igb transmit queue (nic.TxQueue). Descriptor i always
// uses transmit buffer i.
type TxQueue struct {
	queue
	maxFrame int
}

var (
	_ nic.TxQueue          = (*TxQueue)(nil)
	_ nic.InterruptSteerer = (*TxQueue)(nil)
)

// MaxFrame implements nic.TxQueue.
func (q *TxQueue) MaxFrame() int { return q.maxFrame }

// Send implements nic.TxQueue: one advanced data descriptor with EOP, IFCS
// (the device appends the FCS) and RS (report status: DD is written back).
func (q *TxQueue) Send(frame []byte, ctx any) error {
	if len(frame) < nic.MinFrame || len(frame) > q.maxFrame {
		return errFrameSize
	}
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if err := q.usable(); err != nil {
		return err
	}
	if !q.room() {
		return errNoDesc
	}
	if _, err := q.take(frame, ctx); err != nil {
		return err
	}
	q.commit(len(frame), 0)
	return nil
}

// take copies frame into the buffer of the descriptor at the tail and
// records the operation; commit then writes the descriptor. Called locked,
// with room.
func (q *TxQueue) take(frame []byte, ctx any) ([]byte, error) {
	buf := q.pool.Buf(q.tail)
	n := copy(buf, frame)
	if err := q.postTail(ctx, uintptr(unsafe.Pointer(&buf[0])), n); err != nil {
		return nil, err
	}
	return buf[:n], nil
}

// commit writes the data descriptor of an n-byte frame at the tail, with
// olinfo's offload bits (POPTS, IDX), and moves the tail.
func (q *TxQueue) commit(n int, olinfo uint64) {
	pos := q.tail
	cmd := uint64(n) | txdDTypData | txdCmdDEXT | txdCmdIFCS | txdCmdEOP | txdCmdRS
	olinfo |= uint64(n) << txdPaylenSh
	q.writeDesc(pos, q.pool.Addr(pos), cmd|olinfo<<32)
	q.advance()
}

// ringAddr is the address of the ring's first descriptor (its IOVA in an
// identity space; tests compare it with RDBAL).
func (q *queue) ringAddr() unsafe.Pointer { return unsafe.Pointer(&q.desc[0]) }
