package virtio

// The read path, from the used ring the device writes to the caller's
// records: cq/ring's ring reader takes each used entry once (vq.next),
// the queue's pass adds virtio-net's checks of the frame (rxRing.Read),
// and the core's Poll writes nic.Completion while a CQ the queue feeds
// writes cq.Entry (qcore.Source.ReadBatch), both from that one pass.

import (
	"fmt"
	"math/bits"

	"github.com/vfnic/vfnic/cq"
	cqring "github.com/vfnic/vfnic/cq/ring"
	"github.com/vfnic/vfnic/doorbell"
	"github.com/vfnic/vfnic/nic"
	qcore "github.com/vfnic/vfnic/nic/internal/queue"
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
	// below size: the split ring's descriptor table is indexed by them.
	// The queue's lock serialises posts and reads (the control queue has
	// one caller at a time): no lock or release store of the table's own.
	tab, err := cqring.NewSingleThreadedTable(n, bits.Len(uint(n-1)))
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
	q.ndescs -= q.took(c)
	return true
}

// read takes up to len(cs) used buffers into cs with one batch read of
// the ring reader (the same checks as next's, entry by entry), then one
// pass of the virtqueue's bookkeeping over them; it returns how many.
func (q *vq) read(cs []cqring.Completion) int {
	if q.broken {
		return 0
	}
	n := q.rd.NextBatch(cs)
	ndescs := 0 // summed in a local, stored once
	for i := range cs[:n] {
		ndescs += q.took(&cs[i])
	}
	q.ndescs -= ndescs
	return n
}

// took is the virtqueue's count of one entry the ring reader took (next,
// read, a receive queue's Read): a used index beyond the buffers made
// available breaks the queue, and a completed buffer leaves the
// outstanding ones. It returns the descriptors the buffer freed, for the
// caller to take from ndescs (once per batch).
func (q *vq) took(c *cqring.Completion) int {
	if c.Err != 0 && c.Prov == cq.ProvBadIndex {
		q.broken = true
	}
	if !c.Done {
		return 0
	}
	q.nbufs--
	return int(uint16(c.Word)) // the descriptors posted (reserve)
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

// Read implements qcore.Ring for a receive queue: the ring reader's
// single read and checks of each used entry (id, length within the
// posted buffer), then virtio-net's own on that copy: the length must
// cover the virtio-net header and an Ethernet header (cq.ProvBadLen), and
// num_buffers, read once from the header the device wrote, must be 1 (a
// frame spanning buffers completes with cq.ProvMultiBuffer, cq.ETRUNC,
// per buffer, its Len the bytes of that buffer's part). With receive
// checksum offload the header's other fields are checked too (a bad one:
// cq.EIO, provBadNetHdr). A good buffer's c.Buf and c.Len are the frame's
// (past the header).
func (r rxRing) Read(cs []cqring.Completion) int {
	q, v := r.q, r.v
	if v.broken {
		return 0
	}
	// The ring reader's batch, then one pass: the virtqueue's counts
	// (vq.read's, here in the same loop) and virtio-net's checks.
	n := v.rd.NextBatch(cs)
	mrg, csum, bufs := q.mrg, q.csum, &q.bufs
	ndescs := 0
	for i := range cs[:n] {
		c := &cs[i]
		// The common entry in this loop; a refused one, a later part of
		// a frame and a short one in frame, out of line.
		if c.Err != 0 || q.skip > 0 || c.Len < netHdrLen+nic.MinFrame {
			ndescs += v.took(c)
			r.odd(c, i)
			continue
		}
		// took's count for a good entry, which is Done: inline here, the
		// per-frame path.
		ndescs += int(uint16(c.Word))
		v.nbufs--
		if mrg {
			// The one read of num_buffers, from the header the device
			// wrote at the posted buffer's start.
			if nb := bufs.HeadUint16(c.Buf, netHdrNumBuffers); nb != 1 {
				r.multi(c, i, int(nb))
				continue
			}
		}
		if csum && !q.takeRxHdr(c) { // checksum offload: the header checked (nethdr.go)
			continue
		}
		c.Buf += netHdrLen
		c.Len -= netHdrLen
	}
	v.ndescs -= ndescs
	return n
}

// odd is Read's pass over c, the i-th of the batch, when it is refused, a later part of a
// frame spanning buffers (only the first holds the header), or too short
// for the virtio-net header and an Ethernet header. Cold path.
func (r rxRing) odd(c *cqring.Completion, i int) {
	q := r.q
	switch {
	case c.Err != 0:
		if c.Done && c.Buf != 0 && q.skip > 0 {
			q.skip-- // a refused part of a frame is still one of its parts
		}
	case q.skip > 0:
		q.skip--
		q.multiBuffer(c, i, &nic.MultiBufferError{Queue: r.v.name, Buffer: q.span - 1 - q.skip, Buffers: q.span, Bytes: c.Len})
	default:
		c.Err, c.Prov = cq.EIO, cq.ProvBadLen
	}
}

// multi is Read's pass over c, the i-th of the batch, whose header's num_buffers (nb, read
// once) is not 1: the first part of a frame spanning nb buffers, or a
// header no device writes (0). Cold path.
func (r rxRing) multi(c *cqring.Completion, i, nb int) {
	q := r.q
	e := &nic.MultiBufferError{Queue: r.v.name, Buffers: nb, Bytes: c.Len - netHdrLen}
	if nb > 1 {
		// Bound the frame's claimed num_buffers by the buffers
		// outstanding when the entry was taken: Read has counted
		// those of the batch up to this one out of nbufs, not yet
		// those after it.
		q.skip = min(nb-1, r.v.nbufs)
		q.span = q.skip + 1
		e.Buffers = q.span
	}
	q.multiBuffer(c, i, e)
}

// multiBuffer turns c, the i-th of a batch, whose buffer holds part of a
// frame that spans buffers, into an error completion for e's part, kept
// until the completion is handed out (Err). Cold path.
func (q *RxQueue) multiBuffer(c *cqring.Completion, i int, e *nic.MultiBufferError) {
	q.mbErrs[i] = e
	c.Err, c.Prov, c.Len, c.Meta[0] = cq.ETRUNC, cq.ProvMultiBuffer, e.Bytes, uint64(i)
}

// Err implements qcore.Ring: the ring reader's code, translated without
// allocating (a multi-buffer frame's parts carry their place in the
// frame).
func (r rxRing) Err(c *cqring.Completion) error {
	if c.Prov == cq.ProvMultiBuffer && c.Meta[0] < qcore.Batch {
		if e := r.q.mbErrs[c.Meta[0]]; e != nil {
			return e
		}
	}
	return completionError(c)
}

// txRing is a transmit queue's qcore.Ring.
type txRing struct{ vqRing }

// Read implements qcore.Ring for a transmit queue. The device's length
// of a transmit buffer is reserved by the specification, so it is not
// read; the frame length comes from what was posted.
func (r txRing) Read(cs []cqring.Completion) int { return r.v.read(cs) }

// Err implements qcore.Ring.
func (r txRing) Err(c *cqring.Completion) error { return completionError(c) }

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
	if c.Prov == provBadNetHdr {
		return errBadNetHdr
	}
	return nic.ErrDeviceStatus
}

// errMultiBuffer is a truncated frame's error: the code as an error.
var errMultiBuffer = cq.ProvMultiBuffer.Refusal()
