// Package lcoretest provides a NIC queue for testing code that runs on
// polling cores (package lcore) without a device: a receive queue of a
// software NIC (nic/softnic) whose completions the test injects, from any
// goroutine, as frames sent to it by the other end of its wire. An armed
// queue raises its interrupt through a real eventfd, as a NIC's MSI-X
// vector does through VFIO.
//
// The queue behaves like the strictest hardware: an interrupt fires only
// for a completion written after Arm, never for one already waiting, so a
// consumer that does not poll again after arming loses the wake-up.
package lcoretest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/vfnic/vfnic/eventfd"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/nic/softnic"
)

// FrameLen is the length of every frame the queue receives: FrameLen
// zero bytes.
const FrameLen = 64

// Queue is a nic.RxQueue and nic.TxQueue for one reader: its completions
// are the frames Inject sends it, read from the software NIC's ring. The
// queue keeps its ring full itself (Poll reposts each DMA buffer and lends
// the reader a copy of the frame in its own memory, which Repost and
// Release only check), so a test's reader need not give buffers back.
// Send transmits on the same end of the wire; the queue reclaims those
// completions itself at Flush, so that Poll returns only received frames.
// Its counters count the reader's calls.
type Queue struct {
	dev, peer *softnic.Device
	rx        *softnic.RxQueue
	tx        *softnic.TxQueue // Send's
	inject    *softnic.TxQueue // the peer's, which Inject sends on
	frame     []byte

	recvMu   sync.Mutex // recv: Poll may run beside SRead's
	recv     []byte     // the last frame received, FrameLen bytes
	recvAddr uintptr    // its address, Completion.Buf
	injectMu sync.Mutex
	scratch  []nic.Completion // Inject's
	txc      []nic.Completion // the reader's, for Send's completions

	// BeforeArm, when set, runs at the start of Arm, before the arm takes
	// effect: a test injects there the completion that races with the arm.
	BeforeArm func()

	closed                        atomic.Bool
	posts, flushes, arms, packets atomic.Uint64
}

var (
	_ nic.RxQueue = (*Queue)(nil)
	_ nic.TxQueue = (*Queue)(nil)
)

// New returns queue index with size descriptors (a power of two, as
// softnic rounds down) and an interrupt eventfd, its ring filled.
func New(index, size int) (*Queue, error) {
	if size <= 0 || index < 0 {
		return nil, fmt.Errorf("%w: lcoretest: queue %d of size %d", os.ErrInvalid, index, size)
	}
	w, err := softnic.NewWire("", softnic.Options{MaxQueuePairs: index + 1})
	if err != nil {
		return nil, err
	}
	cfg := nic.Config{QueuePairs: index + 1, QueueSize: size, RxBuffers: 2 * size, BufferSize: nic.MaxFrame + 8}
	q := &Queue{scratch: make([]nic.Completion, 64), txc: make([]nic.Completion, 64)}
	if q.peer, err = w.Open(0, cfg); err != nil {
		return nil, err
	}
	if q.dev, err = w.Open(1, cfg); err != nil {
		return nil, errors.Join(err, q.peer.Close())
	}
	q.rx, _ = q.dev.RxQueue(index) // in range: index+1 pairs
	q.tx, _ = q.dev.TxQueue(index)
	q.inject, _ = q.peer.TxQueue(index) // frames that are no IP go to the queue of the sender's index
	for q.rx.PostRecv(nil) == nil {
	}
	if err := q.rx.Flush(); err != nil {
		return nil, errors.Join(err, q.Close())
	}
	q.recv = make([]byte, FrameLen)
	q.recvAddr = uintptr(unsafe.Pointer(&q.recv[0]))
	// 64 zero bytes, as tests of filters expect: MACs and EtherType 0
	// (the wire steers a frame that is no IP to the queue of the sender's
	// index, and takes any MAC).
	q.frame = make([]byte, FrameLen)
	return q, nil
}

// Inject has n frames arrive, as the device would write their completions,
// and raises the interrupt if the queue is armed (once per arm). It
// reports whether it raised the interrupt. Frames for which no buffer is
// posted are dropped, as a NIC drops them.
func (q *Queue) Inject(n int) bool {
	q.injectMu.Lock()
	defer q.injectMu.Unlock()
	before := q.rx.Raised()
	for range n {
		for q.inject.Send(q.frame, nil) != nil {
			if q.inject.Flush() != nil {
				return false // closed
			}
			q.inject.Poll(q.scratch)
		}
	}
	_ = q.inject.Flush()
	for q.inject.Poll(q.scratch) == len(q.scratch) {
	}
	return q.rx.Raised() != before
}

// Pending returns the completions written and not read yet.
func (q *Queue) Pending() int { return q.rx.Ready(2 * q.rx.Size()) }

// Counters are the queue's calls, for tests.
type Counters struct {
	// Posts counts PostRecv, Repost and Send; Flushes, Arms and Fired
	// (interrupts raised) count what their names say; Packets counts
	// completions read.
	Posts, Flushes, Arms, Fired, Packets uint64
}

// Counters returns the queue's counters.
func (q *Queue) Counters() Counters {
	return Counters{Posts: q.posts.Load(), Flushes: q.flushes.Load(), Arms: q.arms.Load(),
		Fired: q.rx.Raised(), Packets: q.packets.Load()}
}

// Index implements nic.Queue.
func (q *Queue) Index() int { return q.rx.Index() }

// Size implements nic.Queue.
func (q *Queue) Size() int { return q.rx.Size() }

// Outstanding implements nic.Queue: receive buffers posted and sends not
// completed.
func (q *Queue) Outstanding() int { return q.rx.Outstanding() + q.tx.Outstanding() }

// Flush implements nic.Queue: both directions, and the completions of
// what Send sent are reclaimed.
func (q *Queue) Flush() error {
	if err := q.rx.Flush(); err != nil {
		return err
	}
	q.flushes.Add(1)
	err := q.tx.Flush()
	for q.tx.Poll(q.txc) == len(q.txc) {
	}
	return err
}

// Poll implements nic.Queue: received frames of FrameLen bytes, each
// copied into the queue's own frame buffer (Buf is its address) while the
// DMA buffer goes back to the device at once, so that the ring stays full
// whatever the reader does; a poll that returns completions turns the
// interrupt off, as drivers do.
func (q *Queue) Poll(out []nic.Completion) int {
	n := q.rx.Poll(out)
	if n == 0 {
		return 0
	}
	for i := range out[:n] {
		c := &out[i]
		if c.Err != nil {
			_ = q.rx.PostRecv(nil) // the driver recycled the buffer
			continue
		}
		q.recvMu.Lock()
		copy(q.recv, c.Data)
		q.recvMu.Unlock()
		_ = q.rx.Repost(c.Buf, nil)
		c.Buf, c.Data = q.recvAddr, q.recv[:c.Len]
	}
	_ = q.rx.Flush()
	q.packets.Add(uint64(n))
	return n
}

// SRead implements nic.Queue with nic.SRead.
func (q *Queue) SRead(ctx context.Context, out []nic.Completion, threshold int, timeout time.Duration) (int, error) {
	return nic.SRead(ctx, q, out, threshold, timeout)
}

// Arm implements nic.Queue: the next completion written raises the
// interrupt. Completions already written raise nothing.
func (q *Queue) Arm(threshold int) error {
	if f := q.BeforeArm; f != nil {
		f()
	}
	if err := q.rx.Arm(threshold); err != nil {
		return err
	}
	q.arms.Add(1)
	return nil
}

// Interrupt implements nic.Queue.
func (q *Queue) Interrupt() *eventfd.FD { return q.rx.Interrupt() }

// WaitInterrupt implements nic.Queue.
func (q *Queue) WaitInterrupt(ctx context.Context, deadline time.Time) error {
	return q.rx.WaitInterrupt(ctx, deadline)
}

// Stats implements nic.Queue.
func (q *Queue) Stats() nic.QueueStats { return q.rx.Stats() }

// PostRecv implements nic.RxQueue: the ring is always full, so it only
// counts.
func (q *Queue) PostRecv(any) error { return q.count(q.usable()) }

// Repost implements nic.RxQueue: it checks the buffer and counts.
func (q *Queue) Repost(buf uintptr, _ any) error { return q.count(q.own(buf)) }

// RepostBurst implements nic.RxQueue: Repost of each buffer in order.
func (q *Queue) RepostBurst(bufs []uintptr, _ []any) (int, error) {
	for i, b := range bufs {
		if err := q.Repost(b, nil); err != nil {
			return i, err
		}
	}
	return len(bufs), nil
}

// Release implements nic.RxQueue: the buffer is the queue's own, so it
// only checks it.
func (q *Queue) Release(buf uintptr) error { return q.own(buf) }

// MaxFrame implements nic.RxQueue and nic.TxQueue.
func (q *Queue) MaxFrame() int { return nic.MaxFrame }

// Frame implements nic.RxQueue.
func (q *Queue) Frame(buf uintptr, length int) ([]byte, error) {
	if err := q.own(buf); err != nil {
		return nil, err
	}
	if length < 0 || length > FrameLen {
		return nil, fmt.Errorf("%w: %d bytes of a %d-byte frame", nic.ErrBadBuffer, length, FrameLen)
	}
	return q.recv[:length], nil
}

// own checks that buf is the address Poll reports.
func (q *Queue) own(buf uintptr) error {
	if buf != q.recvAddr {
		return fmt.Errorf("%w: %#x is not this queue's frame", nic.ErrBadBuffer, buf)
	}
	return q.usable()
}

// usable is nic.ErrClosed once the queue is closed.
func (q *Queue) usable() error {
	if q.closed.Load() {
		return nic.ErrClosed
	}
	return nil
}

// Send implements nic.TxQueue: the frame goes to the other end of the
// wire, which drops it (it posts no buffer).
func (q *Queue) Send(frame []byte, ctx any) error {
	if len(frame) > nic.MaxFrame {
		return fmt.Errorf("%w: %d bytes", nic.ErrFrameSize, len(frame))
	}
	err := q.tx.Send(frame, ctx)
	if errors.Is(err, nic.ErrFull) {
		// Reclaim and retry: the queue's own sends complete at Flush.
		if err = q.tx.Flush(); err == nil {
			for q.tx.Poll(q.txc) == len(q.txc) {
			}
			err = q.tx.Send(frame, ctx)
		}
	}
	return q.count(err)
}

// SendFunc implements nic.TxQueue as Send does, through the wire's
// in-place send.
func (q *Queue) SendFunc(n int, ctx any, fill func([]byte)) error {
	if n > nic.MaxFrame {
		return fmt.Errorf("%w: %d bytes", nic.ErrFrameSize, n)
	}
	err := q.tx.SendFunc(n, ctx, fill)
	if errors.Is(err, nic.ErrFull) {
		if err = q.tx.Flush(); err == nil {
			for q.tx.Poll(q.txc) == len(q.txc) {
			}
			err = q.tx.SendFunc(n, ctx, fill)
		}
	}
	return q.count(err)
}

// SendBurst implements nic.TxQueue as Send does: when the ring fills, its
// completions are reclaimed and the rest of the burst posted.
func (q *Queue) SendBurst(frames [][]byte, ctxs []any) (int, error) {
	n, err := q.tx.SendBurst(frames, ctxs)
	if errors.Is(err, nic.ErrFull) {
		if err = q.tx.Flush(); err == nil {
			for q.tx.Poll(q.txc) == len(q.txc) {
			}
			var rest []any
			if ctxs != nil {
				rest = ctxs[n:]
			}
			var k int
			k, err = q.tx.SendBurst(frames[n:], rest)
			n += k
		}
	}
	q.posts.Add(uint64(n))
	return n, err
}

// count counts a successful post.
func (q *Queue) count(err error) error {
	if err == nil {
		q.posts.Add(1)
	}
	return err
}

// Close closes both ends of the queue's wire, the eventfd with them. It is
// safe to call more than once.
func (q *Queue) Close() error {
	q.closed.Store(true)
	return errors.Join(q.dev.Close(), q.peer.Close())
}
