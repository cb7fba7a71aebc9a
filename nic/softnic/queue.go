package softnic

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/vfnic/vfnic/cq"
	cqring "github.com/vfnic/vfnic/cq/ring"
	"github.com/vfnic/vfnic/dma"
	"github.com/vfnic/vfnic/doorbell"
	"github.com/vfnic/vfnic/hugepage"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/nic/internal/canceled"
	qcore "github.com/vfnic/vfnic/nic/internal/queue"
	"github.com/vfnic/vfnic/nic/internal/rxbuf"
)

// Errors returned on the data path, prepared once so that returning them
// does not allocate.
var (
	errNoBuffer  = fmt.Errorf("%w: every receive buffer is lent out (Release some)", nic.ErrFull)
	errNoDesc    = fmt.Errorf("%w: every descriptor is posted (read completions first)", nic.ErrFull)
	errFrameSize = fmt.Errorf("%w: frame outside [%d, MaxFrame] bytes", nic.ErrFrameSize, nic.MinFrame)
	errCanceled  = fmt.Errorf("%w (%w)", nic.ErrCanceled, nic.ErrRemoved)

	errBadID       = fmt.Errorf("%w: softnic: completion for an operation that is not outstanding", cq.ProvBadID)
	errBadLen      = fmt.Errorf("%w: softnic: completion length beyond the posted buffer", cq.ProvBadLen)
	errBadPhase    = fmt.Errorf("%w: softnic: completion out of phase before a valid one", cq.ProvBadPhase)
	errBadOp       = fmt.Errorf("%w: softnic: completion for another kind of operation", cq.ProvBadOp)
	errMultiBuffer = fmt.Errorf("%w: softnic: a part of a frame longer than a receive buffer", cq.ProvMultiBuffer)
	errBadStatus   = fmt.Errorf("%w: softnic: completion status the device does not define", cq.ProvBadStatus)
)

// desc is a posted operation as the device reads it: the buffer's device
// address and length, and the id its completion carries.
type desc struct {
	addr uint64
	len  uint32
	id   uint32
}

// queue is what receive and transmit queues share. The driver side is
// guarded by Core.Mu; the device side (dev) by its own lock; they meet
// through the published tail and the consumed head (atomics) and the
// completion ring's ownership bits, as a driver and a device do.
type queue struct {
	qcore.Core[cqSource]

	d    *Device
	rx   bool
	qnum uint32 // 2*index for receive, 2*index+1 for transmit (cq.Entry.Queue)
	n    uint32 // descriptors, and operations outstanding at most

	src *cqring.RingSource
	tab *cqring.Table

	desc   []desc        // n, written by the driver at tail, read by the device at head
	tail   uint32        // driver: descriptors posted (free-running)
	pub    atomic.Uint32 // the tail published by Flush
	head   atomic.Uint32 // device: descriptors consumed (free-running)
	out    int           // operations posted and not completed
	seq    uint64        // posts so far, for the order of flushed operations
	seqs   []uint64      // per table slot: the post's seq
	lastID uint32        // the id of the last post
	mem    []byte        // the queue's DMA region, which the device translates into
	base   uint64        // its device address
	dev    *devRing      // the device side
	rgn    *dma.Region   // freed with the device's space
	armd   bool          // the device side is armed (Arm, until a Poll reads)

	flushed canceled.List

	// receive
	bufs   rxbuf.Pool
	bufLen uint32
	skip   bool // the next completions are the rest of a frame spanning buffers

	// transmit
	pool     *dma.Pool
	txBuf    []uint32 // per table slot: the buffer of the frame posted there
	maxFrame int
}

// newQueue sets up the memory, rings and reader of a queue with n
// descriptors and extra bytes for its buffers.
func newQueue(d *Device, q *queue, i, n int, rx bool, extra int, mem hugepage.Options) error {
	kind, qnum := "tx", uint32(2*i+1)
	if rx {
		kind, qnum = "rx", uint32(2*i)
	}
	q.d, q.rx, q.qnum, q.n = d, rx, qnum, uint32(n)
	q.Name, q.Pair, q.Vector = fmt.Sprintf("%s%d", kind, i), i, -1
	q.NoIRQHint = ""
	efd, err := newEFD()
	if err != nil {
		return err
	}
	q.EFD = efd
	entries := 2 * n // room for the entries ring faults add
	r, err := d.space.Alloc(entries*entrySize+64+extra+4096, mem)
	if err != nil {
		_ = efd.Close()
		q.EFD = nil
		return fmt.Errorf("softnic: %s memory: %w", q.Name, err)
	}
	q.rgn, q.mem, q.base = r, r.Bytes(), r.IOVA()
	ring, err := r.Carve(entries*entrySize, 64)
	if err != nil {
		return err
	}
	page, err := r.Carve(64, 64)
	if err != nil {
		return err
	}
	if q.dev, err = newDevRing(ring.Bytes, page.Bytes, entries, efd); err != nil {
		return err
	}
	q.src, err = cqring.NewRingSource(cqring.RingConfig{
		Mem: ring.Bytes, Layout: layout(entries), Codes: codes,
		Regs: cqring.RingRegs{Doorbell: doorbell.NewDoorbell(q.dev.cons)},
	})
	if err != nil {
		return err
	}
	// The queue converts entries itself (for Poll and for a bound CQ),
	// so the reader always fills every field.
	if err := q.src.Attach(cq.FormatData); err != nil {
		return err
	}
	if q.tab, err = cqring.NewTable(n, 32); err != nil {
		return err
	}
	if err := q.src.BindTable(0, q.tab); err != nil {
		return err
	}
	q.desc, q.seqs = make([]desc, n), make([]uint64, n)
	return nil
}

// Size implements nic.Queue.
func (q *queue) Size() int { return int(q.n) }

// Outstanding implements nic.Queue.
func (q *queue) Outstanding() int {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	return q.out
}

// Ready counts up to max completions written and not yet read.
func (q *queue) Ready(max int) int {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if q.Closed {
		return 0
	}
	return q.src.Pending(max)
}

// usable returns why the queue cannot take an operation. Called locked.
func (q *queue) usable() error {
	if q.Closed {
		return q.CloseErr
	}
	return nil
}

// Flush implements nic.Queue: the tail goes to the device, and a transmit
// queue's device carries what was posted to the wire before Flush
// returns.
func (q *queue) Flush() error {
	q.Mu.Lock()
	if err := q.usable(); err != nil {
		q.Mu.Unlock()
		return err
	}
	moved := q.pub.Load() != q.tail
	if moved {
		q.pub.Store(q.tail)
		q.Notifies.Add(1)
	}
	q.Mu.Unlock()
	if moved && !q.rx {
		q.transmit()
	}
	return nil
}

// post records an operation and writes its descriptor at the tail. Called
// locked.
func (q *queue) post(op cqring.Op, addr uint64) error {
	if q.out >= int(q.n) || q.tail-q.head.Load() >= q.n {
		return errNoDesc
	}
	id, err := q.tab.Post(op)
	if err != nil {
		return errors.Join(errNoDesc, err)
	}
	q.desc[q.tail&(q.n-1)] = desc{addr: addr, len: uint32(op.Len), id: id}
	q.lastID = id
	q.seqs[id&(q.n-1)] = q.seq
	q.seq++
	q.tail++
	q.out++
	return nil
}

// next takes the next completion into c, for Poll and the CQ the queue
// feeds alike: cq/ring's single read and checks of the entry, then the
// queue's bookkeeping. A refused entry that named an outstanding
// operation completes it (its receive buffer back to the pool, c.Buf 0);
// one that named none completes nothing. Called locked; the caller ends
// a batch with finish.
func (q *queue) next(c *cqring.Completion) bool {
	if q.Closed || !q.src.Next(c) {
		return false
	}
	c.Queue = q.qnum
	if !c.Done {
		return true // an entry naming nothing outstanding: an error with no buffer
	}
	q.out--
	if !q.rx {
		_ = q.pool.Put(q.txBuf[c.ID&(q.n-1)]) // the buffer posted under the id
		c.Buf = 0
		return true
	}
	b := q.bufs.Of(c.Buf)
	switch {
	case c.Prov == provMultiBuffer:
		q.skip = true // the rest of the frame follows
	case c.Err == 0 && q.skip:
		q.skip = false // the last part of a frame spanning buffers
		c.Err, c.Prov = cq.ETRUNC, provMultiBuffer
	}
	if c.Err != 0 {
		q.bufs.Recycle(b)
		c.Buf = 0
		return true
	}
	q.bufs.Lend(b)
	return true
}

// finish ends a batch of n completions, errs of them errors: the reader
// publishes its consumer count and the ids it freed, the counters move,
// and an armed interrupt is cancelled unless the queue feeds a CQ (whose
// request lasts until the interrupt fires). Called locked.
func (q *queue) finish(n, errs int, bytes uint64) {
	q.src.Publish()
	if n == 0 {
		return
	}
	if q.Src == nil && q.armd {
		q.armd = false
		q.dev.disarm()
	}
	q.Count(n, errs, bytes)
}

// errOf maps the code of a refused completion to the nic error it carries.
func errOf(prov cq.ProvErrno) error {
	switch prov {
	case cq.ProvBadID, cq.ProvBadQueue:
		return errBadID
	case cq.ProvBadLen:
		return errBadLen
	case cq.ProvBadPhase:
		return errBadPhase
	case cq.ProvBadOp:
		return errBadOp
	case provMultiBuffer:
		return errMultiBuffer
	}
	return errBadStatus
}

// Poll implements nic.Queue.
func (q *queue) Poll(out []nic.Completion) int {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	switch {
	case len(out) == 0:
		return 0
	case q.Closed:
		if q.Src != nil {
			return 0
		}
		return q.flushed.Take(out)
	case q.Src != nil:
		// A bound queue says so, instead of an empty read that looks
		// like an idle queue.
		out[0] = nic.Completion{Queue: q.Pair, Err: nic.ErrBound}
		return 1
	}
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

// SRead implements nic.Queue.
func (q *queue) SRead(ctx context.Context, out []nic.Completion, threshold int, timeout time.Duration) (int, error) {
	if q.Bound() {
		return 0, q.ErrBound()
	}
	return nic.SRead(ctx, q, out, threshold, timeout)
}

// Arm implements nic.Queue: one interrupt once threshold completions
// beyond those read are written, counting only completions written after
// the arm (the strictest hardware: callers poll again after arming).
func (q *queue) Arm(threshold int) error {
	q.TakeLeft()
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if err := q.usable(); err != nil {
		return err
	}
	if q.Src != nil {
		return q.ErrBound()
	}
	q.armd = true
	q.dev.arm(q.src.Ring().Count(), threshold)
	return nil
}

// Raised counts the interrupts the device raised on the queue (on its
// eventfd, or the CQ's it feeds), whether or not a reader took them.
func (q *queue) Raised() uint64 { return q.dev.raised.Load() }

// SteerInterrupt implements nic.InterruptSteerer: a software device's
// eventfd has no IRQ to steer.
func (q *queue) SteerInterrupt(int) error {
	return fmt.Errorf("%w: softnic %s: a software interrupt has no IRQ affinity", nic.ErrNotSupported, q.Name)
}

// close stops the queue: later operations return why. The device side
// writes nothing more, receive buffers still posted go back to the pool,
// and the operations still outstanding are kept for the CQ the queue
// feeds (flushed, cq.ECANCELED, in posting order) or, when why says the
// device was taken back, for Poll (nic.ErrCanceled). The ring is not read
// again: an operation the device finished but nobody read is flushed too.
func (q *queue) close(why error) {
	if q.dev != nil {
		q.dev.mu.Lock()
		q.dev.dead = true
		q.dev.mu.Unlock()
	}
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if q.Closed {
		return
	}
	q.Closed, q.CloseErr = true, why
	if q.tab == nil {
		return // never set up
	}
	bound := q.Src != nil
	if bound || errors.Is(why, nic.ErrRemoved) {
		for _, ctx := range q.outstanding() {
			if bound {
				q.flushed.Add(ctx, q.Pair, cq.ECANCELED)
			} else {
				q.flushed.Add(ctx, q.Pair, errCanceled)
			}
		}
	}
	if q.rx {
		// The table is the one record of the buffers the wire still holds.
		q.tab.EachPosted(func(_ uint32, _ any, buf uintptr, _ uint64) { q.bufs.Recycle(q.bufs.Of(buf)) })
	}
	if bound && q.flushed.Len() > 0 && q.Src.irq != nil {
		_ = q.Src.irq.Add(1) // a reader asleep on the CQ wakes to read them
	}
}

// outstanding lists the contexts of the operations still outstanding, in
// posting order. Close path: it allocates.
func (q *queue) outstanding() []any {
	type op struct {
		seq uint64
		ctx any
	}
	var ops []op
	q.tab.EachID(func(id uint32, ctx any) { ops = append(ops, op{q.seqs[id&(q.n-1)], ctx}) })
	sort.Slice(ops, func(i, j int) bool { return ops[i].seq < ops[j].seq })
	ctxs := make([]any, len(ops))
	for i, o := range ops {
		ctxs[i] = o.ctx
	}
	return ctxs
}

// translate is the device's IOMMU: the n bytes at device address addr,
// nil when they are not all inside the queue's memory.
func (q *queue) translate(addr uint64, n uint32) []byte {
	if addr < q.base || addr-q.base > uint64(len(q.mem)) || uint64(len(q.mem))-(addr-q.base) < uint64(n) {
		return nil
	}
	off := addr - q.base
	return q.mem[off : off+uint64(n) : off+uint64(n)]
}

// RxQueue is a receive queue (nic.RxQueue).
type RxQueue struct{ queue }

var (
	_ nic.RxQueue          = (*RxQueue)(nil)
	_ nic.InterruptSteerer = (*RxQueue)(nil)
)

func newRxQueue(d *Device, i, n, bufs, bufSize int, mem hugepage.Options) (*RxQueue, error) {
	q := &RxQueue{}
	stride := (bufSize + 63) &^ 63
	err := newQueue(d, &q.queue, i, n, true, bufs*stride, mem)
	if err == nil {
		var p *dma.Pool
		if p, err = dma.NewPool(q.rgn, bufs, bufSize); err == nil {
			q.bufs, q.bufLen = rxbuf.New(p, 0), uint32(bufSize)
		}
	}
	if err != nil {
		q.close(nic.ErrClosed)
		if q.EFD != nil {
			_ = q.EFD.Close()
		}
		return nil, err
	}
	return q, nil
}

// MaxFrame implements nic.RxQueue: a buffer's size.
func (q *RxQueue) MaxFrame() int { return int(q.bufLen) }

// PostRecv implements nic.RxQueue.
func (q *RxQueue) PostRecv(ctx any) error {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	_, err := q.postFree(ctx)
	return err
}

// PostRecvBuf is PostRecv that also returns the buffer the frame will land
// in (MaxFrame bytes, starting at the address its completion reports as
// Buf). The device owns the bytes until the completion is read.
func (q *RxQueue) PostRecvBuf(ctx any) ([]byte, error) {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	b, err := q.postFree(ctx)
	if err != nil {
		return nil, err
	}
	return q.bufs.Buf(b)[:q.bufLen], nil
}

// postFree posts a free buffer. Called locked.
func (q *RxQueue) postFree(ctx any) (uint32, error) {
	if err := q.usable(); err != nil {
		return 0, err
	}
	if q.out >= int(q.n) {
		return 0, errNoDesc
	}
	b, ok := q.bufs.Get()
	if !ok {
		return 0, errNoBuffer
	}
	if err := q.postBuf(b, ctx); err != nil {
		q.bufs.Recycle(b)
		return 0, err
	}
	return b, nil
}

// postBuf lends pool buffer b to the device. Called locked.
func (q *RxQueue) postBuf(b uint32, ctx any) error {
	op := cqring.Op{Context: ctx, Buf: q.bufs.Start(b), Len: int(q.bufLen), Flags: cq.FlagRecv | cq.FlagMsg}
	return q.post(op, q.bufs.Addr(b))
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
	if err := q.postBuf(b, ctx); err != nil {
		return err // still lent: the caller may Release it
	}
	q.bufs.Unlend(b)
	return nil
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

// Outcomes of a frame handed to a receive queue.
const (
	received = iota
	noBuffer
	closed
)

// receive is the device taking a frame off the wire: it fills the posted
// buffers in order (several for a frame longer than one, all but the last
// completing with statusMore), or drops the frame when too few are
// posted, then raises the interrupt if one was armed.
func (q *RxQueue) receive(frame []byte) int {
	r := q.dev
	r.mu.Lock()
	if r.dead {
		r.mu.Unlock()
		return closed
	}
	head, end := q.head.Load(), q.pub.Load()
	// Enough buffers for the whole frame, or none is touched.
	room, need := uint32(0), uint32(len(frame))
	for h := head; h != end && room < max(need, 1); h++ {
		room += q.desc[h&(q.n-1)].len
	}
	if room < max(need, 1) {
		r.mu.Unlock()
		return noBuffer
	}
	for first := true; first || len(frame) > 0; first = false {
		ds := q.desc[head&(q.n-1)]
		// The descriptor is consumed before its completion is written:
		// a driver that reads the completion and posts again must find
		// the slot free.
		head++
		q.head.Store(head)
		k := min(uint32(len(frame)), ds.len)
		buf := q.translate(ds.addr, k)
		if buf == nil {
			k = 0 // a descriptor outside the queue's memory: nothing written
		}
		copy(buf, frame[:k])
		frame = frame[min(len(frame), int(ds.len)):]
		st := uint8(statusOK)
		if len(frame) > 0 {
			st = statusMore
		}
		r.complete(ds.id, k, st)
	}
	r.mu.Unlock()
	r.raise()
	return received
}

// TxQueue is a transmit queue (nic.TxQueue).
type TxQueue struct{ queue }

var (
	_ nic.TxQueue          = (*TxQueue)(nil)
	_ nic.InterruptSteerer = (*TxQueue)(nil)
)

func newTxQueue(d *Device, i, n, maxFrame int, mem hugepage.Options) (*TxQueue, error) {
	q := &TxQueue{}
	q.maxFrame = maxFrame
	stride := (maxFrame + 63) &^ 63
	err := newQueue(d, &q.queue, i, n, false, n*stride, mem)
	if err == nil {
		q.pool, err = dma.NewPool(q.rgn, n, maxFrame)
		q.txBuf = make([]uint32, n)
	}
	if err != nil {
		q.close(nic.ErrClosed)
		if q.EFD != nil {
			_ = q.EFD.Close()
		}
		return nil, err
	}
	return q, nil
}

// MaxFrame implements nic.TxQueue: MTU plus nic.FrameOverhead.
func (q *TxQueue) MaxFrame() int { return q.maxFrame }

// Send implements nic.TxQueue.
func (q *TxQueue) Send(frame []byte, ctx any) error {
	if len(frame) < nic.MinFrame || len(frame) > q.maxFrame {
		return errFrameSize
	}
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if err := q.usable(); err != nil {
		return err
	}
	if q.out >= int(q.n) {
		return errNoDesc
	}
	idx, ok := q.pool.Get()
	if !ok {
		return errNoDesc
	}
	buf := q.pool.Buf(idx)
	n := copy(buf, frame)
	op := cqring.Op{Context: ctx, Buf: uintptr(unsafe.Pointer(&buf[0])), Len: n, Flags: cq.FlagSend | cq.FlagMsg}
	if err := q.post(op, q.pool.Addr(idx)); err != nil {
		_ = q.pool.Put(idx)
		return err
	}
	q.txBuf[q.lastID&(q.n-1)] = idx
	return nil
}

// transmit is the device's side of a Flush: each published descriptor's
// frame goes to the wire, then its completion into the ring; the
// interrupt, if armed, once the ring is unlocked.
func (q *queue) transmit() {
	r := q.dev
	r.mu.Lock()
	if r.dead {
		r.mu.Unlock()
		return
	}
	head, end := q.head.Load(), q.pub.Load()
	for head != end {
		ds := q.desc[head&(q.n-1)]
		head++
		q.head.Store(head) // consumed before its completion is written (receive)
		if frame := q.translate(ds.addr, ds.len); frame != nil {
			q.d.wire.carry(q.d.end, q.Pair, frame)
		}
		r.complete(ds.id, ds.len, statusOK)
	}
	r.mu.Unlock()
	r.raise()
}
