package afxdp

import (
	"context"
	"fmt"
	"math/bits"
	"sync/atomic"
	"time"

	"github.com/vfnic/vfnic/cq"
	cqring "github.com/vfnic/vfnic/cq/ring"
	"github.com/vfnic/vfnic/doorbell"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/nic/internal/canceled"
	qcore "github.com/vfnic/vfnic/nic/internal/queue"
	"github.com/vfnic/vfnic/nic/internal/rxbuf"
)

// TxOwedWait is the longest a transmit queue's WaitInterrupt sleeps while
// sends are owed: AF_XDP signals no completion, so the completion ring is
// looked at again after it.
var TxOwedWait = time.Millisecond

// Errors returned on the data path, prepared so that returning them does
// not allocate.
var (
	errNoBuffer = fmt.Errorf("%w: every receive buffer is lent out (Release some)", nic.ErrFull)
	errNoDesc   = fmt.Errorf("%w: the ring is full (read completions first)", nic.ErrFull)
)

// queue is what receive and transmit queues share: the socket, the ring
// reader of the ring the kernel writes and its table of postings.
type queue struct {
	// Core: the lock, closed state, the CQ fed (Src), name, pair index,
	// interrupt (the socket's readiness) and counters.
	qcore.Core[cqSource]
	x   *xsk
	src *cqring.RingSource
	tab *cqring.Table
	out int // postings the kernel has not completed
	// pub is the producer index last published on the ring this queue
	// produces (fill or transmit).
	pub    uint32
	broken bool
	// canceled are the operations outstanding at close that a CQ the
	// queue fed reads as flushed completions (cqSource.ReadBatch).
	canceled canceled.List
}

// newReader makes the reader of ring r (receive or completion) with
// layout l and a table of n slots.
func newReader(r *ring, l cqring.Layout, n int, name string) (*cqring.RingSource, *cqring.Table, error) {
	l.Name += "-" + name
	src, err := cqring.NewRingSource(cqring.RingConfig{Mem: r.desc, Layout: l,
		Regs: cqring.RingRegs{Producer: r.word(r.prod), Doorbell: doorbell.NewDoorbell(r.word(r.cons))}})
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %s: %v", nic.ErrInvalid, name, err)
	}
	tab, err := cqring.NewTable(n, bits.Len(uint(n-1)))
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %s: %v", nic.ErrInvalid, name, err)
	}
	if err := src.BindTable(0, tab); err != nil {
		return nil, nil, err
	}
	src.Ring().SetProducerLimit(0) // nothing handed over yet
	return src, tab, nil
}

// Size implements nic.Queue.
func (q *queue) Size() int { return int(q.x.rx.n) }

// Outstanding implements nic.Queue.
func (q *queue) Outstanding() int {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	return q.out
}

// Ready counts, up to max, the entries the kernel has written that
// nobody has read yet (by Poll, or through the CQ the queue feeds),
// without consuming them; an entry the driver will refuse counts.
func (q *queue) Ready(max int) int {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if q.Closed || q.broken || max <= 0 {
		return 0
	}
	return q.src.Pending(max)
}

// usable returns why the queue cannot take an operation, or nil. Called
// locked.
func (q *queue) usable() error {
	switch {
	case q.Closed:
		return q.CloseErr
	case q.broken:
		return nic.ErrBroken
	}
	return nil
}

// close marks the queue closed: later operations return nic.ErrClosed,
// and nothing touches the rings again (the device unmaps them next). A
// queue that feeds a CQ keeps each operation still outstanding, for the
// CQ to read as a flushed completion (cq.ECANCELED), and wakes a reader
// asleep on the CQ; a plain Close reports none to Poll.
func (q *queue) close() {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if q.Closed {
		return
	}
	q.Closed, q.CloseErr = true, nic.ErrClosed
	if q.Src == nil {
		return
	}
	q.tab.Each(func(ctx any) { q.canceled.Add(ctx, q.Pair, cq.ECANCELED) })
	if q.canceled.Len() > 0 && q.Src.irq != nil {
		_ = q.Src.irq.Add(1)
	}
}

// boundError is Poll on a queue that feeds a CQ: one error completion
// saying so. Called locked.
func (q *queue) boundError(out []nic.Completion) int {
	if len(out) == 0 {
		return 0
	}
	out[0] = nic.Completion{Queue: q.Pair, Err: nic.ErrBound}
	return 1
}

// next takes the next entry of the kernel's ring through the reader (the
// one read of each entry and the table's checks). Called locked.
func (q *queue) next(c *cqring.Completion) bool {
	if q.broken || !q.src.Next(c) {
		return false
	}
	if c.Prov == cq.ProvBadIndex {
		q.broken = true
	}
	if c.Done {
		q.out--
	}
	return true
}

// refused is the queue API's error for an entry the reader refused.
func refused(c *cqring.Completion) error {
	if err := c.Prov.Refusal(); err != nil {
		return err
	}
	return nic.ErrDeviceStatus
}

// RxQueue is a receive queue: the socket's fill and receive rings
// (nic.RxQueue). Receive buffer b is UMEM chunk base+b, and the slot of
// its posting in the table is that chunk: the address the kernel writes
// names the posting.
type RxQueue struct {
	queue
	bufs rxbuf.Pool
	base uint32 // chunk of buffer 0
}

var _ nic.RxQueue = (*RxQueue)(nil)

func newRxQueue(x *xsk, pair int, name string, nbufs int) (*RxQueue, error) {
	base := int(x.tx.n) // the transmit chunks come first
	pool, err := dmaPool(x, base, nbufs)
	if err != nil {
		return nil, err
	}
	src, tab, err := newReader(&x.rx, RxLayout(int(x.rx.n), x.shift), base+nbufs, "rx-"+name)
	if err != nil {
		return nil, err
	}
	q := &RxQueue{queue: queue{Core: qcore.Core[cqSource]{Name: "rx-" + name, Pair: pair, Vector: -1, EFD: x.irq},
		x: x, src: src, tab: tab}, bufs: rxbuf.New(pool, headroom), base: uint32(base)}
	return q, nil
}

// MaxFrame implements nic.RxQueue.
func (q *RxQueue) MaxFrame() int { return q.x.chunk - headroom }

// PostRecv implements nic.RxQueue.
func (q *RxQueue) PostRecv(ctx any) error {
	_, err := q.postFree(ctx)
	return err
}

// PostRecvBuf is PostRecv that also says where the frame will land: the
// frame area of the buffer it posted (MaxFrame bytes from the address a
// completion reports as Buf). The kernel owns the bytes until the
// completion is read.
func (q *RxQueue) PostRecvBuf(ctx any) ([]byte, error) {
	b, err := q.postFree(ctx)
	if err != nil {
		return nil, err
	}
	return q.bufs.Buf(b)[headroom:], nil
}

// postFree posts a free buffer and returns its index.
func (q *RxQueue) postFree(ctx any) (uint32, error) {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if err := q.usable(); err != nil {
		return 0, err
	}
	if q.out >= int(q.x.fill.n) {
		return 0, errNoDesc
	}
	b, ok := q.bufs.Get()
	if !ok {
		return 0, errNoBuffer
	}
	if err := q.post(b, ctx); err != nil {
		_ = q.bufs.Put(b)
		return 0, err
	}
	return b, nil
}

// post lends buffer b to the kernel through the fill ring. Called locked
// with fewer than a ring of postings outstanding, so the fill ring (and
// the receive ring, for their frames) has room.
func (q *RxQueue) post(b uint32, ctx any) error {
	chunk := q.base + b
	if _, err := q.tab.PostSlot(chunk, cqring.Op{Context: ctx, Buf: q.bufs.Start(b), Len: q.MaxFrame(), Flags: cq.FlagRecv | cq.FlagMsg}); err != nil {
		return errNoDesc // not reachable: a buffer not posted has its slot free
	}
	q.x.fill.putAddr(uint64(chunk) << q.x.shift)
	q.out++
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
	if q.out >= int(q.x.fill.n) {
		return errNoDesc
	}
	if err := q.post(b, ctx); err != nil {
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
	return q.bufs.Frame(buf, length, q.MaxFrame())
}

// Flush implements nic.Queue: the fill ring's new entries become the
// kernel's, with a system call only when it asked for one.
func (q *RxQueue) Flush() error {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if err := q.usable(); err != nil {
		return err
	}
	f := &q.x.fill
	if f.next == q.pub {
		return nil
	}
	f.publish()
	q.pub = f.next
	q.src.Ring().SetProducerLimit(q.pub)
	if !f.needWakeup() {
		q.Suppressed.Add(1)
		return nil
	}
	q.Notifies.Add(1)
	return q.x.kickFill()
}

// Poll implements nic.Queue.
func (q *RxQueue) Poll(out []nic.Completion) int {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	switch {
	case q.Closed:
		return 0
	case q.Src != nil:
		return q.boundError(out)
	}
	n, errs := 0, 0
	var bytes uint64
	var c cqring.Completion
	for n < len(out) && q.take(&c) {
		o := &out[n]
		n++
		if c.Err != 0 {
			*o = nic.Completion{Context: c.Context, Queue: q.Pair, Err: refused(&c)}
			errs++
			break
		}
		*o = nic.Completion{Context: c.Context, Buf: c.Buf, Data: q.bufs.Bytes(c.Buf, c.Len), Len: c.Len, Queue: q.Pair}
		bytes += uint64(c.Len)
	}
	if n > 0 {
		q.src.Publish()
		q.Count(n, errs, bytes)
	}
	return n
}

// take reads the next received frame into c: the reader's checks of the
// descriptor (its address names a posted buffer, its length fits it, its
// options are 0), then the frame's place in the buffer, from the same
// copy: the offset the kernel wrote must be the XDP headroom and no
// address bit beyond the chunk may be set (cq.ProvBadID), and the frame
// must hold an Ethernet header (cq.ProvBadLen). A good buffer is lent to
// the caller, c.Buf its frame; a refused one goes back to the pool.
// Called locked.
func (q *RxQueue) take(c *cqring.Completion) bool {
	if !q.next(c) {
		return false
	}
	if c.Err != 0 {
		if c.Done && c.Buf != 0 {
			q.bufs.Recycle(q.bufs.Of(c.Buf))
		}
		c.Buf = 0
		return true
	}
	b := q.bufs.Of(c.Buf)
	switch {
	case c.Meta[0] != headroom || c.Meta[1] != 0:
		c.Err, c.Prov = cq.EIO, cq.ProvBadID
	case c.Len < nic.MinFrame:
		c.Err, c.Prov = cq.EIO, cq.ProvBadLen
	default:
		q.bufs.Lend(b)
		c.Buf += headroom
		return true
	}
	q.bufs.Recycle(b)
	c.Buf = 0
	return true
}

// Arm implements nic.Queue: the socket is readable while its receive
// ring holds frames, so there is nothing to arm, except that a kernel
// that asked to be woken for the fill ring is woken now (else no frame
// would come to wake the caller).
func (q *RxQueue) Arm(threshold int) error {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if err := q.usable(); err != nil {
		return err
	}
	if q.out > 0 && q.x.fill.needWakeup() {
		q.Notifies.Add(1)
		return q.x.kickFill()
	}
	return nil
}

// SRead implements nic.Queue.
func (q *RxQueue) SRead(ctx context.Context, out []nic.Completion, threshold int, timeout time.Duration) (int, error) {
	if q.Bound() {
		return 0, q.ErrBound()
	}
	return nic.SRead(ctx, q, out, threshold, timeout)
}

// TxQueue is a transmit queue: the socket's transmit and completion rings
// (nic.TxQueue). A send's buffer is the UMEM chunk of its posting's slot.
type TxQueue struct {
	queue
	maxFrame int
}

var _ nic.TxQueue = (*TxQueue)(nil)

func newTxQueue(x *xsk, pair int, name string, maxFrame int) (*TxQueue, error) {
	src, tab, err := newReader(&x.comp, CompLayout(int(x.comp.n), x.shift), int(x.tx.n), "tx-"+name)
	if err != nil {
		return nil, err
	}
	return &TxQueue{queue: queue{Core: qcore.Core[cqSource]{Name: "tx-" + name, Pair: pair, Vector: -1, EFD: x.irq},
		x: x, src: src, tab: tab}, maxFrame: maxFrame}, nil
}

// MaxFrame implements nic.TxQueue.
func (q *TxQueue) MaxFrame() int { return q.maxFrame }

// Send implements nic.TxQueue.
func (q *TxQueue) Send(frame []byte, ctx any) error {
	if len(frame) < nic.MinFrame || len(frame) > q.maxFrame {
		return fmt.Errorf("%w: frame of %d bytes outside [%d, %d]", nic.ErrFrameSize, len(frame), nic.MinFrame, q.maxFrame)
	}
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if err := q.usable(); err != nil {
		return err
	}
	id, err := q.tab.Post(cqring.Op{Context: ctx, Len: len(frame), Flags: cq.FlagSend | cq.FlagMsg})
	if err != nil {
		return errNoDesc
	}
	addr := uint64(id) << q.x.shift
	copy(q.x.umem.Bytes()[addr:addr+uint64(len(frame))], frame)
	q.x.tx.putDesc(addr, uint32(len(frame)))
	q.out++
	return nil
}

// Flush implements nic.Queue: the transmit ring's new entries become the
// kernel's, and it is kicked when it asked for it (copy mode always
// does: it sends from the system call).
func (q *TxQueue) Flush() error {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if err := q.usable(); err != nil {
		return err
	}
	t := &q.x.tx
	if t.next == q.pub {
		return nil
	}
	t.publish()
	q.pub = t.next
	q.src.Ring().SetProducerLimit(q.pub)
	if q.Src != nil && q.Src.arm != nil && q.Src.armed.Load() {
		q.Src.poke() // its forwarder waits for these completions now
	}
	if !t.needWakeup() {
		q.Suppressed.Add(1)
		return nil
	}
	q.Notifies.Add(1)
	return q.x.kick()
}

// Poll implements nic.Queue. A completion reports the posted length.
// While sends published are still in the transmit ring, the kernel is
// kicked again when it asks: in copy mode it sends a bounded batch per
// system call.
func (q *TxQueue) Poll(out []nic.Completion) int {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	switch {
	case q.Closed:
		return 0
	case q.Src != nil:
		return q.boundError(out)
	}
	n, errs := 0, 0
	var bytes uint64
	var c cqring.Completion
	for n < len(out) && q.take(&c) {
		o := &out[n]
		n++
		if c.Err != 0 {
			*o = nic.Completion{Context: c.Context, Queue: q.Pair, Err: refused(&c)}
			errs++
			break
		}
		*o = nic.Completion{Context: c.Context, Len: c.Len, Queue: q.Pair}
		bytes += uint64(c.Len)
	}
	if n > 0 {
		q.src.Publish()
		q.Count(n, errs, bytes)
	}
	q.rekick()
	return n
}

// take reads the next completion into c: the reader's checks of the
// address (a posted send's chunk), then, from the same copy, its offset
// (0, where sends are posted) and the bits beyond the chunk (0).
func (q *TxQueue) take(c *cqring.Completion) bool {
	if !q.next(c) {
		return false
	}
	if c.Err == 0 && (c.Meta[0] != 0 || c.Meta[1] != 0) {
		c.Err, c.Prov = cq.EIO, cq.ProvBadID
	}
	return true
}

// rekick kicks the kernel when published sends wait in the transmit ring
// and it asked for a kick. Called locked.
func (q *TxQueue) rekick() {
	if q.out > 0 && q.pub != atomic.LoadUint32(q.x.tx.cons) && q.x.tx.needWakeup() {
		q.Notifies.Add(1)
		_ = q.x.kick() // a failed kick is retried at the next poll
	}
}

// Arm implements nic.Queue: the kernel is kicked for sends still in the
// transmit ring. AF_XDP raises nothing when it completes a send: the
// wait after this arm is bounded while sends are owed (WaitInterrupt).
func (q *TxQueue) Arm(threshold int) error {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if err := q.usable(); err != nil {
		return err
	}
	q.rekick()
	return nil
}

// WaitInterrupt implements nic.Queue: the pair's socket readiness, for at
// most TxOwedWait while sends are owed (a spurious wake-up then, as
// nic.Queue allows, so that their completions are read).
func (q *TxQueue) WaitInterrupt(ctx context.Context, deadline time.Time) error {
	q.Mu.Lock()
	owed := q.out > 0 && !q.Closed
	q.Mu.Unlock()
	if !owed {
		return q.Core.WaitInterrupt(ctx, deadline)
	}
	capped := time.Now().Add(TxOwedWait)
	if !deadline.IsZero() && deadline.Before(capped) {
		return q.Core.WaitInterrupt(ctx, deadline)
	}
	if err := q.Core.WaitInterrupt(ctx, capped); err != nic.ErrTimeout {
		return err
	}
	return nil
}

// SRead implements nic.Queue.
func (q *TxQueue) SRead(ctx context.Context, out []nic.Completion, threshold int, timeout time.Duration) (int, error) {
	if q.Bound() {
		return 0, q.ErrBound()
	}
	return nic.SRead(ctx, q, out, threshold, timeout)
}
