package virtio

import (
	"errors"
	"fmt"

	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/cq/ring"
	"github.com/vfnic/vfnic/nic"
)

// Provider error numbers (cq.ErrEntry.ProvErrno) of virtio error
// completions that cq has no number for; bad ids, lengths and phases use
// cq.ProvBadID, cq.ProvBadLen and cq.ProvBadPhase.
const (
	// ProvBadIndex: a split ring's used index moved past the outstanding
	// buffers; the queue is broken until the device is reset.
	ProvBadIndex = 1
	// ProvMultiBuffer: a received frame spanned several buffers (Err is
	// cq.ETRUNC); each of its buffers completes with this error.
	ProvMultiBuffer = 2
)

// pollQueue is what a CQ source needs of a receive or transmit queue:
// its validating reader, called with the queue locked.
type pollQueue interface {
	poll(out []nic.Completion) int
}

// cqSource feeds a cq.CQ from one virtio queue: the queue's used ring is
// the completion ring, read by the same validating reader as Poll, and
// its entries are converted to cq.Entry in batches. It implements
// ring.Source; the CQ serialises the calls.
type cqSource struct {
	dev   *Device
	pq    pollQueue
	q     *queue
	qnum  uint32   // virtqueue index, reported as Entry.Queue
	flags cq.Flags // FlagRecv|FlagMsg or FlagSend|FlagMsg

	attached bool
	mFlags   cq.Flags // all ones for the fields the CQ's format has
	mLen     int
	mBuf     uintptr

	scratch [32]nic.Completion
	held    bool // scratch[0] is a success that ReadErr read and Poll owes
	staged  bool // errEnt is an error completion waiting for ReadErr
	errEnt  cq.ErrEntry
	errData []byte
	closed  bool
}

var _ ring.Source = (*cqSource)(nil)

// Attach implements ring.Source.
func (s *cqSource) Attach(f cq.Format) error {
	if s.attached {
		return fmt.Errorf("%w: virtio queue %s already feeds a CQ", cq.ErrInvalid, s.q.vq.name)
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

func (s *cqSource) convert(e *cq.Entry, c *nic.Completion) {
	*e = cq.Entry{Context: c.Context, Flags: s.flags & s.mFlags, Len: c.Len & s.mLen, Buf: c.Buf & s.mBuf, Queue: s.qnum}
}

// Poll implements ring.Source: successful completions up to the first error
// entry, which is staged for ReadErr.
func (s *cqSource) Poll(ents []cq.Entry, addrs []cq.Addr) (int, ring.State) {
	if len(ents) == 0 && !s.held {
		s.peek() // a probe: stage an error entry at the head
	}
	if s.staged {
		return 0, ring.StateError
	}
	n := 0
	if s.held && len(ents) > 0 {
		s.convert(&ents[0], &s.scratch[0])
		s.held = false
		n++
	}
	s.q.mu.Lock()
	for n < len(ents) && !s.q.closed {
		want := min(len(s.scratch), len(ents)-n)
		k := s.pq.poll(s.scratch[:want])
		for i := range k {
			c := &s.scratch[i]
			if c.Err != nil {
				s.stage(c) // always the last of the batch
				break
			}
			s.convert(&ents[n], c)
			n++
		}
		if s.staged || k < want {
			break
		}
	}
	s.q.mu.Unlock()
	for i := range min(n, len(addrs)) {
		addrs[i] = cq.AddrNotAvail // raw Ethernet: no fabric addresses
	}
	if s.staged {
		return n, ring.StateError
	}
	return n, ring.StateOK
}

// stage turns an error completion into the pending cq.ErrEntry. Cold path.
func (s *cqSource) stage(c *nic.Completion) {
	prov, errno := cq.ProvBadID, cq.EIO
	switch {
	case errors.Is(c.Err, nic.ErrBadLen):
		prov = cq.ProvBadLen
	case errors.Is(c.Err, nic.ErrBadPhase):
		prov = cq.ProvBadPhase
	case errors.Is(c.Err, nic.ErrBadIndex):
		prov = ProvBadIndex
	case errors.Is(c.Err, nic.ErrMultiBuffer):
		prov, errno = ProvMultiBuffer, cq.ETRUNC
	}
	s.errEnt = cq.ErrEntry{Entry: cq.Entry{Context: c.Context, Flags: s.flags, Queue: s.qnum}, Err: errno, ProvErrno: prov}
	s.errData = append(s.errData[:0], c.Err.Error()...)
	s.staged = true
}

// Pending implements ring.Source.
func (s *cqSource) Pending(max int) int {
	n := 0
	if s.staged || s.held {
		n++
	}
	s.q.mu.Lock()
	if !s.q.closed {
		n += s.q.vq.pending(max - n)
	}
	s.q.mu.Unlock()
	return min(n, max)
}

// ReadErr implements ring.Source. When nothing is staged it reads one entry:
// an error is returned, a success is kept for the next Poll.
func (s *cqSource) ReadErr(e *cq.ErrEntry) ([]byte, bool) {
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
	return s.errData, true
}

// peek reads one entry when nothing is staged or held: an error is staged,
// a success is held for the next Poll.
func (s *cqSource) peek() {
	if s.staged || s.held {
		return
	}
	s.q.mu.Lock()
	k := 0
	if !s.q.closed {
		k = s.pq.poll(s.scratch[:1])
	}
	s.q.mu.Unlock()
	if k == 1 {
		if s.scratch[0].Err != nil {
			s.stage(&s.scratch[0])
		} else {
			s.held = true
		}
	}
}

// Arm implements ring.Source with the ring's event suppression: the packed
// ring's descriptor event (or the split ring's used_event) aimed at the
// threshold, else used-buffer notifications on. solicitedOnly has no
// virtio equivalent: every completion is solicited.
func (s *cqSource) Arm(solicitedOnly bool, threshold int) error {
	s.q.mu.Lock()
	defer s.q.mu.Unlock()
	if err := s.q.usable(); err != nil {
		return err
	}
	s.q.vq.arm(threshold)
	return nil
}

// StrError implements ring.Source for ProvBadIndex and ProvMultiBuffer.
func (s *cqSource) StrError(provErrno int, errData []byte) (string, bool) {
	var what string
	switch provErrno {
	case ProvBadIndex:
		what = "used index beyond the posted buffers"
	case ProvMultiBuffer:
		what = "frame spans several receive buffers"
	default:
		return "", false
	}
	if len(errData) > 0 {
		return fmt.Sprintf("virtio: %s (%s)", what, errData), true
	}
	return "virtio: " + what, true
}

// Close implements ring.Source: the queue reads its own completions again,
// with its own interrupt, if the device is still open.
func (s *cqSource) Close() error {
	if s.closed {
		return nil
	}
	s.closed = true
	return s.dev.unbind(s)
}

// BindCQ implements nic.Device. Entry.Queue is the virtqueue index: 2i
// for the receive queue of pair i, 2i+1 for its transmit queue.
func (d *Device) BindCQ(c *cq.CQ, i int, dir nic.Direction) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case d.closed:
		return nic.ErrClosed
	case c == nil:
		return fmt.Errorf("%w: %s: nil CQ", nic.ErrInvalid, d.name)
	case i < 0 || i >= len(d.rx):
		return fmt.Errorf("%w: %s: queue pair %d of %d", nic.ErrInvalid, d.name, i, len(d.rx))
	case dir == 0 || dir&^(nic.Recv|nic.Send) != 0:
		return fmt.Errorf("%w: %s: direction %#x", nic.ErrInvalid, d.name, uint8(dir))
	}
	var srcs []*cqSource
	if dir&nic.Recv != 0 {
		srcs = append(srcs, &cqSource{dev: d, pq: d.rx[i], q: &d.rx[i].queue, flags: cq.FlagRecv | cq.FlagMsg})
	}
	if dir&nic.Send != 0 {
		srcs = append(srcs, &cqSource{dev: d, pq: d.tx[i], q: &d.tx[i].queue, flags: cq.FlagSend | cq.FlagMsg})
	}
	for _, s := range srcs {
		s.qnum = uint32(s.q.vq.qidx)
		s.q.mu.Lock()
		bound := s.q.src != nil
		s.q.mu.Unlock()
		if bound {
			return fmt.Errorf("%w: %s: queue %s already feeds a CQ", nic.ErrInvalid, d.name, s.q.vq.name)
		}
	}
	for _, s := range srcs {
		if err := ring.Bind(c); err != nil {
			return err
		}
		if err := ring.AddSource(c, s); err != nil {
			ring.Unbind(c)
			return err
		}
		d.bound = append(d.bound, c)
		s.q.mu.Lock()
		s.q.src = s
		s.q.vq.disarm()
		s.q.mu.Unlock()
		if efd := ring.Interrupt(c); efd != nil && s.q.vector >= 0 {
			if err := d.wire(s.q.vector, efd.Fd()); err != nil {
				return err
			}
		}
	}
	return nil
}

// unbind gives a queue its own completions and interrupt back.
func (d *Device) unbind(s *cqSource) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	s.q.mu.Lock()
	if s.q.src == s {
		s.q.src = nil
	}
	s.q.mu.Unlock()
	if d.closed || s.q.vector < 0 || s.q.efd == nil {
		return nil
	}
	return d.wire(s.q.vector, s.q.efd.Fd())
}

// wire points MSI-X vector v at fd, rewiring all vectors in one SET_IRQS
// call with the same count (MSI-X cannot be resized while enabled).
// Called with d.mu held.
func (d *Device) wire(v, fd int) error {
	if v < 0 || v >= len(d.vectorFDs) {
		return fmt.Errorf("%w: %s: MSI-X vector %d of %d", nic.ErrInvalid, d.name, v, len(d.vectorFDs))
	}
	d.vectorFDs[v] = fd
	return d.vdev.EnableMSIX(d.vectorFDs)
}
