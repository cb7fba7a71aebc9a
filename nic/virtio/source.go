package virtio

import (
	"fmt"

	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/cq/ring"
	"github.com/vfnic/vfnic/nic"
)

// cqSource feeds a cq.CQ from one virtio queue: the queue's used ring is
// the completion ring, read entry by entry by the queue's next (cq/ring's
// ring reader plus the queue's own checks, the same code as Poll), each
// entry written straight into the caller's cq.Entry. It implements
// ring.Source; the CQ serialises the calls. A refused entry reaches the
// CQ with the ring reader's code (cq.Prov*), never as an error string.
type cqSource struct {
	dev  *Device
	rx   *RxQueue // one of rx and tx is set
	tx   *TxQueue
	q    *queue
	qnum uint32 // virtqueue index, reported as Entry.Queue

	attached bool
	mFlags   cq.Flags // all ones for the fields the CQ's format has
	mLen     int
	mBuf     uintptr

	held    bool // one: a success that ReadErr read and Poll owes
	one     ring.Completion
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

// next takes the queue's next completion (locked by the caller).
func (s *cqSource) next(c *ring.Completion) bool {
	if s.rx != nil {
		return s.rx.next(c)
	}
	return s.tx.vq.next(c)
}

// store writes a good completion into the caller's entry, in the CQ's
// format.
func (s *cqSource) store(e *cq.Entry, c *ring.Completion) {
	*e = cq.Entry{Context: c.Context, Flags: c.Flags & s.mFlags, Len: c.Len & s.mLen, Buf: c.Buf & s.mBuf, Queue: s.qnum}
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
		s.store(&ents[0], &s.one)
		s.held = false
		n++
	}
	q := s.q
	q.mu.Lock()
	var bytes uint64
	errs := 0
	if !q.closed {
		var c ring.Completion
		for n < len(ents) && s.next(&c) {
			if c.Err != 0 {
				s.stage(&c)
				errs++
				break
			}
			s.store(&ents[n], &c)
			bytes += uint64(c.Len)
			n++
		}
		q.vq.publishUsed()
		q.finishPoll(n+errs, bytes, errs)
	}
	q.mu.Unlock()
	for i := range min(n, len(addrs)) {
		addrs[i] = cq.AddrNotAvail // raw Ethernet: no fabric addresses
	}
	if s.staged {
		return n, ring.StateError
	}
	return n, ring.StateOK
}

// stage makes a refused completion the pending cq.ErrEntry, with the ring
// reader's code. Cold path.
func (s *cqSource) stage(c *ring.Completion) {
	s.errEnt = cq.ErrEntry{Entry: cq.Entry{Context: c.Context, Flags: c.Flags, Queue: s.qnum},
		OLen: c.OLen, Err: c.Err, ProvErrno: c.Prov}
	if c.Prov == cq.ProvMultiBuffer && s.rx != nil && s.rx.mbErr != nil {
		s.errEnt.Len = s.rx.mbErr.Bytes
	}
	s.errData = s.errData[:0]
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
	q := s.q
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed || !s.next(&s.one) {
		return
	}
	q.vq.publishUsed()
	if s.one.Err != 0 {
		s.stage(&s.one)
		q.finishPoll(1, 0, 1)
		return
	}
	s.held = true
	q.finishPoll(1, uint64(s.one.Len), 0)
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

// StrError implements ring.Source: virtio reports only cq's own codes,
// which the CQ describes itself.
func (s *cqSource) StrError(provErrno int, errData []byte) (string, bool) {
	return "", false
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
		srcs = append(srcs, &cqSource{dev: d, rx: d.rx[i], q: &d.rx[i].queue})
	}
	if dir&nic.Send != 0 {
		srcs = append(srcs, &cqSource{dev: d, tx: d.tx[i], q: &d.tx[i].queue})
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
