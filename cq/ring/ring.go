package ring

import (
	"fmt"
	"github.com/vfnic/vfnic/cq"
	"math/bits"
	"sync/atomic"
	"unsafe"

	"github.com/vfnic/vfnic/doorbell"
)

// RingRegs are the device registers a ring reader uses besides the entries.
type RingRegs struct {
	// Doorbell receives the consumer position or count (Layout.Doorbell)
	// once per batch. Nil when the device has none.
	Doorbell *doorbell.Doorbell
	// Overrun is a status register (or word in DMA memory) in which the
	// device sets OverrunMask when it had to drop a completion because the
	// ring was full. Invalid (zero) when the device reports no overrun.
	Overrun doorbell.Reg32
	// OverrunMask selects the overrun bit(s) in Overrun.
	OverrunMask uint32
	// Producer is the word in which the device publishes its producer
	// index (UsedIndex convention: virtio's used ring flags and idx).
	Producer doorbell.Reg32
}

// decoded is one entry as the device wrote it, decoded by the layout but not
// validated (the error path stages from it).
type decoded struct {
	Index    uint32 // ring position of the entry
	ID       uint32 // posted id (the position with IDIsIndex)
	Queue    uint32 // device queue
	Opcode   uint32 // device opcode
	Status   uint32 // device status
	Len      uint32 // bytes transferred
	Flags    uint32 // device flag bits
	Syndrome uint32 // vendor error detail
	BufOff   uint32 // offset in a multi-receive buffer
	SrcValid bool   // Src is meaningful
	Data     uint64 // remote CQ data / immediate
	Tag      uint64 // message tag
	Src      uint64 // source address
	Meta     [2]uint64
}

// Ring reads a completion ring that a device writes into DMA memory. It
// keeps the consumer position and the expected phase; it is not safe for
// concurrent use (the CQ serialises its readers).
type Ring struct {
	mem   []byte
	base  unsafe.Pointer
	l     Layout
	n     uint32
	esz   uintptr
	own   uintptr
	mask  uint32 // ownership bits
	want  uint32 // masked ownership word of a driver-owned entry this lap
	head  uint32 // ring position of the next entry
	count uint32 // entries consumed since Reset, modulo 2^32
	flip  bool   // the expected value flips on wrap (all but DD)
	clear bool   // consuming clears the ownership bits (DD)
	holes bool
	idx   bool // IDIsIndex
	// UsedIndex: the producer index as last loaded, its mask and shift,
	// and whether it was ever beyond what the device may have produced
	// (the ring is then stopped for good). limit is the driver's count of
	// entries the device may produce (SetProducerLimit), when limited.
	used     bool
	prod     uint32
	imask    uint32
	ishift   uint
	badIndex bool
	limited  bool
	limit    uint32
	wrong    uint32 // Layout.WrongPhase
	held     uint32 // Layout.Held
	meta     bool   // the layout has Meta fields
	regs     RingRegs
	f        [numFields]cfield
	srcOK    bool // SrcValid absent: Src valid whenever present
}

// newRing makes a reader over mem, which holds l.Entries entries of
// l.EntrySize bytes and must stay mapped while the Ring is used. mem must
// not be Go heap memory that the garbage collector may move (it never
// does for make()d slices, but device memory belongs outside the heap).
// The reader starts at position 0 expecting lap 0; it does not write mem
// (see Reset).
func newRing(mem []byte, l Layout, regs RingRegs) (*Ring, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	need := l.EntrySize * l.Entries
	if len(mem) < need {
		return nil, fmt.Errorf("%w: layout %q: ring memory of %d bytes for %d entries of %d", cq.ErrInvalid, l.Name, len(mem), l.Entries, l.EntrySize)
	}
	if uintptr(unsafe.Pointer(&mem[0]))%4 != 0 {
		return nil, fmt.Errorf("%w: layout %q: ring memory not 4-byte aligned", cq.ErrInvalid, l.Name)
	}
	if l.Convention == UsedIndex && !regs.Producer.Valid() {
		return nil, fmt.Errorf("%w: layout %q: used-index ring without a producer index word", cq.ErrInvalid, l.Name)
	}
	if regs.Overrun.Valid() && regs.OverrunMask == 0 {
		return nil, fmt.Errorf("%w: layout %q: overrun register without a mask", cq.ErrInvalid, l.Name)
	}
	r := &Ring{
		mem:   mem[:need:need],
		base:  unsafe.Pointer(&mem[0]),
		l:     l,
		n:     uint32(l.Entries),
		esz:   uintptr(l.EntrySize),
		own:   uintptr(l.OwnerOff),
		mask:  l.OwnerMask,
		flip:  l.Convention != DescriptorDone && l.Convention != UsedIndex,
		clear: l.Convention == DescriptorDone,
		used:  l.Convention == UsedIndex,
		wrong: l.WrongPhase,
		held:  l.Held,
		meta:  l.Fields.Meta[0].Bits != 0 || l.Fields.Meta[1].Bits != 0,
		holes: l.DetectHoles && l.Entries > 1,
		idx:   l.IDIsIndex,
		regs:  regs,
		srcOK: l.Fields.SrcValid.Bits == 0,
	}
	fl := l.Fields.list()
	for i := range fl {
		r.f[i], _ = compileField(fl[i], l.EntrySize) // checked by Validate
	}
	if r.used {
		r.ishift = uint(l.IndexShift)
		r.imask = uint32(uint64(1)<<uint(l.IndexBits) - 1)
	}
	r.rewind()
	return r, nil
}

// rewind resets the reader state to lap 0, position 0.
func (r *Ring) rewind() {
	r.head, r.count = 0, 0
	r.prod, r.badIndex, r.limit = 0, false, 0
	r.want = 0
	if r.l.InitPhase == 1 || r.l.Convention == DescriptorDone {
		r.want = r.mask
	}
}

// Reset rewinds the reader and writes every ownership word so that no entry
// looks driver-owned on the first lap: the state a driver gives a ring
// before handing it to the device (mlx5 sets owner bits to 1, e1000e clears
// DD). Call it only while the device does not use the ring.
func (r *Ring) Reset() {
	r.rewind()
	if r.used {
		return // no ownership bits; the device's index starts at 0
	}
	notReady := r.want ^ r.mask
	if !r.flip {
		notReady = 0
	}
	for i := uint32(0); i < r.n; i++ {
		p := r.ownerWord(i)
		atomic.StoreUint32(p, atomic.LoadUint32(p)&^r.mask|notReady)
	}
}

// Layout returns the ring's layout.
func (r *Ring) Layout() Layout { return r.l }

// Head returns the ring position of the next entry to read.
func (r *Ring) Head() uint32 { return r.head }

// Count returns the number of entries consumed, modulo 2^32: the consumer
// index a device compares with its producer index.
func (r *Ring) Count() uint32 { return r.count }

// Phase returns the phase (wrap counter, generation) expected on this lap:
// 1 when the ownership bits must be set (always, for DescriptorDone).
func (r *Ring) Phase() uint32 {
	if r.want == r.mask {
		return 1
	}
	return 0
}

func (r *Ring) entry(i uint32) unsafe.Pointer {
	return unsafe.Add(r.base, uintptr(i)*r.esz)
}

func (r *Ring) ownerWord(i uint32) *uint32 {
	return (*uint32)(unsafe.Add(r.base, uintptr(i)*r.esz+r.own))
}

// ready reports whether the entry at the head is owned by the driver.
func (r *Ring) ready() bool {
	if r.used {
		return r.usedReady()
	}
	return atomic.LoadUint32(r.ownerWord(r.head))&r.mask == r.want
}

// SetProducerLimit tells a UsedIndex ring how far the device may produce:
// the number of entries it was given to complete since Reset (virtio's
// available index, for its used index), modulo 2^IndexBits as the
// producer index is. From the first call on, a producer index beyond it
// is refused (cq.ProvBadIndex) and stops the ring; before it, an index
// more than a ring ahead of the reader is. The driver calls it as it
// hands over entries, serialised with the reads like them; the limit
// must never be more than a ring ahead of the consumer count (Count).
func (r *Ring) SetProducerLimit(limit uint32) {
	r.limit, r.limited = limit&r.imask, true
}

// BadIndex reports whether a UsedIndex device published a producer index
// beyond the producer limit (or more than a ring ahead of the reader);
// the ring is then stopped.
func (r *Ring) BadIndex() bool { return r.badIndex }

// readyAt reports whether position i, on the lap whose expected value is
// want, is driver-owned.
func (r *Ring) readyAt(i, want uint32) bool {
	return atomic.LoadUint32(r.ownerWord(i))&r.mask == want
}

// next returns the position and expected value that follow (i, want).
func (r *Ring) next(i, want uint32) (uint32, uint32) {
	i++
	if i == r.n {
		i = 0
		if r.flip {
			want ^= r.mask
		}
	}
	return i, want
}

// pending counts the driver-owned entries from the head, up to max, without
// consuming them.
func (r *Ring) pending(max int) int {
	if r.used {
		if !r.loadProd() {
			return 0
		}
		return min(max, int((r.prod-r.count)&r.imask))
	}
	i, want := r.head, r.want
	n := 0
	for n < max && n < int(r.n) && r.readyAt(i, want) {
		n++
		i, want = r.next(i, want)
	}
	return n
}

// hole reports, when the head entry is not driver-owned, whether the entry
// after it is: a device that writes in order never leaves such a hole, so
// the head entry carries a wrong ownership bit. The head is checked again
// after the next entry, so an entry being written at that moment is not
// mistaken for a hole. It is false unless the layout enables DetectHoles.
func (r *Ring) hole() bool {
	if r.used {
		return false
	}
	if r.wrong != 0 && atomic.LoadUint32(r.ownerWord(r.head))&r.mask == r.want^r.wrong {
		return true
	}
	if !r.holes || r.ready() {
		return false
	}
	i, want := r.next(r.head, r.want)
	return r.readyAt(i, want) && !r.ready()
}

// overrun reports whether the device has flagged an overrun and no
// driver-owned entry remains at the head.
func (r *Ring) overrun() bool {
	if r.used {
		return false
	}
	if !r.regs.Overrun.Valid() || r.regs.Overrun.Read()&r.regs.OverrunMask == 0 {
		return false
	}
	// The device stops writing when it flags the overrun, so an entry
	// that looked empty before the flag was read may since have appeared.
	return !r.ready()
}

// advance consumes the head entry; for DescriptorDone it clears the DD bit
// (and sets Layout.Held). It does not ring the doorbell (publish does,
// once per batch).
func (r *Ring) advance() {
	if r.clear {
		p := r.ownerWord(r.head)
		atomic.StoreUint32(p, atomic.LoadUint32(p)&^r.mask|r.held)
	}
	r.head++
	r.count++
	if r.head == r.n {
		r.head = 0
		if r.flip {
			r.want ^= r.mask
		}
	}
}

// skip moves the head over the k-1 further ring positions of an operation
// that occupied k (a virtio packed-ring chain, whose used descriptor is
// written over the chain's first). span is at most the ring size.
func (r *Ring) skip(span uint32) {
	if span <= 1 {
		return
	}
	span--
	r.count += span
	r.head += span
	if r.head >= r.n {
		r.head -= r.n
		if r.flip {
			r.want ^= r.mask
		}
	}
}

// consumeHole consumes the head entry, whose ownership bits are wrong,
// by first writing the value that reads as not ready on the lap when the
// reader comes back to this position (this lap's ready value; 0 for DD).
// The wrong value left in place is exactly the next lap's ready value: the
// reader would take the stale entry as new one lap later and run ahead of
// the device.
func (r *Ring) consumeHole() {
	if r.used {
		return // a used-index ring has no holes
	}
	nextNotReady := r.want
	if !r.flip {
		nextNotReady = 0
	}
	p := r.ownerWord(r.head)
	atomic.StoreUint32(p, atomic.LoadUint32(p)&^r.mask|nextNotReady)
	r.advance()
}

// publish tells the device how far the reader has consumed, through the
// doorbell (skipped when the value has not moved).
func (r *Ring) publish() {
	if d := r.regs.Doorbell; d != nil && r.l.Doorbell != DoorbellNone {
		v := r.count // DoorbellCount
		if r.l.Doorbell == DoorbellHead {
			v = r.head
		}
		d.Ring(v)
	}
}

// get loads a compiled field from entry e. The load is unaligned and never
// crosses the end of the entry.
func (f *cfield) get(e unsafe.Pointer) uint64 {
	v := *(*uint64)(unsafe.Add(e, f.off))
	if bigEndian {
		v = bits.ReverseBytes64(v)
	}
	return v >> (f.shift & 63) & f.mask
}

func (r *Ring) decode(i uint32, raw *decoded) {
	r.decodeAt(r.entry(i), i, raw)
}

// decodeAt decodes the entry at e, which is ring position i or a copy of
// it.
func (r *Ring) decodeAt(e unsafe.Pointer, i uint32, raw *decoded) {
	*raw = decoded{
		Index:    i,
		ID:       uint32(r.f[fID].get(e)),
		Queue:    uint32(r.f[fQueue].get(e)),
		Opcode:   uint32(r.f[fOpcode].get(e)),
		Status:   uint32(r.f[fStatus].get(e)),
		Len:      uint32(r.f[fLen].get(e)),
		Flags:    uint32(r.f[fFlags].get(e)),
		Syndrome: uint32(r.f[fSyndrome].get(e)),
		BufOff:   uint32(r.f[fBufOff].get(e)),
		Meta:     [2]uint64{r.f[fMeta0].get(e), r.f[fMeta1].get(e)},
		SrcValid: r.srcOK || r.f[fSrcValid].get(e) != 0,
		Data:     r.f[fData].get(e),
		Tag:      r.f[fTag].get(e),
		Src:      r.f[fSrc].get(e),
	}
	if r.idx {
		raw.ID = i
	}
}

// peek decodes the head entry into raw without consuming it; false when
// the head is not driver-owned. Fields are read only after the ownership
// word was loaded (acquire).
func (r *Ring) peek(raw *decoded) bool {
	if !r.ready() {
		return false
	}
	r.decode(r.head, raw)
	return true
}

// take decodes and consumes the head entry; false when it is not
// driver-owned. Call Publish after a batch.
func (r *Ring) take(raw *decoded) bool {
	if !r.peek(raw) {
		return false
	}
	r.advance()
	return true
}

// entryBytes returns the bytes of the entry at ring position i (for error
// data and debugging); nil when i is outside the ring.
func (r *Ring) entryBytes(i uint32) []byte {
	if i >= r.n {
		return nil
	}
	off := uintptr(i) * r.esz
	return r.mem[off : off+r.esz : off+r.esz]
}
