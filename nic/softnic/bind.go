package softnic

import (
	"github.com/vfnic/vfnic/cq"
	cqring "github.com/vfnic/vfnic/cq/ring"
	"github.com/vfnic/vfnic/eventfd"
	"github.com/vfnic/vfnic/nic/internal/canceled"
)

// cqSource is a queue as the cq.CQ it feeds reads it (BindCQ): the
// QueueReader behind a cq/ring.QueueSource. Its batch read is the queue's
// next, the same take per entry as Poll's, so the queue keeps its
// bookkeeping whichever way it is read. Once the queue is closed it reads
// the operations close kept, each as a flushed error completion
// (cq.ECANCELED), then nothing.
type cqSource struct {
	q   *queue
	irq *eventfd.FD // the CQ's interrupt eventfd (nil: none)
}

var _ cqring.QueueReader = (*cqSource)(nil)

// bind makes the queue feed c, its interrupt signalling c's eventfd.
func (q *queue) bind(c *cq.CQ) error {
	s := &cqSource{q: q}
	if err := c.Driver().Bind(); err != nil {
		return err
	}
	if err := c.Driver().AddSource(cqring.NewQueueSource(s, q.Name, q.qnum)); err != nil {
		c.Driver().Unbind()
		return err
	}
	s.irq = c.Driver().Interrupt()
	q.Mu.Lock()
	q.Src = s
	q.armd = false
	q.Mu.Unlock()
	q.target(s.irq)
	return nil
}

// target points the queue's interrupt at irq, disarmed.
func (q *queue) target(irq *eventfd.FD) {
	r := q.dev
	r.mu.Lock()
	r.irq, r.armed = irq, false
	r.mu.Unlock()
}

// ReadBatch implements cqring.QueueReader.
func (s *cqSource) ReadBatch(qs *cqring.QueueSource, ents []cq.Entry, bad *cqring.Completion) (int, bool) {
	q := s.q
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if q.Closed {
		// A source unbound before the close has none (they went to the
		// one bound then, or nowhere).
		return 0, q.Src == s && q.flushed.Next(bad, s.flags())
	}
	n, errs := 0, 0
	var bytes uint64
	var c cqring.Completion
	for n < len(ents) && q.next(&c) {
		if c.Err != 0 {
			*bad = c
			errs = 1
			break
		}
		qs.Store(&ents[n], &c)
		bytes += uint64(c.Len)
		n++
	}
	q.finish(n+errs, errs, bytes)
	return n, errs > 0
}

// flags are those the queue's operations are posted with, for its
// flushed completions.
func (s *cqSource) flags() cq.Flags {
	if s.q.rx {
		return cq.FlagRecv | cq.FlagMsg
	}
	return cq.FlagSend | cq.FlagMsg
}

// Pending implements cqring.QueueReader.
func (s *cqSource) Pending(max int) int {
	q := s.q
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if q.Closed {
		if q.Src != s {
			return 0
		}
		return min(q.flushed.Len(), max)
	}
	return q.src.Pending(max)
}

// Arm implements cqring.QueueReader: one interrupt on the CQ's eventfd
// once threshold entries beyond those read are written (every completion
// is solicited).
func (s *cqSource) Arm(solicitedOnly bool, threshold int) error {
	q := s.q
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if err := q.usable(); err != nil {
		return err
	}
	if s.irq == nil {
		return q.NoInterrupt()
	}
	q.dev.arm(q.src.Ring().Count(), threshold)
	return nil
}

// StrError implements cqring.QueueReader: the device's status values, and
// 0 for a flushed operation.
func (s *cqSource) StrError(prov cq.ProvErrno, data []byte) (string, bool) {
	if prov == 0 {
		return "softnic " + s.q.Name + ": " + canceled.Flushed, true
	}
	return s.q.src.StrError(prov, data)
}

// Unbind implements cqring.QueueReader: the queue reads its own
// completions again, its interrupt back on its own eventfd.
func (s *cqSource) Unbind() error {
	q := s.q
	q.Mu.Lock()
	mine := q.Src == s
	if mine {
		q.Src = nil
		q.flushed.Drop() // a closed CQ loses what it held
	}
	q.Mu.Unlock()
	if mine {
		q.target(q.EFD)
	}
	return nil
}
