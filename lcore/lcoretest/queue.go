// Package lcoretest provides a software NIC queue for testing code that
// runs on polling cores (package lcore) without a device: completions are
// injected by the test, from any goroutine, and an armed queue raises its
// "interrupt" through a real eventfd, as a NIC's MSI-X vector does through
// VFIO.
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
)

// FrameLen is the length of every frame the queue "receives".
const FrameLen = 64

// Queue is a software nic.RxQueue and nic.TxQueue. Its device side is
// Inject; its driver side is the nic.Queue methods, for one reader.
type Queue struct {
	index int
	size  int
	efd   *eventfd.FD
	frame []byte // the bytes every received completion points at

	mu      sync.Mutex
	pending int  // completions written and not read
	armed   bool // the next Inject raises the interrupt
	closed  bool

	// BeforeArm, when set, runs at the start of Arm, before the arm takes
	// effect: a test injects there the completion that races with the arm.
	BeforeArm func()

	posts, flushes, arms, fired, packets atomic.Uint64
}

var (
	_ nic.RxQueue = (*Queue)(nil)
	_ nic.TxQueue = (*Queue)(nil)
)

// New returns queue index with size descriptors and an interrupt eventfd.
func New(index, size int) (*Queue, error) {
	if size <= 0 || index < 0 {
		return nil, fmt.Errorf("%w: lcoretest: queue %d of size %d", os.ErrInvalid, index, size)
	}
	efd, err := eventfd.New()
	if err != nil {
		return nil, err
	}
	return &Queue{index: index, size: size, efd: efd, frame: make([]byte, FrameLen)}, nil
}

// Inject writes n completions, as the device would, and raises the
// interrupt if the queue is armed (once per arm). It reports whether it
// raised the interrupt.
func (q *Queue) Inject(n int) bool {
	q.mu.Lock()
	if q.closed || n <= 0 {
		q.mu.Unlock()
		return false
	}
	q.pending += n
	fire := q.armed
	q.armed = false
	q.mu.Unlock()
	if !fire {
		return false
	}
	// Written after the unlock, as a device raises its interrupt after
	// the entry: a reader woken on this CPU must not find the queue
	// locked by the writer it preempted.
	q.fired.Add(1)
	_ = q.efd.Add(1)
	return true
}

// Pending returns the completions written and not read yet.
func (q *Queue) Pending() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.pending
}

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
		Fired: q.fired.Load(), Packets: q.packets.Load()}
}

// Index implements nic.Queue.
func (q *Queue) Index() int { return q.index }

// Size implements nic.Queue.
func (q *Queue) Size() int { return q.size }

// Outstanding implements nic.Queue: the queue always has a full ring.
func (q *Queue) Outstanding() int { return q.size }

// Flush implements nic.Queue.
func (q *Queue) Flush() error {
	if q.isClosed() {
		return nic.ErrClosed
	}
	q.flushes.Add(1)
	return nil
}

// Poll implements nic.Queue. Each completion is a FrameLen-byte frame; a
// poll that returns completions turns the interrupt off, as drivers do.
func (q *Queue) Poll(out []nic.Completion) int {
	q.mu.Lock()
	n := min(len(out), q.pending)
	if q.closed {
		n = 0
	}
	q.pending -= n
	if n > 0 {
		q.armed = false
	}
	q.mu.Unlock()
	buf := uintptr(unsafe.Pointer(&q.frame[0]))
	for i := range out[:n] {
		out[i] = nic.Completion{Buf: buf, Data: q.frame, Len: FrameLen, Queue: q.index}
	}
	q.packets.Add(uint64(n))
	return n
}

// SRead implements nic.Queue with nic.SRead.
func (q *Queue) SRead(ctx context.Context, out []nic.Completion, threshold int, timeout time.Duration) (int, error) {
	return nic.SRead(ctx, q, out, threshold, timeout)
}

// Arm implements nic.Queue: the next Inject raises the interrupt.
// Completions already written raise nothing.
func (q *Queue) Arm(threshold int) error {
	if f := q.BeforeArm; f != nil {
		f()
	}
	// WaitInterrupt on a pinned thread leaves the count it woke on. Taken
	// outside the lock, which Inject takes.
	_, _ = q.efd.TakeLeft()
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return nic.ErrClosed
	}
	q.arms.Add(1)
	q.armed = true
	return nil
}

// Interrupt implements nic.Queue.
func (q *Queue) Interrupt() *eventfd.FD { return q.efd }

// WaitInterrupt implements nic.Queue.
func (q *Queue) WaitInterrupt(ctx context.Context, deadline time.Time) error {
	_, err := q.efd.Await(ctx, deadline)
	switch {
	case errors.Is(err, eventfd.ErrTimeout):
		return nic.ErrTimeout
	case errors.Is(err, eventfd.ErrClosed):
		return nic.ErrClosed
	}
	return err
}

// Stats implements nic.Queue.
func (q *Queue) Stats() nic.QueueStats {
	return nic.QueueStats{Packets: q.packets.Load(), Bytes: FrameLen * q.packets.Load(),
		Notifies: q.flushes.Load(), Interrupts: q.fired.Load()}
}

// PostRecv implements nic.RxQueue; it only counts.
func (q *Queue) PostRecv(any) error { return q.post() }

// Repost implements nic.RxQueue; it only counts.
func (q *Queue) Repost(uintptr, any) error { return q.post() }

// Release implements nic.RxQueue.
func (q *Queue) Release(uintptr) error {
	if q.isClosed() {
		return nic.ErrClosed
	}
	return nil
}

// MaxFrame implements nic.RxQueue and nic.TxQueue.
func (q *Queue) MaxFrame() int { return nic.MaxFrame }

// Frame implements nic.RxQueue.
func (q *Queue) Frame(buf uintptr, length int) ([]byte, error) {
	if buf != uintptr(unsafe.Pointer(&q.frame[0])) || length < 0 || length > FrameLen {
		return nil, nic.ErrBadBuffer
	}
	return q.frame[:length], nil
}

// Send implements nic.TxQueue; it only counts.
func (q *Queue) Send(frame []byte, _ any) error {
	if len(frame) < nic.MinFrame || len(frame) > nic.MaxFrame {
		return nic.ErrFrameSize
	}
	return q.post()
}

func (q *Queue) post() error {
	if q.isClosed() {
		return nic.ErrClosed
	}
	q.posts.Add(1)
	return nil
}

func (q *Queue) isClosed() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.closed
}

// Close closes the queue and its eventfd. It is safe to call more than once.
func (q *Queue) Close() error {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	return q.efd.Close()
}
