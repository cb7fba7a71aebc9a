package igb

// This file is igb's whole use of cq's driver kit (Layout, Ring,
// RingSource, Table): the lead ports it when the kit moves.

import (
	"fmt"
	"math/bits"

	"github.com/vfnic/vfnic/cq"
	cqring "github.com/vfnic/vfnic/cq/ring"
	"github.com/vfnic/vfnic/eventfd"
	"github.com/vfnic/vfnic/nic/internal/canceled"
)

// Status values of the receive layout's Status field (the DD and EOP bits
// of the write-back status): DD is always set on an entry the reader
// takes, so only these two can occur.
const (
	rxStatusDone                 = rxdStatusDD | rxdStatusEOP
	rxStatusNoEOP                = rxdStatusDD // frame continues in the next buffer
	provMultiBuffer cq.ProvErrno = rxStatusNoEOP
	// provRxError is the provider error number of a frame whose
	// write-back has RXE (bit 31, the top bit of its error byte, here
	// over DD|EOP). The Status field does not cover the bit, so no entry
	// reads as this value: the queue refuses such a frame itself
	// (queue.next), and rxCodes names the value for StrError.
	provRxError cq.ProvErrno = rxStatusDone | rxdErrRXE>>24
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
	{Value: uint32(provRxError), Err: cq.EIO, Name: "RXE (frame received in error)"},
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
func (r *ring) strError(prov cq.ProvErrno, data []byte) (string, bool) {
	return r.src.StrError(prov, data)
}

// cqSource is an igb queue as the cq.CQ it feeds reads it (BindCQ): the
// QueueReader behind a cq/ring.QueueSource, which keeps the CQ's format
// and error order. Its batch read is the queue's next, the same take per
// entry as Poll's, so the queue keeps its bookkeeping (buffers lent,
// error recycling) whichever way it is read. Once the queue is closed it
// reads the operations close kept, each as a flushed error completion
// (cq.ECANCELED), then nothing.
type cqSource struct {
	q   *queue
	dev *Device
	irq *eventfd.FD // the CQ's interrupt eventfd (nil: none)
}

var _ cqring.QueueReader = (*cqSource)(nil)

// source wraps s for a CQ.
func (s *cqSource) source() *cqring.QueueSource {
	return cqring.NewQueueSource(s, s.q.Name, s.q.qnum)
}

// ReadBatch implements cqring.QueueReader.
func (s *cqSource) ReadBatch(qs *cqring.QueueSource, ents []cq.Entry, bad *cqring.Completion) (int, bool) {
	q := s.q
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if q.Closed {
		// A source unbound before the close has none (they went to
		// the one bound then, or nowhere).
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

// flags are those the queue's operations are posted with (ring.post), for
// its flushed completions.
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
	if q.broken || !q.settle() {
		return 0
	}
	return q.r.pending(max)
}

// Arm implements cqring.QueueReader: unmask the queue's vector. The device
// has no completion counter, so the threshold is served by sleeping
// through moderated interrupts (EITR) and polling again; every completion
// is solicited.
func (s *cqSource) Arm(solicitedOnly bool, threshold int) error {
	q := s.q
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if err := q.usable(); err != nil {
		return err
	}
	if !q.eims.Valid() {
		return q.NoInterrupt()
	}
	q.arm()
	return nil
}

// StrError implements cqring.QueueReader: the device's status values, and
// 0 for a flushed operation.
func (s *cqSource) StrError(prov cq.ProvErrno, data []byte) (string, bool) {
	if prov == 0 {
		return "igb " + s.q.Name + ": " + canceled.Flushed, true
	}
	return s.q.r.strError(prov, data)
}

// Unbind implements cqring.QueueReader: the queue reads its own
// completions again.
func (s *cqSource) Unbind() error { return s.dev.unbind(s) }
