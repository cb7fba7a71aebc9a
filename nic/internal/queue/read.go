package queue

// The read side of a queue, written once for every driver: Poll into
// nic.Completion, the cq.CQ-facing reader (ReadBatch, Pending, Arm,
// Unbind), the buffers lent to the caller (Release, Frame, Repost), and
// the operations a closing queue still owes. A driver supplies its ring
// (Ring): how to read a batch, publish, count, arm and notify.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/vfnic/vfnic/cq"
	cqring "github.com/vfnic/vfnic/cq/ring"
	"github.com/vfnic/vfnic/eventfd"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/nic/internal/canceled"
	"github.com/vfnic/vfnic/nic/internal/rxbuf"
)

// Errors of the data path, prepared once so that returning them does not
// allocate.
var (
	ErrNoBuffer = fmt.Errorf("%w: every receive buffer is lent out (Release some)", nic.ErrFull)
	ErrNoDesc   = fmt.Errorf("%w: no free descriptor (read completions first)", nic.ErrFull)
	errCanceled = fmt.Errorf("%w (%w)", nic.ErrCanceled, nic.ErrRemoved)
)

// Batch is the most completions a driver's Ring.Read takes at once.
const Batch = 32

// Ring is what a driver supplies for one queue's ring. The core calls
// every method with Core.Mu held.
type Ring interface {
	// Read is the driver's pass over one batch: it takes up to len(cs)
	// completions from its ring into cs, in ring order, with one batch
	// read of its ring reader (cqring.RingSource.NextBatch) and one pass
	// of its own checks over the batch, and returns how many. A
	// completion with Err set (refused by the ring reader, or by the
	// driver's checks of the frame) may be followed by more: the core
	// hands them out in order, an error last of a Poll. A receive
	// completion's Buf and Len are the frame's, Buf inside the posted
	// pool buffer, for a good one and for a refused one that named a
	// posted buffer (Done): the core lends the first to the caller and
	// recycles the second. A ring out of step with what was posted reads
	// nothing more (Broken). cs is the core's batch from its start, and
	// its completions are handed out before Read is called again, so a
	// driver may keep per-position details of a batch (virtio's
	// multi-buffer errors).
	Read(cs []cqring.Completion) int
	// Publish ends a batch of Reads: the consumer doorbell, the ids
	// freed.
	Publish()
	// Pending counts, up to max, the completions ready, without taking
	// them; an entry the reader will refuse counts.
	Pending(max int) int
	// Outstanding is the number of the caller's operations posted and
	// not completed.
	Outstanding() int
	// Broken reports a ring out of step with what was posted.
	Broken() bool
	// Notify makes the operations posted since the last call visible to
	// the device, and says whether a doorbell was written (rang) or
	// left out because the device said it needs none (suppressed).
	Notify() (rang, suppressed bool)
	// Arm asks for the queue's interrupt once threshold completions are
	// ready (0: the one after those present). ok false: the queue has no
	// interrupt it can arm. late: the completion the arm asked for came
	// while arming, so the event may never fire; the core then wakes a
	// CQ's reader itself.
	Arm(threshold int) (late, ok bool)
	// Disarm turns the queue's interrupt off again.
	Disarm()
	// Err is the queue API's error for a refused completion, prepared
	// (nothing allocated). Cold path.
	Err(c *cqring.Completion) error
	// StrError describes a device status value (cq.Source.StrError).
	StrError(prov cq.ProvErrno, data []byte) (string, bool)
	// Table is the ring's table of posted operations, the one record of
	// what the device holds (Op.Word: Word).
	Table() *cqring.Table
}

// Own marks the driver word (Word) of an operation a driver posted for
// itself, such as igb's context descriptors: a closing queue owes no
// completion for it.
const Own = 1 << 15

// Queue is a queue as every driver has it once it has a ring: Core, the
// ring the driver supplies, its receive buffers and the operations a
// closed queue still owes. It implements nic.Queue but for Size-free
// posting; a driver embeds it in its queue types and adds the posting
// (Send, and an Rx for receive queues).
type Queue struct {
	// Core: the lock, closed state, the CQ fed (Src), name, pair index,
	// vector, interrupt eventfd and counters.
	Core[Source]

	ring Ring
	// Bufs are a receive queue's buffers (nil for transmit): the core
	// lends a good completion's buffer to the caller and recycles a
	// refused one's.
	Bufs *rxbuf.Pool
	// QNum is the queue's number in cq.Entry.Queue.
	QNum uint32
	// Driver names the driver in a flushed completion's description
	// ("virtio").
	Driver string
	// FW signals the CQ the queue feeds when its interrupt is a
	// readiness FD (Device.BindForwarded); guarded by Mu.
	FW *Forwarder
	// Lasting says the queue's readiness FD can stay readable with
	// nothing to read (AF_PACKET's, while the slot before the kernel's
	// position is lent): WaitInterrupt then returns once the queue holds
	// a completion, looked at after each event the descriptor raises.
	// Set before Init.
	Lasting bool
	ready   func() bool // Lasting's look, made once by Init

	size     int
	recv     bool
	posts    uint64
	canceled canceled.List
	// batch[bh:bt] are completions read from the ring and settled (read)
	// that nobody has been handed yet: those after an error completion,
	// which ends a Poll or a CQ's batch.
	batch  [Batch]cqring.Completion
	bh, bt int
}

// Init sets the queue's ring, its size in descriptors and, for a receive
// queue, its buffers. Called once, before the queue is used.
func (q *Queue) Init(r Ring, size int, bufs *rxbuf.Pool) {
	q.ring, q.size, q.Bufs, q.recv = r, size, bufs, bufs != nil
	if q.Lasting {
		q.ready = func() bool { return q.Ready(1) > 0 }
	}
}

// WaitInterrupt implements nic.Queue: Core's, which for a Lasting
// readiness returns only once the queue holds a completion.
func (q *Queue) WaitInterrupt(ctx context.Context, deadline time.Time) error {
	return q.WaitInterruptFor(ctx, deadline, q.ready)
}

// Word returns the driver word (cqring.Op.Word) of the next operation
// posted: the posting order in the high 48 bits, with which a closing
// queue reports what it still holds in the order it was posted (ids are
// reused out of order), and low, the driver's own 16 bits (Own).
// Called locked.
func (q *Queue) Word(low uint16) uint64 {
	w := q.posts<<16 | uint64(low)
	q.posts++
	return w
}

// Flags are those the queue's operations are posted with, reported by
// its flushed completions.
func (q *Queue) Flags() cq.Flags {
	if q.recv {
		return cq.FlagRecv | cq.FlagMsg
	}
	return cq.FlagSend | cq.FlagMsg
}

// Size implements nic.Queue.
func (q *Queue) Size() int { return q.size }

// Outstanding implements nic.Queue: those the device holds, and those
// read from the ring but not handed out yet (after an error completion).
func (q *Queue) Outstanding() int {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if q.ring == nil {
		return 0
	}
	n := q.ring.Outstanding()
	for i := q.bh; i < q.bt; i++ {
		if q.batch[i].Done {
			n++
		}
	}
	return n
}

// Usable returns why the queue cannot take an operation, or nil. Called
// locked.
func (q *Queue) Usable() error {
	switch {
	case q.Closed:
		return q.CloseErr
	case q.ring.Broken():
		return nic.ErrBroken
	}
	return nil
}

// Flush implements nic.Queue.
func (q *Queue) Flush() error {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if err := q.Usable(); err != nil {
		return err
	}
	rang, suppressed := q.ring.Notify()
	if rang {
		q.Notifies.Add(1)
	}
	if suppressed {
		q.Suppressed.Add(1)
	}
	if n, ok := q.ring.(Notifier); ok {
		return n.NotifyErr()
	}
	return nil
}

// Ready counts, up to max, the completions the device has written that
// nobody has read yet (by Poll, or through the CQ the queue feeds),
// without consuming them; an entry the driver will refuse counts, and
// ends the count. With Outstanding it tells whether the device has
// finished everything posted (Ready(Size()) == Outstanding()), without
// taking the completions from whoever reads them.
func (q *Queue) Ready(max int) int {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if q.Closed || max <= 0 {
		return 0
	}
	return q.pending(max)
}

// pending counts the completions held and those ready in the ring, up to
// max. Called locked.
func (q *Queue) pending(max int) int {
	n := min(q.bt-q.bh, max)
	if n < max && !q.ring.Broken() {
		n += q.ring.Pending(max - n)
	}
	return n
}

// Arm implements nic.Queue.
func (q *Queue) Arm(threshold int) error {
	q.TakeLeft()
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if err := q.Usable(); err != nil {
		return err
	}
	if q.EFD == nil {
		return q.NoInterrupt()
	}
	if _, ok := q.ring.Arm(q.ringThreshold(threshold)); !ok {
		return q.NoInterrupt()
	}
	return nil
}

// ringThreshold is what the ring is armed for so that threshold
// completions, counted from the next one to read, raise the interrupt:
// the ring counts from its own head, past the completions the core
// already took from it (those held after an error completion), so those
// are taken off, leaving at least one. Threshold 0 (the completion after
// those present) is the ring's. Called locked.
func (q *Queue) ringThreshold(threshold int) int {
	if threshold <= 0 {
		return threshold
	}
	return max(threshold-(q.bt-q.bh), 1)
}

// SRead implements nic.Queue.
func (q *Queue) SRead(ctx context.Context, out []nic.Completion, threshold int, timeout time.Duration) (int, error) {
	if q.Bound() {
		return 0, q.ErrBound()
	}
	return nic.SRead(ctx, q, out, threshold, timeout)
}

// Poll implements nic.Queue: the driver's pass over each batch its ring
// reader takes, then one write of the caller's record per completion. A
// queue that feeds a CQ says so with one error completion instead of an
// empty read that looks like an idle queue; a closed one hands out what
// it still owes (CloseQueue), one per call.
func (q *Queue) Poll(out []nic.Completion) int {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	switch {
	case q.Closed:
		if q.Src != nil {
			return 0 // the CQ's (Source.ReadBatch)
		}
		return q.canceled.Take(out)
	case q.Src != nil:
		if len(out) == 0 {
			return 0
		}
		out[0] = nic.Completion{Queue: q.Pair, Err: nic.ErrBound}
		return 1
	}
	n, errs := 0, 0
	var bytes uint64
	pair := q.Pair
	for n < len(out) && errs == 0 && q.fill(len(out)-n) {
		// The held completions in a local slice, the record written
		// field by field: a composite literal would be built on the
		// stack and copied (with a write-barrier check on the copy).
		held := q.batch[q.bh:q.bt]
		k := min(len(held), len(out)-n)
		dst := out[n : n+k]
		for i := range dst {
			c, o := &held[i], &dst[i]
			if c.Err != 0 {
				q.settleRefused(c)
				*o = nic.Completion{Context: c.Context, Len: c.Len, Queue: pair, Err: q.ring.Err(c)}
				k, errs = i+1, 1
				break
			}
			o.Context, o.Buf, o.Len, o.Queue, o.Err = c.Context, c.Buf, c.Len, pair, nil
			if q.recv {
				q.Bufs.Lend(q.Bufs.Of(c.Buf))
				o.Data = q.Bufs.Bytes(c.Buf, c.Len)
			} else {
				o.Data = nil
			}
			bytes += uint64(c.Len)
		}
		q.bh += k
		n += k
	}
	q.finish(n, errs, bytes)
	return n
}

// fill makes sure completions are held, reading up to want (at most
// Batch) from the ring when none are: false when the ring has none
// either. Called locked.
func (q *Queue) fill(want int) bool {
	if q.bh < q.bt {
		return true
	}
	q.bh, q.bt = 0, q.read(min(want, Batch))
	return q.bt > 0
}

// read has the driver read up to want completions into q.batch. Their
// buffers are settled as they are handed out: a good receive's lent to
// the caller, a refused one's back on the free list (settleRefused).
// Called locked.
func (q *Queue) read(want int) int { return q.ring.Read(q.batch[:want]) }

// settleRefused returns the buffer of a refused receive completion, which
// is being handed out, to the free list (its Buf then 0). Called locked.
func (q *Queue) settleRefused(c *cqring.Completion) {
	if q.recv && c.Done && c.Buf != 0 {
		q.Bufs.Recycle(q.Bufs.Of(c.Buf))
	}
	c.Buf = 0
}

// finish ends a batch of n completions, errs of them errors: the ring
// publishes what it freed, the counters move, and an armed interrupt is
// turned off again, unless the queue feeds a CQ, whose request-notify
// lasts until the device fires it (a read must not cancel it). Called
// locked.
func (q *Queue) finish(n, errs int, bytes uint64) {
	q.ring.Publish()
	if n == 0 {
		return
	}
	if q.Src == nil {
		q.ring.Disarm()
	}
	q.Count(n, errs, bytes)
}

// CloseQueue marks the queue closed once the operation in progress, if any,
// has finished; later operations return why (nic.ErrClosed, or an error
// wrapping it and nic.ErrRemoved). A second CloseQueue does nothing.
//
// Receive buffers still posted go back to the pool, once: the device no
// longer owns them. Every operation still posted is kept as an error
// completion, in posting order, so that callers learn the fate of each:
//
//   - A queue that feeds a cq.CQ keeps them all, whatever why is, for
//     the CQ to read as flushed completions (cq.ECANCELED) after what it
//     read before (Source.ReadBatch), and wakes a reader asleep on it.
//   - Otherwise, when the kernel took the device back (why wraps
//     nic.ErrRemoved), Poll reports them with nic.ErrCanceled; a plain
//     Close reports none.
//
// The ring is not read again, not even for entries the device had
// written: teardown resets the device and unmaps the DMA memory right
// after the queues close, so a later read would fault, and a receive
// completion would lend the caller a frame in memory about to go. An
// operation the device completed but nobody read is reported flushed: a
// flushed completion says the driver cannot report the outcome, not that
// nothing happened (a frame may have gone out).
func (q *Queue) CloseQueue(why error) {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if q.Closed {
		return
	}
	q.Closed = true
	q.CloseErr = why
	if q.ring == nil {
		return
	}
	var err error
	switch {
	case q.Src != nil:
		err = cq.ECANCELED // only the CQ reads them (Poll of a bound queue reports none)
	case errors.Is(why, nic.ErrRemoved):
		err = errCanceled
	}
	type op struct {
		ctx  any
		buf  uintptr
		word uint64
	}
	var ops []op
	for _, c := range q.batch[q.bh:q.bt] {
		// Read and never handed out: flushed like those still posted,
		// their buffers (neither lent nor free yet) recycled.
		if c.Done {
			ops = append(ops, op{c.Context, c.Buf, c.Word})
		}
	}
	q.bh, q.bt = 0, 0
	q.ring.Table().EachPosted(func(_ uint32, ctx any, buf uintptr, word uint64) { ops = append(ops, op{ctx, buf, word}) })
	slices.SortFunc(ops, func(a, b op) int { return cmp.Compare(a.word>>16, b.word>>16) })
	for _, o := range ops {
		if q.recv && o.buf != 0 {
			q.Bufs.Recycle(q.Bufs.Of(o.buf))
		}
		if err != nil && o.word&Own == 0 {
			q.canceled.Add(o.ctx, q.Pair, err)
		}
	}
	if q.Src != nil && q.canceled.Len() > 0 && q.Src.irq != nil {
		// As a last interrupt would: a reader asleep on the CQ wakes to
		// read them (the device's own vectors go quiet now).
		_ = q.Src.irq.Add(1)
	}
}

// Rx is what the core gives a receive queue besides Queue: posting pool
// buffers and the checks of those handed back. A driver's receive queue
// embeds it beside its Queue.
type Rx struct {
	q        *Queue
	post     RxPoster
	maxFrame int
}

// RxPoster is how a driver lends one pool buffer to its device. The core
// calls it with Core.Mu held.
type RxPoster interface {
	// Room reports whether a buffer can be posted now and still leave a
	// descriptor for each of held completions: those the core read from
	// the ring past an error and has not handed out yet. Their ids are
	// free in the table already, but a caller posts one buffer per
	// completion it gets, so they stay spoken for until handed out.
	Room(held int) bool
	// PostBuf lends pool buffer b to the device for an operation with
	// ctx, recording it in the ring's table (with Queue.Word). Called
	// after Room said yes.
	PostBuf(b uint32, ctx any) error
}

// NewRx is the receive side of q, whose frames are at most maxFrame
// bytes, posted through p.
func NewRx(q *Queue, p RxPoster, maxFrame int) Rx { return Rx{q: q, post: p, maxFrame: maxFrame} }

// MaxFrame implements nic.RxQueue.
func (r *Rx) MaxFrame() int { return r.maxFrame }

// PostRecv implements nic.RxQueue.
func (r *Rx) PostRecv(ctx any) error {
	_, err := r.postFree(ctx)
	return err
}

// PostRecvBuf is PostRecv that also says where the frame will land: the
// frame area of the buffer it posted (MaxFrame bytes, starting at the
// address the completion reports as Buf). For callers that match posts to
// completions by buffer, as fi_cq's FI_CQ_FORMAT_DATA does. The device
// owns the bytes until the completion is read.
func (r *Rx) PostRecvBuf(ctx any) ([]byte, error) {
	b, err := r.postFree(ctx)
	if err != nil {
		return nil, err
	}
	return r.q.Bufs.Bytes(r.q.Bufs.FrameStart(b), r.maxFrame), nil
}

// postFree posts a free pool buffer and returns its index.
func (r *Rx) postFree(ctx any) (uint32, error) {
	q := r.q
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if err := q.Usable(); err != nil {
		return 0, err
	}
	if !r.post.Room(q.bt - q.bh) {
		return 0, ErrNoDesc
	}
	b, ok := q.Bufs.Get()
	if !ok {
		return 0, ErrNoBuffer
	}
	if err := r.post.PostBuf(b, ctx); err != nil {
		q.Bufs.Recycle(b)
		return 0, err
	}
	return b, nil
}

// Repost implements nic.RxQueue. A buffer that cannot be posted stays
// lent to the caller.
func (r *Rx) Repost(buf uintptr, ctx any) error {
	q := r.q
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if err := q.Usable(); err != nil {
		return err
	}
	return r.repost(buf, ctx)
}

// RepostBurst implements nic.RxQueue: Repost's checks of the queue once,
// then each buffer's own.
func (r *Rx) RepostBurst(bufs []uintptr, ctxs []any) (int, error) {
	if err := checkContexts(len(bufs), ctxs); err != nil {
		return 0, err
	}
	q := r.q
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if err := q.Usable(); err != nil {
		return 0, err
	}
	for i, buf := range bufs {
		if err := r.repost(buf, contextAt(ctxs, i)); err != nil {
			return i, err
		}
	}
	return len(bufs), nil
}

// repost posts buf, a buffer lent to the caller, again. Called locked,
// the queue usable.
func (r *Rx) repost(buf uintptr, ctx any) error {
	q := r.q
	b, err := q.Bufs.Lent(buf)
	if err != nil {
		return err
	}
	if !r.post.Room(q.bt - q.bh) {
		return ErrNoDesc
	}
	if err := r.post.PostBuf(b, ctx); err != nil {
		return err
	}
	q.Bufs.Unlend(b)
	return nil
}

// Release implements nic.RxQueue.
func (r *Rx) Release(buf uintptr) error {
	q := r.q
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if q.Closed {
		return nic.ErrClosed
	}
	return q.Bufs.Release(buf)
}

// Frame implements nic.RxQueue: the bytes of a frame lent to the caller,
// from the Buf and Len of its completion (a cq.Entry carries no slice).
func (r *Rx) Frame(buf uintptr, length int) ([]byte, error) {
	q := r.q
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if q.Closed {
		return nil, nic.ErrClosed
	}
	return q.Bufs.Frame(buf, length, r.maxFrame)
}

// Source is a queue as the cq.CQ it feeds reads it (Vectors.Bind): the
// QueueReader behind a cq/ring.QueueSource, which keeps the CQ's format
// and error order. Its batch read is the driver's Ring.Read, the same
// pass as Poll's, each good completion written straight into the
// caller's cq.Entry; a refused one reaches the CQ with the ring reader's
// code. Once the queue is closed it reads the operations CloseQueue kept, each
// as a flushed error completion (cq.ECANCELED), then nothing.
type Source struct {
	q      *Queue
	irq    *eventfd.FD // the CQ's interrupt eventfd (nil: none)
	unbind func(*Source) error
}

var _ cqring.QueueReader = (*Source)(nil)

// Queue is the queue s reads.
func (s *Source) Queue() *Queue { return s.q }

// ReadBatch implements cqring.QueueReader.
func (s *Source) ReadBatch(qs *cqring.QueueSource, ents []cq.Entry, bad *cqring.Completion) (int, bool) {
	q := s.q
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if q.Closed {
		// A source unbound before the close has none: they went to the
		// one bound then, or nowhere.
		return 0, q.Src == s && q.canceled.Next(bad, q.Flags())
	}
	n, errs := 0, 0
	var bytes uint64
	for n < len(ents) && errs == 0 && q.fill(len(ents)-n) {
		for q.bh < q.bt && n < len(ents) {
			c := &q.batch[q.bh]
			q.bh++
			if c.Err != 0 {
				q.settleRefused(c)
				*bad = *c
				errs = 1
				break
			}
			if q.recv {
				q.Bufs.Lend(q.Bufs.Of(c.Buf))
			}
			qs.Store(&ents[n], c)
			bytes += uint64(c.Len)
			n++
		}
	}
	q.finish(n+errs, errs, bytes)
	return n, errs > 0
}

// Pending implements cqring.QueueReader.
func (s *Source) Pending(max int) int {
	q := s.q
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if q.Closed {
		if q.Src != s {
			return 0
		}
		return min(q.canceled.Len(), max)
	}
	if max <= 0 {
		return 0
	}
	return q.pending(max)
}

// Arm implements cqring.QueueReader with the driver's Ring.Arm.
// solicitedOnly has no NIC equivalent: every completion is solicited.
func (s *Source) Arm(solicitedOnly bool, threshold int) error {
	q := s.q
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if err := q.Usable(); err != nil {
		return err
	}
	late, ok := q.ring.Arm(q.ringThreshold(threshold))
	if !ok {
		return q.NoInterrupt()
	}
	// threshold entries already there at the arm (counted after it:
	// virtio's store of its event is a full barrier) were used before the
	// device could see the event, which it compares only with entries
	// it uses later (QEMU's virtio: vring_need_event over the entries of
	// each flush): it never fires. A CQ fed by several sources arms each
	// for a share of its threshold counted just before (cq's armLocked)
	// and then waits for the whole threshold, so it would sleep through
	// that share. Threshold 0 (late from the ring): the completion after
	// those present came while arming, and an arm that never fires would
	// lose verbs' request-notify event. A spurious wake-up is allowed; a
	// lost one is not.
	if threshold > 0 && !late {
		late = q.pending(threshold) >= threshold
	}
	if late && s.irq != nil {
		return s.irq.Add(1)
	}
	return nil
}

// StrError implements cqring.QueueReader: the driver's status values,
// and 0 for a flushed operation.
func (s *Source) StrError(prov cq.ProvErrno, data []byte) (string, bool) {
	if prov == 0 {
		return s.q.Driver + " " + s.q.Name + ": " + canceled.Flushed, true
	}
	return s.q.ring.StrError(prov, data)
}

// Unbind implements cqring.QueueReader: the queue reads its own
// completions again, with its own interrupt, if the device is still
// open (the device's unbind, given to Vectors.Bind).
func (s *Source) Unbind() error { return s.unbind(s) }
