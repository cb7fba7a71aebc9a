package virtio

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	cqring "github.com/vfnic/vfnic/cq/ring"
	"github.com/vfnic/vfnic/doorbell"
	"github.com/vfnic/vfnic/nic"
)

// seg is one element of a descriptor chain.
type seg struct {
	addr  uint64
	len   uint32
	flags uint16 // descWrite or 0
}

// ringMem is the memory of one virtqueue, as the device sees it.
type ringMem struct {
	// desc is the descriptor ring (packed) or descriptor table (split):
	// 16 bytes per descriptor, 16-byte aligned.
	desc []byte
	// driver is the driver area: the packed ring's driver event
	// suppression (4 bytes), or the split ring's available ring
	// (flags, idx, ring[size], used_event, 2 bytes of padding).
	driver []byte
	// device is the device area: the packed ring's device event
	// suppression (4 bytes), or the split ring's used ring (flags, idx,
	// ring[size] of {id, len}, avail_event, 2 bytes of padding).
	device []byte
	// IOVAs of the three areas, for the queue registers.
	descIOVA, driverIOVA, deviceIOVA uint64
}

// ringAlign is the alignment of each ring area. The specification asks
// for 16 (descriptors) and 4, but an area that crosses an IOMMU page is
// translated piecewise: QEMU then takes a slow path for every ring access
// past the first page. Page-aligned areas of up to a page never cross.
const ringAlign = 4096

// ringSizes returns the byte sizes of a ring's three areas and the
// alignment each is carved at.
func ringSizes(size int, packed bool) (desc, driver, device, align int) {
	if packed {
		return descSize * size, 4, 4, ringAlign
	}
	return descSize * size, 4 + 2*size + 4, 4 + 8*size + 4, ringAlign
}

// vq is one virtqueue: the driver's side of a packed or split ring. It
// writes available descriptors in batches, publishes them with one release
// store and decides whether the device wants a notification; its used
// descriptors are read by cq/ring's ring reader (rd), which checks every
// field the device wrote against the table of posted buffers (tab). It is
// not safe for concurrent use; its queue serialises access.
type vq struct {
	name     string // for error messages: "rx0", "tx0", "ctrl"
	qidx     uint16 // virtqueue index, written to the doorbell
	size     uint16
	packed   bool
	eventIdx bool
	notify   doorbell.Reg16
	desc     unsafe.Pointer

	// Packed ring state. availBits is AVAIL|USED as an available
	// descriptor carries them on the current lap (AVAIL = driver wrap
	// counter, starting at 1, USED its inverse).
	drvEvent  *uint32
	devEvent  *uint32
	availPos  uint16
	availBits uint16
	headWord  *uint32 // flags word of the first unpublished descriptor
	headVal   uint32

	// Split ring state; indexes run free modulo 2^16.
	avail      unsafe.Pointer
	used       unsafe.Pointer
	usedEvent  *uint16
	availEvent *uint32 // low half is avail_event
	availIdx   uint16  // next available ring entry, published or not
	pubIdx     uint16  // available index the device has seen
	availFlags uint16

	batch     uint16 // descriptors added since the last publish
	sinceKick uint16 // descriptors published since the last notify decision

	// The reading side: the ring reader over the used descriptors (packed)
	// or the used ring (split), and the table of posted buffers whose ids
	// it checks. Ids are table slots, below size: a split ring's id is the
	// head descriptor's index.
	rd     *cqring.RingSource
	tab    *cqring.Table // its Op.Word: the posting order (qcore.Queue.Word), low 16 bits the descriptors
	mem    ringMem
	ndescs int // descriptors outstanding
	nbufs  int // buffers outstanding

	armed  bool
	broken bool

	notifies, suppressed uint64
}

// newVQ makes the driver side of a ring in mem (zeroed memory of the sizes
// ringSizes gives). Used-buffer notifications start disabled: the queue
// polls until someone arms it.
func newVQ(name string, qidx uint16, size int, packed, eventIdx bool, mem ringMem, notify doorbell.Reg16) (*vq, error) {
	d, dr, dv, _ := ringSizes(size, packed)
	switch {
	case size < minRingSize || size > 1<<15:
		return nil, fmt.Errorf("%w: %s: ring of %d descriptors", nic.ErrInvalid, name, size)
	case !packed && size&(size-1) != 0:
		return nil, fmt.Errorf("%w: %s: split ring of %d descriptors is not a power of two", nic.ErrInvalid, name, size)
	case len(mem.desc) < d || len(mem.driver) < dr || len(mem.device) < dv:
		return nil, fmt.Errorf("%w: %s: ring memory too small", nic.ErrInvalid, name)
	case uintptr(unsafe.Pointer(&mem.desc[0]))%16 != 0 || uintptr(unsafe.Pointer(&mem.driver[0]))%4 != 0 ||
		uintptr(unsafe.Pointer(&mem.device[0]))%4 != 0:
		return nil, fmt.Errorf("%w: %s: ring memory misaligned", nic.ErrInvalid, name)
	}
	q := &vq{name: name, qidx: qidx, size: uint16(size), packed: packed, eventIdx: eventIdx,
		notify: notify, desc: unsafe.Pointer(&mem.desc[0]), mem: mem}
	if err := q.setReader(usedPlain); err != nil {
		return nil, err
	}
	if packed {
		q.drvEvent = (*uint32)(unsafe.Pointer(&mem.driver[0]))
		q.devEvent = (*uint32)(unsafe.Pointer(&mem.device[0]))
		q.availBits = descAvail
	} else {
		q.avail = unsafe.Pointer(&mem.driver[0])
		q.used = unsafe.Pointer(&mem.device[0])
		q.usedEvent = (*uint16)(unsafe.Add(q.avail, 4+2*size))
		q.availEvent = (*uint32)(unsafe.Add(q.used, 4+8*size))
	}
	q.disarm()
	return q, nil
}

// room returns how many descriptors can still be posted.
func (q *vq) room() int { return int(q.size) - q.ndescs }

// reserve records a buffer of ndesc descriptors in the table of posted
// buffers, in the low 16 bits of op.Word, and returns its id; false when
// every id is outstanding (the caller checked room, so only a table
// whose freed ids are not yet published).
func (q *vq) reserve(op *cqring.Op, ndesc int) (uint16, bool) {
	op.Word = op.Word&^0xffff | uint64(ndesc)
	op.Span = ndesc
	if !q.packed {
		op.Span = 0 // the used ring has one element per buffer
	}
	id, err := q.tab.Post(*op)
	if err != nil {
		return 0, false
	}
	q.ndescs += ndesc
	q.nbufs++
	return uint16(id), true
}

// add writes one available descriptor for buffer id (reserve). The first
// descriptor of a batch keeps its flags back until publish, so the device
// never sees part of a batch; the others are written in full (the device
// reads them only after the first, in ring order).
func (q *vq) add(id uint16, addr uint64, length uint32, flags uint16) {
	if q.packed {
		q.putPacked(id, addr, length, flags)
		return
	}
	// Split: descriptor id is the buffer's own table entry.
	p := unsafe.Add(q.desc, uintptr(id)*descSize)
	*(*uint64)(p) = addr
	*(*uint32)(unsafe.Add(p, 8)) = length
	*(*uint32)(unsafe.Add(p, 12)) = uint32(flags) // next = 0
	*(*uint16)(unsafe.Add(q.avail, 4+2*uintptr(q.availIdx&(q.size-1)))) = id
	q.availIdx++
	q.batch++
}

// putPacked writes one packed-ring descriptor at availPos. The flags word
// of a batch's first descriptor is held back (headWord/headVal) and stored
// last by the flush, so the device never sees a half-written batch.
func (q *vq) putPacked(id uint16, addr uint64, length uint32, flags uint16) {
	p := unsafe.Add(q.desc, uintptr(q.availPos)*descSize)
	*(*uint64)(p) = addr
	*(*uint32)(unsafe.Add(p, 8)) = length
	word := uint32(id) | uint32(flags|q.availBits)<<16
	fw := (*uint32)(unsafe.Add(p, 12))
	if q.batch == 0 {
		q.headWord, q.headVal = fw, word
	} else {
		*fw = word
	}
	q.batch++
	if q.availPos++; q.availPos == q.size {
		q.availPos = 0
		q.availBits ^= descAvail | descUsed
	}
}

// addChain posts buffer id (reserved for len(segs) descriptors), made of
// several elements. On a packed ring the chain takes consecutive ring
// slots, each carrying the id; on a split ring it uses descriptor table
// entries id, id+1, ... (modulo the size), which must be free: the control
// queue, the only user, has one buffer outstanding at a time.
func (q *vq) addChain(id uint16, segs []seg) {
	n := len(segs)
	if q.packed {
		for i, sg := range segs {
			f := sg.flags
			if i < n-1 {
				f |= descNext
			}
			q.putPacked(id, sg.addr, sg.len, f)
		}
		return
	}
	for i, sg := range segs {
		d := uint16((int(id) + i) % int(q.size))
		f, next := uint32(sg.flags), uint32(0)
		if i < n-1 {
			f |= descNext
			next = uint32((int(d) + 1) % int(q.size))
		}
		p := unsafe.Add(q.desc, uintptr(d)*descSize)
		*(*uint64)(p) = sg.addr
		*(*uint32)(unsafe.Add(p, 8)) = sg.len
		*(*uint32)(unsafe.Add(p, 12)) = f | next<<16
	}
	*(*uint16)(unsafe.Add(q.avail, 4+2*uintptr(q.availIdx&(q.size-1)))) = id
	q.availIdx++
	q.batch++
}

// publish makes the batch visible to the device with one atomic store: the
// first descriptor's flags (packed) or the available index (split). On
// amd64 the store is an XCHG, a full barrier, so the notification check
// that follows cannot read the device's suppression state early.
func (q *vq) publish() {
	if q.batch == 0 {
		return
	}
	if q.packed {
		atomic.StoreUint32(q.headWord, q.headVal)
		q.headWord = nil
	} else {
		q.pubIdx = q.availIdx
		atomic.StoreUint32((*uint32)(q.avail), uint32(q.availFlags)|uint32(q.pubIdx)<<16)
		// The device may now use up to pubIdx: a used index beyond it
		// names buffers the device was never given (stale entries of
		// the last lap, whose ids carry no generation).
		q.rd.Ring().SetProducerLimit(uint32(q.pubIdx))
	}
	q.sinceKick += q.batch
	q.batch = 0
}

// kickNeeded reads the device's notification suppression for the
// descriptors published since the last decision.
func (q *vq) kickNeeded() bool {
	if q.packed {
		w := atomic.LoadUint32(q.devEvent)
		switch uint16(w>>16) & 3 {
		case eventDisable:
			return false
		case eventDesc:
			if !q.eventIdx {
				return true
			}
			// The event names a ring position and the wrap counter of
			// its lap; positions of the previous lap count as negative.
			off := int(uint16(w) & 0x7fff)
			if (uint16(w)>>15 != 0) != (q.availBits&descAvail != 0) {
				off -= int(q.size)
			}
			// Notify when the event names any descriptor published up to
			// now, within a ring's length, not only one of this batch:
			// QEMU's packed ring leaves its event where it enabled
			// notifications while it goes on taking descriptors
			// (virtio-net's transmit completion of a busy backend), so
			// an event behind the batch can name a device now idle
			// that waits for a notification (split rings move
			// avail_event at each take). An event ahead of the
			// published descriptors still suppresses.
			return uint16(int(q.availPos)-off-1) < q.size
		}
		return true
	}
	if q.eventIdx {
		ev := uint16(atomic.LoadUint32(q.availEvent))
		return doorbell.NeedEvent(ev, q.pubIdx, q.pubIdx-q.sinceKick)
	}
	return atomic.LoadUint32((*uint32)(q.used))&usedNoNotify == 0
}

// flush publishes the batch and notifies the device when it asked to be.
func (q *vq) flush() {
	q.publish()
	if q.sinceKick == 0 {
		return
	}
	if q.kickNeeded() {
		q.notify.Write(q.qidx)
		q.notifies++
	} else {
		q.suppressed++
	}
	q.sinceKick = 0
}

// arm asks for a used-buffer notification once threshold buffers are used
// (counted from the next one to read): the packed ring's descriptor event
// or the split ring's used_event with EVENT_IDX, else notifications on.
// With fewer buffers outstanding the event is aimed at the last of them,
// so that it can fire; but when the device has used all of them already
// (a reader that counts ready entries without taking them, as a cq.CQ
// waiting for a threshold does), that position is behind the device and
// would never fire, so the event goes to the threshold, which buffers
// posted later reach. The caller polls again afterwards: a buffer used
// before the device saw the arm raises nothing. Threshold 0 asks for the
// buffer after those already used (verbs' request-notify: completions
// present at the arm raise no event); it reports late when the device used
// that buffer while the arm was being made, so that the event may never
// come (the device passed the event before it saw it): the caller then
// raises it itself.
func (q *vq) arm(threshold int) (late bool) {
	next := threshold <= 0
	if next {
		threshold = q.pending(int(q.size)) + 1
	}
	thr := min(max(threshold, 1), int(q.size))
	t := thr
	if q.nbufs > 0 {
		t = min(t, q.nbufs)
	}
	q.armed = true
	switch {
	case q.packed && !q.eventIdx:
		atomic.StoreUint32(q.drvEvent, eventEnable<<16)
	case !q.packed && !q.eventIdx:
		q.availFlags = 0
		atomic.StoreUint32((*uint32)(q.avail), uint32(q.availFlags)|uint32(q.pubIdx)<<16)
	default:
		q.setEvent(uint16(t))
		// The event is published before the ring is read again (a full
		// barrier), so either this read sees the device's last used
		// entry or the device sees the event.
		if t < thr && q.pending(t) >= t {
			q.setEvent(uint16(thr))
		}
	}
	// Read again after the store (a full barrier): a buffer used beyond
	// those counted may have been used before the device saw the arm.
	return next && q.pending(threshold) >= threshold
}

// setEvent aims the used-buffer event (EVENT_IDX) at the t-th buffer from
// the next one to read.
func (q *vq) setEvent(t uint16) {
	r := q.rd.Ring()
	if q.packed {
		pos := uint16(r.Head()) + t - 1
		wrap := r.Phase() == 1
		if pos >= q.size {
			pos -= q.size
			wrap = !wrap
		}
		v := uint32(pos) | eventDesc<<16
		if wrap {
			v |= 1 << 15
		}
		atomic.StoreUint32(q.drvEvent, v)
		return
	}
	*q.usedEvent = uint16(r.Count()) + t - 1
	doorbell.Mb() // the device must see the event before the ring is read again
}

// disarm turns used-buffer notifications off. With split EVENT_IDX the
// event index is moved half the index space ahead, the farthest it can be.
func (q *vq) disarm() {
	q.armed = false
	if q.packed {
		atomic.StoreUint32(q.drvEvent, eventDisable<<16)
		return
	}
	if q.eventIdx {
		*q.usedEvent = uint16(q.rd.Ring().Count()) + 0x8000
		return
	}
	q.availFlags = availNoInterrupt
	atomic.StoreUint32((*uint32)(q.avail), uint32(q.availFlags)|uint32(q.pubIdx)<<16)
}
