package virtio

// The read path, from the used ring the device writes to the caller's
// records: cq/ring's ring reader takes each used entry once (vq.next), the
// queue adds virtio-net's checks of the frame (RxQueue.next), and Poll
// writes nic.Completion while a CQ the queue feeds writes cq.Entry
// (cqSource.Poll), both from that one take.

import (
	"fmt"
	"math/bits"

	"github.com/vfnic/vfnic/cq"
	cqring "github.com/vfnic/vfnic/cq/ring"
	"github.com/vfnic/vfnic/doorbell"
	"github.com/vfnic/vfnic/eventfd"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/nic/internal/canceled"
)

// Kinds of used ring, by what the reader checks.
const (
	usedPlain = iota // the control queue: id and length
	usedRx           // receive: the length covers the virtio-net header and a frame (checked by RxQueue.next)
	usedTx           // transmit: the device's length is reserved, not read
)

// PackedLayout describes a packed virtqueue of n descriptors as the device
// writes used descriptors into it: 16-byte descriptors whose flags word
// (at byte 12, with the buffer id in its low half) has AVAIL and USED both
// equal to the driver's used wrap counter, which starts at 1; USED equal
// to it while AVAIL is not is a state no device writes. Len is the bytes
// written into the buffer.
func PackedLayout(n int) cqring.Layout {
	return cqring.Layout{
		Name: "virtio-packed", EntrySize: descSize, Entries: n,
		Convention: cqring.PackedWrap, OwnerOff: 12, OwnerMask: (descAvail | descUsed) << 16, InitPhase: 1,
		WrongPhase: descAvail << 16,
		Fields: cqring.Fields{
			ID:  cqring.Field{Off: 12, Bits: 16},
			Len: cqring.Field{Off: 8, Bits: 32},
		},
	}
}

// SplitLayout describes the used ring of a split virtqueue of n
// descriptors: elements {id, len} of 32 bits each after a 4-byte header
// whose upper half, idx, counts the elements written (RingRegs.Producer
// is that header word).
func SplitLayout(n int) cqring.Layout {
	return cqring.Layout{
		Name: "virtio-split", EntrySize: 8, Entries: n,
		Convention: cqring.UsedIndex, IndexShift: 16, IndexBits: 16,
		Fields: cqring.Fields{
			ID:  cqring.Field{Off: 0, Bits: 32},
			Len: cqring.Field{Off: 4, Bits: 32},
		},
	}
}

// setReader makes the ring reader for the queue's kind of used ring.
// Called before the ring is used.
func (q *vq) setReader(kind int) error {
	n := int(q.size)
	var l cqring.Layout
	var cfg cqring.RingConfig
	if q.packed {
		l = PackedLayout(n)
		cfg.Mem = q.mem.desc
	} else {
		l = SplitLayout(n)
		cfg.Mem = q.mem.device[4 : 4+8*n]
		w := doorbell.NewWindow(q.mem.device[:4])
		var err error
		if cfg.Regs.Producer, err = w.Reg32(0); err != nil {
			return err
		}
	}
	l.Name += "-" + q.name
	if kind == usedTx {
		l.Fields.Len = cqring.Field{} // reserved: the posted length is reported
	}
	cfg.Layout = l
	rd, err := cqring.NewRingSource(cfg)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", nic.ErrInvalid, q.name, err)
	}
	// ids are table slots (the id bits are the slot bits, no generation),
	// below size: ndesc and the split ring's descriptor table are indexed
	// by them.
	tab, err := cqring.NewTable(n, bits.Len(uint(n-1)))
	if err != nil {
		return fmt.Errorf("%w: %s: %v", nic.ErrInvalid, q.name, err)
	}
	if err := rd.BindTable(0, tab); err != nil {
		return err
	}
	if !q.packed {
		// The used index may not pass the available index: publish
		// moves the limit, from the buffers made available so far.
		rd.Ring().SetProducerLimit(uint32(q.pubIdx))
	}
	q.rd, q.tab = rd, tab
	return nil
}

// next takes the next used buffer into c through the ring reader: false
// when the device has used no further buffer. A refused entry comes back
// with c.Err set (the buffer it named, if any, is complete: c.Done). A
// split ring whose used index runs beyond the buffers made available
// breaks the queue. The caller ends a batch with publish.
func (q *vq) next(c *cqring.Completion) bool {
	if q.broken || !q.rd.Next(c) {
		return false
	}
	if c.Prov == cq.ProvBadIndex {
		q.broken = true
	}
	if c.Done {
		q.ndescs -= int(q.ndesc[c.ID])
		q.nbufs--
	}
	return true
}

// publishUsed ends a batch of next calls: the freed ids become postable.
func (q *vq) publishUsed() { q.rd.Publish() }

// pending counts the used entries ready to read, up to max, without
// consuming them. An entry that the reader would refuse counts.
func (q *vq) pending(max int) int {
	if q.broken || max <= 0 {
		return 0
	}
	return q.rd.Pending(max)
}

// poll is Poll, called locked.
func (q *RxQueue) poll(out []nic.Completion) int {
	n, errs := 0, 0
	var bytes uint64
	var c cqring.Completion
	for n < len(out) && q.next(&c) {
		o := &out[n]
		n++
		if c.Err != 0 {
			*o = nic.Completion{Context: c.Context, Queue: q.Pair, Err: q.errOf(&c)}
			errs++
			break
		}
		frame := q.bufs.Bytes(c.Buf, c.Len)
		*o = nic.Completion{Context: c.Context, Buf: c.Buf, Data: frame, Len: c.Len, Queue: q.Pair}
		bytes += uint64(c.Len)
	}
	q.vq.publishUsed()
	q.finishPoll(n, bytes, errs)
	return n
}

// errOf is the queue API's error for a refused completion: the ring
// reader's code, translated without allocating (a multi-buffer frame's
// parts carry their place in the frame).
func (q *RxQueue) errOf(c *cqring.Completion) error {
	if c.Prov == cq.ProvMultiBuffer && q.mbErr != nil {
		return q.mbErr
	}
	return completionError(c)
}

// next takes the next receive completion into c, for Poll and for the CQ
// the queue feeds alike: the ring reader's single read and checks of the
// used entry (id, length within the posted buffer), then virtio-net's own
// on that copy: the length must cover the virtio-net header and an
// Ethernet header (cq.ProvBadLen), and num_buffers, read once from the
// header the device wrote, must be 1 (a frame spanning buffers completes
// with cq.ProvMultiBuffer, cq.ETRUNC, per buffer). A good buffer is lent to
// the caller, with c.Buf and c.Len the frame's (past the header); the
// buffer of a refused one is recycled (c.Buf is then 0). Called locked.
func (q *RxQueue) next(c *cqring.Completion) bool {
	if !q.vq.next(c) {
		return false
	}
	if c.Err != 0 {
		if c.Done && c.Buf != 0 {
			q.bufs.Recycle(q.bufs.Of(c.Buf))
			if q.skip > 0 {
				q.skip-- // a refused part of a frame is still one of its parts
			}
		}
		c.Buf = 0
		return true
	}
	b := q.bufs.Of(c.Buf)
	if q.skip > 0 { // only the first buffer of a frame holds the header
		q.skip--
		q.multiBuffer(c, b, &nic.MultiBufferError{Queue: q.vq.name, Buffer: q.span - 1 - q.skip, Buffers: q.span, Bytes: c.Len})
		return true
	}
	if c.Len < netHdrLen+nic.MinFrame {
		q.bufs.Recycle(b)
		c.Err, c.Prov, c.Buf = cq.EIO, cq.ProvBadLen, 0
		return true
	}
	if q.mrg {
		hdr := q.bufs.Buf(b)
		if nb := int(hdr[netHdrNumBuffers]) | int(hdr[netHdrNumBuffers+1])<<8; nb != 1 {
			e := &nic.MultiBufferError{Queue: q.vq.name, Buffers: nb, Bytes: c.Len - netHdrLen}
			if nb > 1 {
				q.skip = min(nb-1, q.vq.nbufs)
				q.span = q.skip + 1
				e.Buffers = q.span
			}
			q.multiBuffer(c, b, e)
			return true
		}
	}
	q.bufs.Lend(b)
	c.Buf += netHdrLen
	c.Len -= netHdrLen
	return true
}

// multiBuffer turns c, whose buffer b holds part of a frame that spans
// buffers, into an error completion and recycles the buffer. Cold path.
func (q *RxQueue) multiBuffer(c *cqring.Completion, b uint32, e *nic.MultiBufferError) {
	q.bufs.Recycle(b)
	q.mbErr = e
	c.Err, c.Prov, c.Buf = cq.ETRUNC, cq.ProvMultiBuffer, 0
}

// poll is Poll, called locked.
func (q *TxQueue) poll(out []nic.Completion) int {
	n, errs := 0, 0
	var bytes uint64
	var c cqring.Completion
	for n < len(out) && q.vq.next(&c) {
		o := &out[n]
		n++
		if c.Err != 0 {
			*o = nic.Completion{Context: c.Context, Queue: q.Pair, Err: completionError(&c)}
			errs++
			break
		}
		*o = nic.Completion{Context: c.Context, Len: c.Len, Queue: q.Pair}
		bytes += uint64(c.Len)
	}
	q.vq.publishUsed()
	q.finishPoll(n, bytes, errs)
	return n
}

// cqSource is a virtio queue as the cq.CQ it feeds reads it (BindCQ): the
// QueueReader behind a cq/ring.QueueSource, which keeps the CQ's format
// and error order. Its batch read is next, the same take per entry as
// Poll's, each good completion written straight into the caller's
// cq.Entry; a refused one reaches the CQ with the ring reader's code.
// Once the queue is closed it reads the operations close kept, each as a
// flushed error completion (cq.ECANCELED), then nothing.
type cqSource struct {
	dev  *Device
	rx   *RxQueue // one of rx and tx is set
	tx   *TxQueue
	q    *queue
	qnum uint32      // virtqueue index, reported as Entry.Queue
	irq  *eventfd.FD // the CQ's interrupt eventfd (nil: none)
}

var _ cqring.QueueReader = (*cqSource)(nil)

// source wraps s for a CQ.
func (s *cqSource) source() *cqring.QueueSource {
	return cqring.NewQueueSource(s, s.q.vq.name, s.qnum)
}

// next takes the queue's next completion (locked by the caller).
func (s *cqSource) next(c *cqring.Completion) bool {
	if s.rx != nil {
		return s.rx.next(c)
	}
	return s.tx.vq.next(c)
}

// ReadBatch implements cqring.QueueReader.
func (s *cqSource) ReadBatch(qs *cqring.QueueSource, ents []cq.Entry, bad *cqring.Completion) (int, bool) {
	q := s.q
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if q.Closed {
		return 0, s.flushed(bad)
	}
	n, errs := 0, 0
	var bytes uint64
	var c cqring.Completion
	for n < len(ents) && s.next(&c) {
		if c.Err != 0 {
			*bad = c
			if c.Prov == cq.ProvMultiBuffer && s.rx != nil && s.rx.mbErr != nil {
				bad.Len = s.rx.mbErr.Bytes
			}
			errs = 1
			break
		}
		qs.Store(&ents[n], &c)
		bytes += uint64(c.Len)
		n++
	}
	q.vq.publishUsed()
	q.finishPoll(n+errs, bytes, errs)
	return n, errs > 0
}

// flushed takes the next operation close kept into bad, as a flushed
// completion; false when none is left. A source unbound before then has
// none: the queue's canceled operations are for its own Poll. Called
// locked, closed.
func (s *cqSource) flushed(bad *cqring.Completion) bool {
	return s.q.Src == s && s.q.canceled.Next(bad, s.flags())
}

// flags are those the queue's operations are posted with (RxQueue.post,
// TxQueue.Send), for its flushed completions.
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
	return s.q.vq.pending(max)
}

// Arm implements cqring.QueueReader with the ring's event suppression: the packed
// ring's descriptor event (or the split ring's used_event) aimed at the
// threshold, else used-buffer notifications on. solicitedOnly has no
// virtio equivalent: every completion is solicited.
func (s *cqSource) Arm(solicitedOnly bool, threshold int) error {
	s.q.Mu.Lock()
	defer s.q.Mu.Unlock()
	if err := s.q.usable(); err != nil {
		return err
	}
	if s.q.vq.arm(threshold) && s.irq != nil {
		// The completion after those present came while arming: the
		// device may have passed the event before it saw it, and an arm
		// that never fires would lose verbs' request-notify event. A
		// spurious wake-up is allowed; a lost one is not.
		return s.irq.Add(1)
	}
	return nil
}

// StrError implements cqring.QueueReader: virtio reports only cq's own
// codes, which the CQ describes itself, and 0 for a flushed operation.
func (s *cqSource) StrError(provErrno cq.ProvErrno, errData []byte) (string, bool) {
	if provErrno == 0 {
		return "virtio " + s.q.vq.name + ": " + canceled.Flushed, true
	}
	return "", false
}

// Unbind implements cqring.QueueReader: the queue reads its own
// completions again, with its own interrupt, if the device is still open.
func (s *cqSource) Unbind() error { return s.dev.unbind(s) }

// completionError is the queue API's error for a completion the ring
// reader refused (its cq.Prov* code) or the device failed (a status of
// its own), prepared: nothing is allocated.
func completionError(c *cqring.Completion) error {
	if err := c.Prov.Refusal(); err != nil {
		return err
	}
	if c.Err == cq.ETRUNC {
		return errMultiBuffer
	}
	return nic.ErrDeviceStatus
}

// errMultiBuffer is a truncated frame's error: the code as an error.
var errMultiBuffer = cq.ProvMultiBuffer.Refusal()
