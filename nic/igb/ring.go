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
	// The queue's lock serialises posts and reads: no lock or release
	// store of the table's own.
	tab, err := cqring.NewSingleThreadedTable(n, bits.Len(uint(n-1)))
	if err != nil {
		return nil, err
	}
	if err := src.BindTable(0, tab); err != nil {
		return nil, err
	}
	src.Ring().Reset() // no DD anywhere before the device starts
	return &ring{src: src, tab: tab}, nil
}

// post records a descriptor, with the driver word word (qcore.Queue.Word),
// and returns its position.
func (r *ring) post(ctx any, buf uintptr, length int, recv bool, word uint64) (uint32, error) {
	fl := cq.FlagSend | cq.FlagMsg
	if recv {
		fl = cq.FlagRecv | cq.FlagMsg
	}
	return r.tab.Post(cqring.Op{Context: ctx, Buf: buf, Len: length, Flags: fl, Word: word})
}

// pending counts ready entries (an error counts) up to max.
func (r *ring) pending(max int) int { return r.src.Pending(max) }

// strError names the device status values of error entries.
func (r *ring) strError(prov cq.ProvErrno, data []byte) (string, bool) {
	return r.src.StrError(prov, data)
}

// ops is a queue's qcore.Ring, and a receive queue's qcore.RxPoster: what
// the core asks of igb's ring. Called with the queue's lock held.
type ops struct{ q *queue }

// Read implements qcore.Ring: the queue's read.
func (o ops) Read(cs []cqring.Completion) int { return o.q.read(cs) }

// Publish implements qcore.Ring.
func (o ops) Publish() { o.q.r.src.Publish() }

// Pending implements qcore.Ring.
func (o ops) Pending(max int) int {
	if !o.q.settle() {
		return 0
	}
	return o.q.r.pending(max)
}

// Outstanding implements qcore.Ring: context descriptors are the queue's
// own.
func (o ops) Outstanding() int { return o.q.out - o.q.ctxOut }

// Broken implements qcore.Ring.
func (o ops) Broken() bool { return o.q.broken }

// Notify implements qcore.Ring: the tail register, once per batch (the
// doorbell skips an unchanged value and orders the descriptor stores
// before it).
func (o ops) Notify() (rang, suppressed bool) {
	before := o.q.db.Rings()
	o.q.db.Ring(o.q.tail)
	return o.q.db.Rings() != before, false
}

// Arm implements qcore.Ring: unmask the queue's vector. The device raises
// one interrupt per written descriptor (subject to EITR moderation) and
// has no completion counter, so the threshold is served by sleeping
// through moderated interrupts and polling again.
func (o ops) Arm(int) (late, ok bool) {
	if !o.q.eims.Valid() {
		return false, false
	}
	o.q.arm()
	return false, true
}

// Disarm implements qcore.Ring.
func (o ops) Disarm() { o.q.disarm() }

// Err implements qcore.Ring.
func (o ops) Err(c *cqring.Completion) error { return errOf(c.Prov) }

// StrError implements qcore.Ring: the device's status values.
func (o ops) StrError(prov cq.ProvErrno, data []byte) (string, bool) {
	return o.q.r.strError(prov, data)
}

// Table implements qcore.Ring.
func (o ops) Table() *cqring.Table { return o.q.r.tab }

// Room implements qcore.RxPoster: a receive buffer is one descriptor.
func (o ops) Room(held int) bool { return o.q.out+held < int(o.q.n)-1 }

// PostBuf implements qcore.RxPoster: pool buffer b at the tail.
func (o ops) PostBuf(b uint32, ctx any) error {
	q := o.q
	if err := q.postTail(ctx, q.bufs.Start(b), int(q.bufLen), 0); err != nil {
		return err
	}
	q.writeDesc(q.tail, q.bufs.Addr(b), 0)
	q.advance()
	return nil
}
