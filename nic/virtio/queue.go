package virtio

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/vfnic/vfnic/cq"
	cqring "github.com/vfnic/vfnic/cq/ring"
	"github.com/vfnic/vfnic/dma"
	"github.com/vfnic/vfnic/eventfd"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/nic/internal/canceled"
	qcore "github.com/vfnic/vfnic/nic/internal/queue"
	"github.com/vfnic/vfnic/nic/internal/rxbuf"
)

// Errors returned on the data path are prepared once so that returning
// them does not allocate.
var (
	errNoBuffer = fmt.Errorf("%w: every receive buffer is lent out (Release some)", nic.ErrFull)
	errNoDesc   = fmt.Errorf("%w: no free descriptor (read completions first)", nic.ErrFull)
	errCanceled = fmt.Errorf("%w (%w)", nic.ErrCanceled, nic.ErrRemoved)
)

// queue is what receive and transmit queues share: the ring, its lock,
// its interrupt and its counters.
type queue struct {
	// Core: the lock, closed state, the CQ fed (Src), name, pair index,
	// vector, interrupt eventfd and counters.
	qcore.Core[cqSource]

	vq *vq
	// canceled are the operations outstanding at close that still owe a
	// completion: flushed ones for the CQ the queue feeds (cqSource), or,
	// for a queue that feeds none, those the kernel's taking the device
	// back canceled (Poll). One error completion per read.
	canceled canceled.List
}

// newQueue is the part of a queue both directions share, over v: no
// vector until the device assigns one.
func newQueue(v *vq, index int, efd *eventfd.FD) queue {
	return queue{Core: qcore.Core[cqSource]{Name: v.name, Pair: index, Vector: -1, EFD: efd}, vq: v}
}

// Size implements nic.Queue.
func (q *queue) Size() int { return int(q.vq.size) }

// Outstanding implements nic.Queue.
func (q *queue) Outstanding() int {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	return q.vq.nbufs
}

// Flush implements nic.Queue.
func (q *queue) Flush() error {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if err := q.usable(); err != nil {
		return err
	}
	n0, s0 := q.vq.notifies, q.vq.suppressed
	q.vq.flush()
	if q.vq.notifies != n0 {
		q.Notifies.Add(1)
	}
	if q.vq.suppressed != s0 {
		q.Suppressed.Add(1)
	}
	return nil
}

// Ready counts, up to max, the completions the device has written that
// nobody has read yet (by Poll, or through the CQ the queue feeds),
// without consuming them; an entry the driver will refuse counts, and
// ends the count. With Outstanding it tells whether the device has
// finished everything posted (Ready(Size()) == Outstanding()), without
// taking the completions from whoever reads them.
func (q *queue) Ready(max int) int {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if q.Closed {
		return 0
	}
	return q.vq.pending(max)
}

// Arm implements nic.Queue.
func (q *queue) Arm(threshold int) error {
	q.TakeLeft()
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if err := q.usable(); err != nil {
		return err
	}
	if q.EFD == nil {
		return q.NoInterrupt()
	}
	q.vq.arm(threshold)
	return nil
}

// boundError is Poll on a queue that feeds a CQ: one error completion
// saying so, instead of an empty read that looks like an idle queue.
// Called locked.
func (q *queue) boundError(out []nic.Completion) int {
	if len(out) == 0 {
		return 0
	}
	out[0] = nic.Completion{Queue: q.Pair, Err: nic.ErrBound}
	return 1
}

// finishPoll updates the counters and turns notifications off again after
// an armed queue returned completions. A queue that feeds a CQ keeps its
// arm: the CQ's request-notify lasts until the device fires it, and a
// read must not cancel it. Called locked.
func (q *queue) finishPoll(n int, bytes uint64, errs int) {
	if n == 0 {
		return
	}
	if q.vq.armed && q.Src == nil {
		q.vq.disarm()
	}
	q.Count(n, errs, bytes)
}

// usable returns why the queue cannot take an operation, or nil. Called
// locked.
func (q *queue) usable() error {
	switch {
	case q.Closed:
		return q.CloseErr
	case q.vq.broken:
		return nic.ErrBroken
	}
	return nil
}

// close marks the queue closed once the operation in progress, if any,
// has finished; later operations return why (nic.ErrClosed, or an error
// wrapping it and nic.ErrRemoved). A second close does nothing.
//
// Every operation still posted is then kept as an error completion, in
// posting order, so that callers learn the fate of each:
//
//   - A queue that feeds a cq.CQ keeps them all, whatever why is, for
//     the CQ to read as flushed completions (cq.ECANCELED) after what it
//     read before (cqSource.ReadBatch), and wakes a reader asleep on it.
//   - Otherwise, when the kernel took the device back (why wraps
//     nic.ErrRemoved), Poll reports them with ErrCanceled; a plain Close
//     reports none.
//
// The ring is not read again, not even for entries the device had
// written: teardown resets the device and unmaps the DMA memory right
// after the queues close, so a later read would fault, and a receive
// completion would lend the caller a frame in memory about to go. An
// operation the device completed but nobody read is reported flushed: a
// flushed completion says the driver cannot report the outcome, not that
// nothing happened (a frame may have gone out).
func (q *queue) close(why error) {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if q.Closed {
		return
	}
	q.Closed = true
	q.CloseErr = why
	if q.vq == nil {
		return
	}
	var err error
	switch {
	case q.Src != nil:
		err = cq.ECANCELED // only the CQ reads them (Poll of a bound queue reports none)
	case errors.Is(why, nic.ErrRemoved):
		err = errCanceled
	default:
		return
	}
	for _, ctx := range q.vq.outstanding() {
		q.canceled.Add(ctx, q.Pair, err)
	}
	if q.Src != nil && q.canceled.Len() > 0 && q.Src.irq != nil {
		// As a last interrupt would: a reader asleep on the CQ wakes to
		// read them (the device's own vectors go quiet now).
		_ = q.Src.irq.Add(1)
	}
}

// takeCanceled moves one canceled completion into out for Poll (an error
// completion is always the last of a Poll); those of a queue that feeds a
// CQ are the CQ's (cqSource.ReadBatch). Called locked.
func (q *queue) takeCanceled(out []nic.Completion) int {
	if q.Src != nil {
		return 0
	}
	return q.canceled.Take(out)
}

// RxQueue is a virtio-net receive queue (nic.RxQueue).
type RxQueue struct {
	queue
	bufs    rxbuf.Pool // frames netHdrLen bytes into each buffer
	bufSize uint32
	mrg     bool                  // MRG_RXBUF: check num_buffers
	skip    int                   // buffers of a multi-buffer frame still to drop
	span    int                   // buffers of that frame in all
	mbErr   *nic.MultiBufferError // the last multi-buffer error next made
}

var (
	_ nic.RxQueue          = (*RxQueue)(nil)
	_ nic.InterruptSteerer = (*RxQueue)(nil)
)

func newRxQueue(v *vq, index int, efd *eventfd.FD, pool *dma.Pool, mrg bool) (*RxQueue, error) {
	if err := v.setReader(usedRx); err != nil {
		return nil, err
	}
	q := &RxQueue{queue: newQueue(v, index, efd),
		bufs: rxbuf.New(pool, netHdrLen), bufSize: uint32(pool.BufSize()), mrg: mrg}
	return q, nil
}

// MaxFrame implements nic.RxQueue.
func (q *RxQueue) MaxFrame() int { return int(q.bufSize) - netHdrLen }

// PostRecv implements nic.RxQueue.
func (q *RxQueue) PostRecv(ctx any) error {
	_, err := q.postFree(ctx)
	return err
}

// PostRecvBuf is PostRecv that also says where the frame will land: the
// frame area of the buffer it posted (MaxFrame bytes, starting at the
// address the completion reports as Buf). For callers that match posts to
// completions by buffer, as fi_cq's FI_CQ_FORMAT_DATA does. The device
// owns the bytes until the completion is read.
func (q *RxQueue) PostRecvBuf(ctx any) ([]byte, error) {
	b, err := q.postFree(ctx)
	if err != nil {
		return nil, err
	}
	return q.bufs.Buf(b)[netHdrLen:], nil
}

// postFree posts a free pool buffer and returns its index.
func (q *RxQueue) postFree(ctx any) (uint32, error) {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if err := q.usable(); err != nil {
		return 0, err
	}
	if q.vq.room() < 1 {
		return 0, errNoDesc
	}
	b, ok := q.bufs.Get()
	if !ok {
		return 0, errNoBuffer
	}
	if !q.post(b, ctx) {
		_ = q.bufs.Put(b)
		return 0, errNoDesc
	}
	return b, nil
}

// post lends pool buffer b to the device. Called locked with room; false
// when no id is free yet (ids freed by a read are published at its end).
func (q *RxQueue) post(b uint32, ctx any) bool {
	id, ok := q.vq.reserve(cqring.Op{Context: ctx, Buf: q.bufs.Start(b), Len: int(q.bufSize), Flags: cq.FlagRecv | cq.FlagMsg}, 1)
	if !ok {
		return false
	}
	q.bufs.Posted(b)
	q.vq.add(id, q.bufs.Addr(b), q.bufSize, descWrite)
	return true
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
	if q.vq.room() < 1 || !q.post(b, ctx) {
		return errNoDesc
	}
	return nil
}

// close is queue.close, then the buffers still posted go back to the
// pool, once: their operations complete as canceled or flushed, which
// lend the caller nothing, and the DMA memory goes with the device.
func (q *RxQueue) close(why error) {
	q.queue.close(why)
	q.Mu.Lock()
	defer q.Mu.Unlock()
	q.bufs.RecyclePosted()
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

// Frame implements nic.RxQueue: the bytes of a frame lent to the caller,
// from the Buf and Len of its completion (a cq.Entry carries no slice).
func (q *RxQueue) Frame(buf uintptr, length int) ([]byte, error) {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if q.Closed {
		return nil, nic.ErrClosed
	}
	return q.bufs.Frame(buf, length, q.MaxFrame())
}

// Poll implements nic.Queue: it reads used buffers, strips the virtio-net
// header, checks the length against the posted buffer and num_buffers,
// and lends each good buffer to the caller.
func (q *RxQueue) Poll(out []nic.Completion) int {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	switch {
	case q.Closed:
		return q.takeCanceled(out)
	case q.Src != nil:
		return q.boundError(out)
	}
	return q.poll(out)
}

// SRead implements nic.Queue.
func (q *RxQueue) SRead(ctx context.Context, out []nic.Completion, threshold int, timeout time.Duration) (int, error) {
	if q.Bound() {
		return 0, q.ErrBound()
	}
	return nic.SRead(ctx, q, out, threshold, timeout)
}

// TxQueue is a virtio-net transmit queue (nic.TxQueue). Buffer id i always
// uses transmit buffer i, whose virtio-net header stays zero (no offloads).
type TxQueue struct {
	queue
	pool     *dma.Pool
	maxFrame int
}

var (
	_ nic.TxQueue          = (*TxQueue)(nil)
	_ nic.InterruptSteerer = (*TxQueue)(nil)
)

func newTxQueue(v *vq, index int, efd *eventfd.FD, pool *dma.Pool, mtu int) (*TxQueue, error) {
	if err := v.setReader(usedTx); err != nil {
		return nil, err
	}
	if pool.Cap() < int(v.size) {
		return nil, fmt.Errorf("%w: %s: %d transmit buffers for %d descriptors", nic.ErrInvalid, v.name, pool.Cap(), v.size)
	}
	return &TxQueue{queue: newQueue(v, index, efd), pool: pool,
		maxFrame: min(pool.BufSize()-netHdrLen, mtu+nic.FrameOverhead)}, nil
}

// MaxFrame implements nic.TxQueue.
func (q *TxQueue) MaxFrame() int { return q.maxFrame }

// Send implements nic.TxQueue.
func (q *TxQueue) Send(frame []byte, ctx any) error {
	if len(frame) < nic.MinFrame || len(frame) > q.maxFrame {
		// Allocates, as a caller's mistake may: the numbers say what is wrong.
		return fmt.Errorf("%w: frame of %d bytes outside [%d, %d]", nic.ErrFrameSize, len(frame), nic.MinFrame, q.maxFrame)
	}
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if err := q.usable(); err != nil {
		return err
	}
	if q.vq.room() < 1 {
		return errNoDesc
	}
	id, ok := q.vq.reserve(cqring.Op{Context: ctx, Len: len(frame), Flags: cq.FlagSend | cq.FlagMsg}, 1)
	if !ok {
		return errNoDesc
	}
	b := q.pool.Buf(uint32(id))
	n := netHdrLen + copy(b[netHdrLen:], frame)
	q.vq.add(id, q.pool.Addr(uint32(id)), uint32(n), 0)
	return nil
}

// Poll implements nic.Queue. The device's length of a transmit buffer is
// reserved by the specification, so it is not read; the frame length
// comes from what was posted.
func (q *TxQueue) Poll(out []nic.Completion) int {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	switch {
	case q.Closed:
		return q.takeCanceled(out)
	case q.Src != nil:
		return q.boundError(out)
	}
	return q.poll(out)
}

// SRead implements nic.Queue.
func (q *TxQueue) SRead(ctx context.Context, out []nic.Completion, threshold int, timeout time.Duration) (int, error) {
	if q.Bound() {
		return 0, q.ErrBound()
	}
	return nic.SRead(ctx, q, out, threshold, timeout)
}
