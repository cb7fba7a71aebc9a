package igb

// This file is igb's whole use of cq's driver kit (Layout, Ring,
// RingSource, Table): the lead ports it when the kit moves.

import (
	"fmt"
	"math/bits"

	"github.com/vfnic/vfnic/cq"
	cqring "github.com/vfnic/vfnic/cq/ring"
)

// Status values of the receive layout's Status field (the DD and EOP bits
// of the write-back status): DD is always set on an entry the reader
// takes, so only these two can occur.
const (
	rxStatusDone    = rxdStatusDD | rxdStatusEOP
	rxStatusNoEOP   = rxdStatusDD // frame continues in the next buffer
	provMultiBuffer = rxStatusNoEOP
)

// rxLayout is the advanced receive descriptor in write-back form
// (datasheet 7.1.5.2; Linux union e1000_adv_rx_desc): status and errors
// at byte 8 (DD bit 0, EOP bit 1), length at byte 12. The descriptor
// position is the id. The device writes back in ring order, so an entry
// without DD followed by one with DD is a hole, not a late write.
func rxLayout(n int) cqring.Layout {
	return cqring.Layout{
		Name: "igb-rx", EntrySize: descSize, Entries: n,
		Convention: cqring.DescriptorDone, OwnerOff: 8, OwnerMask: rxdStatusDD,
		Fields: cqring.Fields{
			Status: cqring.Field{Off: 8, Bits: 2},
			Len:    cqring.Field{Off: 12, Bits: 16},
			// The whole write-back, for the offload status (offload.go),
			// read in the same single pass as DD, status and length.
			Meta: [2]cqring.Field{{Off: 0, Bits: 64}, {Off: 8, Bits: 64}},
		},
		IDIsIndex: true, DetectHoles: true,
	}
}

// txLayout is the advanced transmit descriptor in write-back form
// (datasheet 7.2.2.3): DD is bit 0 of the status word at byte 12; the
// rest is reserved, so the length comes from what was posted.
func txLayout(n int) cqring.Layout {
	return cqring.Layout{
		Name: "igb-tx", EntrySize: descSize, Entries: n,
		Convention: cqring.DescriptorDone, OwnerOff: 12, OwnerMask: txdStatusDD,
		IDIsIndex: true, DetectHoles: true,
	}
}

var rxCodes = cqring.Codes{Statuses: []cqring.Status{
	{Value: rxStatusDone, Name: "DD|EOP"},
	{Value: rxStatusNoEOP, Err: cq.ETRUNC, Name: "DD without EOP (frame spans buffers)"},
}}

// ring is a queue's descriptor ring seen by cq: the validating reader over
// the write-back descriptors and the table of posted descriptors. The
// table's ids are the descriptor positions (id bits = slot bits), which
// holds because descriptors are posted and completed in ring order.
type ring struct {
	src *cqring.RingSource
	tab *cqring.Table
}

// newRing makes the reader over mem (n descriptors, n a power of two).
func newRing(mem []byte, n int, tx bool) (*ring, error) {
	if n < 2 || n&(n-1) != 0 {
		return nil, fmt.Errorf("igb: ring of %d descriptors is not a power of two", n)
	}
	l, codes := rxLayout(n), rxCodes
	if tx {
		l, codes = txLayout(n), cqring.Codes{}
	}
	src, err := cqring.NewRingSource(cqring.RingConfig{Mem: mem, Layout: l, Codes: codes})
	if err != nil {
		return nil, err
	}
	// The queue converts entries itself (for Poll and for a bound CQ),
	// so the reader always fills every field.
	if err := src.Attach(cq.FormatData); err != nil {
		return nil, err
	}
	tab, err := cqring.NewTable(n, bits.Len(uint(n-1)))
	if err != nil {
		return nil, err
	}
	if err := src.BindTable(0, tab); err != nil {
		return nil, err
	}
	src.Ring().Reset() // no DD anywhere before the device starts
	return &ring{src: src, tab: tab}, nil
}

// post records a descriptor and returns its position.
func (r *ring) post(ctx any, buf uintptr, length int, recv bool) (uint32, error) {
	fl := cq.FlagSend | cq.FlagMsg
	if recv {
		fl = cq.FlagRecv | cq.FlagMsg
	}
	return r.tab.Post(cqring.Op{Context: ctx, Buf: buf, Len: length, Flags: fl})
}

// pending counts ready entries (an error counts) up to max.
func (r *ring) pending(max int) int { return r.src.Pending(max) }

// strError names the device status values of error entries.
func (r *ring) strError(prov int, data []byte) (string, bool) { return r.src.StrError(prov, data) }

// cqSource lets a user's cq.CQ read a queue (BindCQ). It goes through the
// queue's own reader, so the queue keeps its bookkeeping (buffers lent,
// lengths, error recycling) whichever way it is read; it applies the CQ's
// format and the queue number.
type cqSource struct {
	q        *queue
	dev      *Device
	attached bool
	mFlags   cq.Flags
	mLen     int
	mBuf     uintptr
	closed   bool

	held   bool // one: a success that ReadErr read and Poll owes
	one    cqring.Completion
	staged bool // errEnt waits for ReadErr
	errEnt cq.ErrEntry
}

var _ cqring.Source = (*cqSource)(nil)

// Attach implements cqring.Source.
func (s *cqSource) Attach(f cq.Format) error {
	if s.attached {
		return fmt.Errorf("%w: igb queue %s already feeds a CQ", cq.ErrInvalid, s.q.name)
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

// store writes a good completion into the caller's entry, in the CQ's
// format.
func (s *cqSource) store(e *cq.Entry, c *cqring.Completion) {
	*e = cq.Entry{Context: c.Context, Flags: c.Flags & s.mFlags, Len: c.Len & s.mLen, Buf: c.Buf & s.mBuf, Queue: c.Queue}
}

// Poll implements cqring.Source: the queue's next, entry by entry, written
// straight into the caller's entries; a refused entry is staged for
// ReadErr with the ring reader's code.
func (s *cqSource) Poll(ents []cq.Entry, addrs []cq.Addr) (int, cqring.State) {
	if len(ents) == 0 && !s.held {
		s.peek() // a probe: stage an error entry at the head
	}
	if s.staged {
		return 0, cqring.StateError
	}
	n := 0
	if s.held && len(ents) > 0 {
		s.store(&ents[0], &s.one)
		s.held = false
		n++
	}
	q := s.q
	q.mu.Lock()
	var c cqring.Completion
	var bytes uint64
	errs := 0
	for n < len(ents) && q.next(&c) {
		if c.Err != 0 {
			s.stage(&c)
			errs++
			break
		}
		s.store(&ents[n], &c)
		bytes += uint64(c.Len)
		n++
	}
	q.finish(n+errs, errs, bytes)
	q.mu.Unlock()
	for i := range min(n, len(addrs)) {
		addrs[i] = cq.AddrNotAvail // raw Ethernet: no fabric addresses
	}
	if s.staged {
		return n, cqring.StateError
	}
	return n, cqring.StateOK
}

// stage makes a refused completion the pending error entry. Cold path.
func (s *cqSource) stage(c *cqring.Completion) {
	s.errEnt = cq.ErrEntry{Entry: c.Entry, OLen: c.OLen, Err: c.Err, ProvErrno: c.Prov}
	s.staged = true
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
	if !q.next(&s.one) {
		q.finish(0, 0, 0)
		return
	}
	if s.one.Err != 0 {
		s.stage(&s.one)
		q.finish(1, 1, 0)
		return
	}
	s.held = true
	q.finish(1, 0, uint64(s.one.Len))
}

// Pending implements cqring.Source.
func (s *cqSource) Pending(max int) int {
	n := 0
	if s.staged || s.held {
		n++
	}
	q := s.q
	q.mu.Lock()
	if !q.closed && !q.broken {
		n += q.r.pending(max - n)
	}
	q.mu.Unlock()
	return min(n, max)
}

// ReadErr implements cqring.Source.
func (s *cqSource) ReadErr(e *cq.ErrEntry) ([]byte, bool) {
	if !s.held {
		s.peek()
	}
	if !s.staged {
		return nil, false
	}
	data := e.ErrData
	*e = s.errEnt
	e.ErrData = data
	s.staged = false
	return nil, true
}

// Arm implements cqring.Source: unmask the queue's vector. The device has no
// completion counter, so the threshold is served by sleeping through
// moderated interrupts (EITR) and polling again; every completion is
// solicited.
func (s *cqSource) Arm(solicitedOnly bool, threshold int) error {
	q := s.q
	q.mu.Lock()
	defer q.mu.Unlock()
	if err := q.usable(); err != nil {
		return err
	}
	q.arm()
	return nil
}

// StrError implements cqring.Source.
func (s *cqSource) StrError(prov int, data []byte) (string, bool) {
	return s.q.r.strError(prov, data)
}

// Close implements cqring.Source: the queue reads its own completions again.
func (s *cqSource) Close() error {
	if s.closed {
		return nil
	}
	s.closed = true
	return s.dev.unbind(s)
}
