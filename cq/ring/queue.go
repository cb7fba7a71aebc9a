package ring

import (
	"fmt"

	"github.com/vfnic/vfnic/cq"
)

// QueueReader is a NIC queue as a QueueSource reads it: the driver's own
// read of its ring (Next plus its bookkeeping), a batch at a time, so that
// the queue's API and a CQ it feeds share one per-entry path.
type QueueReader interface {
	// ReadBatch locks the queue, takes completions into ents through
	// qs.Store until ents is full or no further entry is ready, and stops
	// after a refused entry, which it copies to bad (refused true); then
	// it ends the batch (doorbell, counters) and unlocks.
	ReadBatch(qs *QueueSource, ents []cq.Entry, bad *Completion) (n int, refused bool)
	// Pending counts, up to max, the entries ready (a refused one counts).
	Pending(max int) int
	// Arm asks for the queue's interrupt (cq.Source.Arm).
	Arm(solicitedOnly bool, threshold int) error
	// StrError describes a device status value (cq.Source.StrError).
	StrError(provErrno cq.ProvErrno, errData []byte) (string, bool)
	// Unbind gives the queue its own completions back (cq.Source.Close).
	Unbind() error
}

// QueueSource is the Source a NIC driver hands to a CQ for one of its
// queues (BindCQ): the CQ's format, the ordering of error completions
// (successes before the first error; ReadErr takes it) and the probe of a
// zero-count Read, around the driver's batch read. Entries carry no source
// address (raw Ethernet: cq.AddrNotAvail).
type QueueSource struct {
	r     QueueReader
	name  string
	queue uint32 // cq.Entry.Queue

	attached bool
	mFlags   cq.Flags
	mLen     int
	mBuf     uintptr

	held   bool // one: a success that ReadErr read and Poll owes
	one    [1]cq.Entry
	staged bool // errEnt waits for ReadErr
	errEnt cq.ErrEntry
	bad    Completion
	closed bool
}

var _ cq.Source = (*QueueSource)(nil)

// NewQueueSource makes the Source of a driver's queue named name, whose
// completions report queue as cq.Entry.Queue.
func NewQueueSource(r QueueReader, name string, queue uint32) *QueueSource {
	return &QueueSource{r: r, name: name, queue: queue}
}

// Store writes a good completion into a CQ entry in the CQ's format: the
// one write of the caller's record, from the ring reader's single decode.
func (s *QueueSource) Store(e *cq.Entry, c *Completion) {
	*e = cq.Entry{Context: c.Context, Flags: c.Flags & s.mFlags, Len: c.Len & s.mLen, Buf: c.Buf & s.mBuf, Queue: s.queue}
}

// Attach implements cq.Source.
func (s *QueueSource) Attach(f cq.Format) error {
	if s.attached {
		return fmt.Errorf("%w: queue %s already feeds a CQ", cq.ErrInvalid, s.name)
	}
	s.attached = true
	if f >= cq.FormatMsg {
		s.mFlags, s.mLen = ^cq.Flags(0), -1
	}
	if f >= cq.FormatData {
		s.mBuf = ^uintptr(0)
	}
	return nil
}

// Poll implements cq.Source: successful completions up to the first refused
// entry, which is staged for ReadErr.
func (s *QueueSource) Poll(ents []cq.Entry, addrs []cq.Addr) (int, cq.SourceState) {
	if len(ents) == 0 && !s.held {
		s.peek() // a probe: stage an error entry at the head
	}
	if s.staged {
		return 0, cq.SourceError
	}
	n := 0
	if s.held && len(ents) > 0 {
		ents[0] = s.one[0]
		s.held = false
		n++
	}
	if n < len(ents) {
		k, refused := s.r.ReadBatch(s, ents[n:], &s.bad)
		n += k
		if refused {
			s.stage()
		}
	}
	for i := range min(n, len(addrs)) {
		addrs[i] = cq.AddrNotAvail
	}
	if s.staged {
		return n, cq.SourceError
	}
	return n, cq.SourceOK
}

// stage makes the refused completion in s.bad the pending error entry,
// with the ring reader's code. Cold path.
func (s *QueueSource) stage() {
	c := &s.bad
	s.errEnt = cq.ErrEntry{Entry: cq.Entry{Context: c.Context, Flags: c.Flags, Len: c.Len, Queue: s.queue},
		OLen: c.OLen, Err: c.Err, ProvErrno: c.Prov}
	s.staged = true
}

// peek reads one entry when nothing is staged or held: an error is staged,
// a success is held for the next Poll.
func (s *QueueSource) peek() {
	if s.staged || s.held {
		return
	}
	k, refused := s.r.ReadBatch(s, s.one[:], &s.bad)
	switch {
	case refused:
		s.stage()
	case k == 1:
		s.held = true
	}
}

// Pending implements cq.Source.
func (s *QueueSource) Pending(max int) int {
	n := 0
	if s.staged || s.held {
		n++
	}
	if n < max {
		n += s.r.Pending(max - n)
	}
	return min(n, max)
}

// ReadErr implements cq.Source. When nothing is staged it reads one entry: an
// error is returned, a success is kept for the next Poll.
func (s *QueueSource) ReadErr(e *cq.ErrEntry) ([]byte, bool) {
	if !s.held {
		s.peek()
	}
	if !s.staged {
		return nil, false
	}
	buf := e.ErrData
	*e = s.errEnt
	e.ErrData = buf
	s.staged = false
	return nil, true
}

// Arm implements cq.Source.
func (s *QueueSource) Arm(solicitedOnly bool, threshold int) error {
	return s.r.Arm(solicitedOnly, threshold)
}

// StrError implements cq.Source.
func (s *QueueSource) StrError(provErrno cq.ProvErrno, errData []byte) (string, bool) {
	return s.r.StrError(provErrno, errData)
}

// Close implements cq.Source: the queue reads its own completions again.
func (s *QueueSource) Close() error {
	if s.closed {
		return nil
	}
	s.closed = true
	return s.r.Unbind()
}
