package afxdp

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/vfnic/vfnic/cq"
	cqring "github.com/vfnic/vfnic/cq/ring"
	"github.com/vfnic/vfnic/eventfd"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/nic/internal/canceled"
	qcore "github.com/vfnic/vfnic/nic/internal/queue"
)

// cqSource is an afxdp queue as the cq.CQ it feeds reads it (BindCQ): the
// QueueReader behind a cq/ring.QueueSource. Its batch read is the queue's
// take, the same read and checks per entry as Poll's. The CQ's wait
// object is an eventfd, which the socket's readiness cannot be wired to
// as an MSI-X vector is: an armed source has a goroutine parked on the
// socket's readiness (the runtime poller, the same eventfd.FD wait) that
// signals the CQ's eventfd once it is readable. Once the queue is closed
// it reads the operations close kept, each as a flushed completion
// (cq.ECANCELED), then nothing.
type cqSource struct {
	dev  *Device
	rx   *RxQueue // one of rx and tx is set
	tx   *TxQueue
	q    *queue
	qnum uint32      // Entry.Queue: 2i for receive queue i, 2i+1 for transmit
	irq  *eventfd.FD // the CQ's interrupt eventfd (nil: none)

	arm   chan struct{} // pokes the forwarder: an arm, or sends flushed while armed
	armed atomic.Bool   // the CQ asked for a signal that has not come yet
	stop  context.CancelFunc
	done  chan struct{}
}

var _ cqring.QueueReader = (*cqSource)(nil)

// BindCQ implements nic.Device. Entry.Queue is 2i for the receive queue of
// pair i and 2i+1 for its transmit queue. A receive entry's Buf is the
// frame (RxQueue.Frame, Repost, Release).
func (d *Device) BindCQ(c *cq.CQ, i int, dir nic.Direction) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := qcore.CheckBind(d.name, d.closed, c, i, len(d.rx), dir); err != nil {
		return err
	}
	var srcs []*cqSource
	if dir&nic.Recv != 0 {
		srcs = append(srcs, &cqSource{dev: d, rx: d.rx[i], q: &d.rx[i].queue, qnum: uint32(2 * i)})
	}
	if dir&nic.Send != 0 {
		srcs = append(srcs, &cqSource{dev: d, tx: d.tx[i], q: &d.tx[i].queue, qnum: uint32(2*i + 1)})
	}
	for _, s := range srcs {
		if s.q.Bound() {
			return fmt.Errorf("%w: %s: queue %s already feeds a CQ", nic.ErrInvalid, d.name, s.q.Name)
		}
	}
	for _, s := range srcs {
		if err := c.Driver().Bind(); err != nil {
			return err
		}
		s.irq = c.Driver().Interrupt()
		if err := c.Driver().AddSource(cqring.NewQueueSource(s, s.q.Name, s.qnum)); err != nil {
			c.Driver().Unbind()
			return err
		}
		d.bound = append(d.bound, c)
		s.q.Mu.Lock()
		s.q.Src = s
		s.q.Mu.Unlock()
		if s.irq != nil {
			ctx, stop := context.WithCancel(context.Background())
			s.arm, s.stop, s.done = make(chan struct{}, 1), stop, make(chan struct{})
			d.forwarders = append(d.forwarders, s)
			go s.forward(ctx)
		}
	}
	return nil
}

// forward signals the CQ's eventfd once, after an arm, the socket is
// readable (a receive queue), or after TxOwedWait at the most while sends
// are owed (a transmit queue: AF_XDP signals no completion; a transmit
// queue's Flush pokes it while armed). A spurious signal is allowed, a
// lost one is not.
func (s *cqSource) forward(ctx context.Context) {
	defer close(s.done)
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.arm:
		}
		if !s.armed.Load() {
			continue
		}
		var deadline time.Time
		if s.tx != nil {
			if s.tx.Outstanding() == 0 {
				continue // nothing can complete before a Flush, which pokes
			}
			deadline = time.Now().Add(TxOwedWait)
		}
		if _, err := s.q.x.irq.Wait(ctx, deadline); err != nil && !errors.Is(err, eventfd.ErrTimeout) {
			return // ctx ended, or the socket closed
		}
		if s.armed.CompareAndSwap(true, false) {
			_ = s.irq.Add(1)
		}
	}
}

// poke wakes the forwarder (non-blocking: one pending poke is enough).
func (s *cqSource) poke() {
	select {
	case s.arm <- struct{}{}:
	default:
	}
}

// halt ends the forwarder, if any, and waits for it.
func (s *cqSource) halt() {
	if s.stop != nil {
		s.stop()
		<-s.done
	}
}

// take is the queue's take.
func (s *cqSource) take(c *cqring.Completion) bool {
	if s.rx != nil {
		return s.rx.take(c)
	}
	return s.tx.take(c)
}

// ReadBatch implements cqring.QueueReader.
func (s *cqSource) ReadBatch(qs *cqring.QueueSource, ents []cq.Entry, bad *cqring.Completion) (int, bool) {
	q := s.q
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if q.Closed {
		return 0, q.Src == s && q.canceled.Next(bad, s.flags())
	}
	n, errs := 0, 0
	var bytes uint64
	var c cqring.Completion
	for n < len(ents) && s.take(&c) {
		if c.Err != 0 {
			*bad = c
			errs = 1
			break
		}
		qs.Store(&ents[n], &c)
		bytes += uint64(c.Len)
		n++
	}
	if n+errs > 0 {
		q.src.Publish()
		q.Count(n+errs, errs, bytes)
	}
	if s.tx != nil {
		s.tx.rekick()
	}
	return n, errs > 0
}

// flags are those the queue's operations are posted with.
func (s *cqSource) flags() cq.Flags {
	if s.rx != nil {
		return cq.FlagRecv | cq.FlagMsg
	}
	return cq.FlagSend | cq.FlagMsg
}

// Pending implements cqring.QueueReader.
func (s *cqSource) Pending(max int) int {
	s.q.Mu.Lock()
	defer s.q.Mu.Unlock()
	if s.q.Closed {
		if s.q.Src != s {
			return 0
		}
		return min(s.q.canceled.Len(), max)
	}
	if s.q.broken || max <= 0 {
		return 0
	}
	return s.q.src.Pending(max)
}

// Arm implements cqring.QueueReader: the CQ's eventfd is signalled at
// once when entries are ready, else by the forwarder once the socket is
// readable. solicitedOnly has no AF_XDP equivalent.
func (s *cqSource) Arm(solicitedOnly bool, threshold int) error {
	q := s.q
	q.Mu.Lock()
	if err := q.usable(); err != nil {
		q.Mu.Unlock()
		return err
	}
	if s.tx != nil {
		s.tx.rekick()
	} else if q.out > 0 && q.x.fill.needWakeup() {
		q.Notifies.Add(1)
		_ = q.x.kickFill()
	}
	ready := q.src.Pending(1) > 0
	q.Mu.Unlock()
	if s.irq == nil {
		return nil
	}
	if ready {
		return s.irq.Add(1)
	}
	s.armed.Store(true)
	s.poke()
	return nil
}

// StrError implements cqring.QueueReader: afxdp reports only cq's own
// codes, which the CQ describes itself, and 0 for a flushed operation.
func (s *cqSource) StrError(provErrno cq.ProvErrno, errData []byte) (string, bool) {
	if provErrno == 0 {
		return "afxdp " + s.q.Name + ": " + canceled.Flushed, true
	}
	return "", false
}

// Unbind implements cqring.QueueReader: the queue reads its own
// completions again.
func (s *cqSource) Unbind() error {
	s.halt()
	s.q.Mu.Lock()
	defer s.q.Mu.Unlock()
	if s.q.Src == s {
		s.q.Src = nil
		s.q.canceled.Drop()
	}
	return nil
}
