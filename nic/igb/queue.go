package igb

import (
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/vfnic/vfnic/cq"
	cqring "github.com/vfnic/vfnic/cq/ring"
	"github.com/vfnic/vfnic/dma"
	"github.com/vfnic/vfnic/doorbell"
	"github.com/vfnic/vfnic/eventfd"
	"github.com/vfnic/vfnic/nic"
	qcore "github.com/vfnic/vfnic/nic/internal/queue"
	"github.com/vfnic/vfnic/nic/internal/rxbuf"
)

// Errors returned on the data path, prepared once so returning them does
// not allocate.
var (
	errNoDesc    = qcore.ErrNoDesc
	errFrameSize = qcore.ErrFrameSize

	errBadID       = fmt.Errorf("%w: igb: DD on a descriptor that was not posted (queue broken)", cq.ProvBadID)
	errBadLen      = fmt.Errorf("%w: igb: write-back length beyond the posted buffer or below an Ethernet header", cq.ProvBadLen)
	errBadPhase    = fmt.Errorf("%w: igb: descriptor without DD before one with DD (queue broken)", cq.ProvBadPhase)
	errMultiBuffer = fmt.Errorf("%w: igb: descriptor without EOP, or the rest of such a frame", cq.ProvMultiBuffer)
	errBadStatus   = fmt.Errorf("%w: igb: write-back status the device may not write (%w)", cq.ProvBadStatus, nic.ErrDeviceFailed)
	errRxError     = fmt.Errorf("%w: igb: write-back with RXE (a frame received in error, which the driver does not ask the device to store)", nic.ErrDeviceStatus)
)

// queue is what receive and transmit queues share: the core's queue
// (lock, closed state, the CQ fed, counters, Poll, the CQ's reader) over
// the descriptor ring, its reader, its tail doorbell and its interrupt
// vector. All of it is guarded by Mu, whichever way the queue is read
// (Poll, or the CQ it feeds).
type queue struct {
	qcore.Queue

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

	// noCsum: nic.Config turned this direction's checksum offload off;
	// the network stack's methods decline (csum.go).
	noCsum bool

	broken bool
}

// room reports whether a descriptor can be posted: one always stays empty,
// since head == tail means an empty ring to the device.
func (q *queue) room() bool { return q.out < int(q.n)-1 }

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

// Interrupt implements nic.Queue: nil without a vector
// (NoQueueInterrupts), and the same eventfd for both queues of a pair
// that share one. A program that waits on it itself rather than through
// WaitInterrupt reads both queues of such a pair after a wake-up (the
// interrupt may be for either), from one thread: an lcore.Core that
// serves both does, while two cores that each serve one could take each
// other's interrupt.
func (q *queue) Interrupt() *eventfd.FD { return q.EFD }

// read takes up to len(cs) completions into cs, for Poll and for the CQ
// the queue feeds alike: cq/ring's batch read of the write-back
// descriptors (DD, the length against the posted buffer, the EOP status,
// and the offload words into c.Meta, each entry from one copy), then one
// pass of the queue's bookkeeping over the batch. A descriptor without EOP
// and the rest of its frame complete with cq.ETRUNC (provMultiBuffer); a
// frame with RXE (provRxError) or shorter than an Ethernet header
// (cq.ProvBadLen) with cq.EIO, as virtio refuses a short one; DD where
// nothing was posted, or a hole, breaks the queue: the ring and the posted
// descriptors are out of step. A refused entry keeps its buffer in c.Buf
// and its context: the core recycles the buffer. Context descriptors are
// the queue's own and not returned. Called locked; the core ends a batch
// with Publish.
func (q *queue) read(cs []cqring.Completion) int {
	n := 0
	for n < len(cs) && !q.broken && q.settle() {
		k := q.r.src.NextBatch(cs[n:q.untilSilent(n, len(cs))])
		if k == 0 {
			break
		}
		last := cs[n+k-1].Err != 0
		n += q.pass(cs[n : n+k])
		if last {
			break
		}
	}
	return n
}

// untilSilent bounds a batch read from the head at the next context
// descriptor the device has not passed (settle completes it when the head
// reaches it): read as a hole, it would break the queue. It returns the
// end in cs of a batch starting at n.
func (q *queue) untilSilent(n, end int) int {
	if q.ctxOut == 0 {
		return end
	}
	h := q.r.src.Ring().Head()
	for i := 1; n+i < end; i++ {
		if q.silent[(h+uint32(i))&(q.n-1)] {
			return n + i
		}
	}
	return end
}

// pass is read's bookkeeping over a batch: it returns how many of cs are
// kept, in place, after dropping context descriptors.
func (q *queue) pass(cs []cqring.Completion) int {
	if q.rx {
		return q.rxPass(cs)
	}
	w := 0
	for i := range cs {
		c := &cs[i]
		if !c.Done {
			q.broken = true // an entry that named no posted descriptor
		} else if q.out--; c.Context == any(ctxSlot) {
			q.ctxOut-- // a context descriptor (SendChecksum): the queue's own
			continue
		}
		if w != i {
			cs[w] = *c
		}
		w++
	}
	return w
}

// rxPass is pass for a receive queue, which keeps every entry: the
// common one (a whole good frame) in the loop, the others out of line.
func (q *queue) rxPass(cs []cqring.Completion) int {
	done := 0 // q.out's decrement, stored once
	for i := range cs {
		c := &cs[i]
		if !c.Done {
			q.broken = true // an entry that named no posted descriptor
			continue
		}
		done++
		if c.Err != 0 || q.skip || uint32(c.Meta[1])&rxdErrRXE != 0 || c.Len < nic.MinFrame {
			q.rxOdd(c)
			continue
		}
		q.meta[q.bufs.Of(c.Buf)] = rxMeta{c.Meta[0], c.Meta[1]}
	}
	q.out -= done
	return len(cs)
}

// rxOdd is rxPass for an entry refused, part of a frame without EOP, with
// the device's error bit, or shorter than a frame. Cold path.
func (q *queue) rxOdd(c *cqring.Completion) {
	switch {
	case c.Prov == provMultiBuffer:
		q.skip = true // the rest of the frame follows
	case c.Err == 0 && q.skip:
		q.skip = false // the last part of a frame without EOP
		c.Err, c.Prov = cq.ETRUNC, provMultiBuffer
	case c.Err == 0 && uint32(c.Meta[1])&rxdErrRXE != 0:
		// RCTL.SBP is off: a device that hands over a bad frame
		// anyway misbehaves, and its frame is not one to deliver.
		c.Err, c.Prov = cq.EIO, provRxError
	case c.Err == 0 && c.Len < nic.MinFrame:
		c.Err, c.Prov = cq.EIO, cq.ProvBadLen
	}
	if c.Err == 0 {
		q.meta[q.bufs.Of(c.Buf)] = rxMeta{c.Meta[0], c.Meta[1]}
	}
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

// postTail records an operation for the descriptor at the tail. The table
// hands out positions in ring order; any other position means the ring
// and the table disagree, and breaks the queue. Called locked, with room.
func (q *queue) postTail(ctx any, buf uintptr, length int, own uint16) error {
	pos, err := q.r.post(ctx, buf, length, q.rx, q.Word(own))
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
type RxQueue struct {
	queue
	qcore.Rx
}

var (
	_ nic.RxQueue          = (*RxQueue)(nil)
	_ nic.InterruptSteerer = (*RxQueue)(nil)
)

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
func (q *TxQueue) Send(frame []byte, ctx any) error { return q.send(len(frame), ctx, frame, nil) }

// SendFunc implements nic.TxQueue: fill writes into the DMA buffer of the
// descriptor at the tail.
func (q *TxQueue) SendFunc(n int, ctx any, fill func([]byte)) error {
	return qcore.SendFunc(q.send, n, ctx, fill)
}

// SendBurst implements nic.TxQueue: one lock for the burst, a data
// descriptor per frame as Send's.
func (q *TxQueue) SendBurst(frames [][]byte, ctxs []any) (int, error) {
	return q.BurstVia(frames, ctxs, q.maxFrame, q.post)
}

// send posts an n-byte frame, copied from frame or written by fill.
func (q *TxQueue) send(n int, ctx any, frame []byte, fill func([]byte)) error {
	if err := q.LockSend(n, q.maxFrame); err != nil {
		return err
	}
	defer q.Mu.Unlock()
	return q.post(n, ctx, frame, fill)
}

// post is send's qcore.Post: the frame into the buffer at the tail, its
// descriptor written.
func (q *TxQueue) post(n int, ctx any, frame []byte, fill func([]byte)) error {
	if !q.room() {
		return errNoDesc
	}
	if _, err := q.take(n, frame, fill, ctx); err != nil {
		return err
	}
	q.commit(n, 0)
	return nil
}

// take puts an n-byte frame (copied from frame, or written by fill) into
// the buffer of the descriptor at the tail and records the operation;
// commit then writes the descriptor. Called locked, with room.
func (q *TxQueue) take(n int, frame []byte, fill func([]byte), ctx any) ([]byte, error) {
	buf := q.pool.Buf(q.tail)[:n:n]
	qcore.Write(buf, frame, fill)
	if err := q.postTail(ctx, uintptr(unsafe.Pointer(&buf[0])), n, 0); err != nil {
		return nil, err
	}
	return buf, nil
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
