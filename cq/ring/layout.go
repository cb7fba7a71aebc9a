package ring

import (
	"fmt"
	"github.com/vfnic/vfnic/cq"
)

// Convention is how a device marks a ring entry as written (owned by the
// driver). Every convention is reduced to one test per entry: the
// ownership word, loaded atomically, masked with Layout.OwnerMask, must equal
// the value expected for the current lap of the ring.
type Convention uint8

// Ownership conventions.
const (
	// PhaseBit (NVMe, SPDK): the device writes the phase bit of the current
	// lap; the expected phase starts at Layout.InitPhase (1 for NVMe) and
	// flips each time the consumer wraps.
	PhaseBit Convention = iota + 1
	// OwnerIndex (mlx5): the owner bit is compared with !!(index & entries)
	// of a free-running index, which is a phase that starts at 0 and flips
	// on wrap. Entries must be a power of two, and the ring must be Reset
	// (owner bits set to 1) before the device uses it.
	OwnerIndex
	// PackedWrap (virtio packed ring): a used descriptor has both AVAIL and
	// USED equal to the driver's used wrap counter, which starts at
	// Layout.InitPhase (1) and flips on wrap. OwnerMask holds both bits of
	// the aligned 32-bit word that contains the 16-bit flags.
	PackedWrap
	// GenerationBit (vmxnet3): each entry carries a generation bit that
	// must equal the ring's generation, starting at Layout.InitPhase (1)
	// and flipping on wrap.
	GenerationBit
	// DescriptorDone (e1000e, igb): the DD status bit is set when the
	// device is done; it never flips, and the reader clears it when it
	// consumes the entry so the next lap does not see it again.
	DescriptorDone
	// UsedIndex (virtio split ring): entries carry no ownership bit; the
	// device publishes how many it has written as a free-running index
	// (Layout.IndexBits wide, at bit Layout.IndexShift of the 32-bit word
	// RingRegs.Producer), which the reader loads atomically once per run of
	// entries and before reading any of them. An index beyond the
	// entries the device was given (Ring.SetProducerLimit), or, without
	// that limit, more than a ring ahead of the reader, is refused
	// (cq.ProvBadIndex) and stops the ring.
	UsedIndex
)

// String names the convention.
func (c Convention) String() string {
	switch c {
	case PhaseBit:
		return "phase-bit"
	case OwnerIndex:
		return "owner-index"
	case PackedWrap:
		return "packed-wrap"
	case GenerationBit:
		return "generation-bit"
	case DescriptorDone:
		return "descriptor-done"
	case UsedIndex:
		return "used-index"
	}
	return fmt.Sprintf("Convention(%d)", int(c))
}

// Field locates an unsigned little-endian value inside an entry: Bits bits
// starting at bit Shift of the value at byte offset Off. Bits 0 means the
// device does not report it (it reads as 0).
type Field struct {
	Off   int // byte offset in the entry
	Bits  int // width in bits, 0 to 64
	Shift int // bit offset from Off
}

// Fields are the completion fields a device entry may carry.
type Fields struct {
	ID       Field // the id the driver posted (see Layout.IDIsIndex)
	Queue    Field // the queue the completion belongs to (shared rings)
	Opcode   Field // the operation (Codes.Opcodes)
	Status   Field // the completion status (Codes.Statuses)
	Len      Field // bytes transferred
	Flags    Field // up to 8 device flag bits (Codes.FlagBits)
	Data     Field // remote CQ data / immediate
	Tag      Field // message tag
	Src      Field // source address
	SrcValid Field // non-zero when Src is valid; absent means always valid when Src is present
	Syndrome Field // vendor error detail
	BufOff   Field // offset inside a multi-receive buffer
	// Meta are device words a driver interprets itself (offload status,
	// RSS hash, VLAN tag): read with the rest of the entry, in the same
	// single pass, into Completion.Meta. The CQ formats do not carry them.
	Meta [2]Field
}

// DoorbellMode says what a ring publishes through its consumer doorbell.
type DoorbellMode uint8

// Doorbell modes.
const (
	// DoorbellNone: the device learns nothing (virtio, vmxnet3 completion
	// rings), or the driver does it itself.
	DoorbellNone DoorbellMode = iota
	// DoorbellHead: the ring position of the next entry to read (NVMe CQ
	// head doorbell).
	DoorbellHead
	// DoorbellCount: the free-running count of consumed entries, modulo
	// 2^32 (mlx5 consumer index, the software device).
	DoorbellCount
)

// Layout is the declarative description of a completion ring: the entry
// format and the ownership convention. The ring reader compiles it once, so
// the per-entry loop does fixed loads and masks with no call per field.
type Layout struct {
	// Name identifies the format in errors and StrError.
	Name string
	// EntrySize is the size of one entry in bytes: a multiple of 4, at
	// least 8.
	EntrySize int
	// Entries is the number of entries in the ring.
	Entries int
	// Convention is the ownership convention.
	Convention Convention
	// OwnerOff is the byte offset of the aligned 32-bit word that holds
	// the ownership bit(s); it is loaded with sync/atomic before any other
	// field of the entry.
	OwnerOff int
	// OwnerMask selects the ownership bit(s) in that word.
	OwnerMask uint32
	// InitPhase is the expected phase on the first lap (0 or 1): 1 for
	// NVMe, virtio (wrap counter) and vmxnet3; OwnerIndex requires 0;
	// DescriptorDone ignores it.
	InitPhase uint32
	// Fields locate the completion fields.
	Fields Fields
	// IDIsIndex says the entry carries no id: the ring position is the id
	// (descriptor write-back rings such as e1000e's).
	IDIsIndex bool
	// DetectHoles reports an entry that is not owned while the next one is
	// as a wrong-phase error completion (ProvBadPhase) instead of waiting
	// on it forever. Only for devices that publish entries strictly in
	// order (not virtio, whose device may publish a batch's first entry
	// last).
	DetectHoles bool
	// Doorbell is what the consumer doorbell receives once per batch.
	Doorbell DoorbellMode
	// WrongPhase, when not zero, names an ownership value that no device
	// following the convention writes: an entry whose masked ownership
	// word equals the expected value XOR WrongPhase is refused at once
	// (cq.ProvBadPhase) and consumed. For virtio's packed ring, USED set
	// to the wrap counter while AVAIL is not.
	WrongPhase uint32
	// Held (DescriptorDone only) is written into the ownership word with
	// the DD bits cleared when an entry is consumed: for a device that
	// takes an entry back as soon as its status word reads zero (the slots
	// of an AF_PACKET TPACKET_V2 ring), the entry stays the driver's until
	// the driver writes zero itself. Bits outside OwnerMask.
	Held uint32
	// IndexShift and IndexBits locate the producer index in the
	// RingRegs.Producer word (UsedIndex only): 16 and 16 for virtio.
	IndexShift, IndexBits int
}

type fieldIdx int

const (
	fID fieldIdx = iota
	fQueue
	fOpcode
	fStatus
	fLen
	fFlags
	fData
	fTag
	fSrc
	fSrcValid
	fSyndrome
	fBufOff
	fMeta0
	fMeta1
	numFields
)

func (f *Fields) list() [numFields]Field {
	return [numFields]Field{f.ID, f.Queue, f.Opcode, f.Status, f.Len, f.Flags,
		f.Data, f.Tag, f.Src, f.SrcValid, f.Syndrome, f.BufOff, f.Meta[0], f.Meta[1]}
}

var fieldNames = [numFields]string{"ID", "Queue", "Opcode", "Status", "Len", "Flags",
	"Data", "Tag", "Src", "SrcValid", "Syndrome", "BufOff", "Meta[0]", "Meta[1]"}

// cfield is a compiled field: one unaligned 64-bit load at off, a shift and
// a mask, chosen so the load never leaves the entry.
type cfield struct {
	off   uintptr
	shift uint
	mask  uint64
}

// maxEntries bounds the ring so indexes and counts fit 32 bits with room.
const maxEntries = 1 << 24

// Validate checks the layout.
func (l *Layout) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: layout %q: %s", cq.ErrInvalid, l.Name, fmt.Sprintf(format, args...))
	}
	if l.EntrySize < 8 || l.EntrySize%4 != 0 || l.EntrySize > 4096 {
		return bad("entry size %d (need a multiple of 4 in [8, 4096])", l.EntrySize)
	}
	if l.Entries < 1 || l.Entries > maxEntries {
		return bad("%d entries (need 1 to %d)", l.Entries, maxEntries)
	}
	switch l.Convention {
	case PhaseBit, GenerationBit, PackedWrap:
		if l.InitPhase > 1 {
			return bad("initial phase %d", l.InitPhase)
		}
	case OwnerIndex:
		if l.Entries&(l.Entries-1) != 0 {
			return bad("owner-index convention needs a power-of-two ring, not %d", l.Entries)
		}
		if l.InitPhase != 0 {
			return bad("owner-index convention starts at phase 0")
		}
	case DescriptorDone:
	case UsedIndex:
		if l.IndexBits < 1 || l.IndexBits > 32 || l.IndexShift < 0 || l.IndexShift+l.IndexBits > 32 {
			return bad("producer index of %d bits at bit %d (need it inside a 32-bit word)", l.IndexBits, l.IndexShift)
		}
		if l.IndexBits < 32 && l.Entries > 1<<uint(l.IndexBits-1) {
			return bad("%d entries for a %d-bit producer index", l.Entries, l.IndexBits)
		}
		if l.DetectHoles || l.WrongPhase != 0 {
			return bad("a used-index ring has no ownership bits to find holes by")
		}
	default:
		return bad("unknown ownership convention %d", int(l.Convention))
	}
	if l.Convention != UsedIndex {
		if l.OwnerOff < 0 || l.OwnerOff%4 != 0 || l.OwnerOff+4 > l.EntrySize {
			return bad("ownership word at %d (need an aligned 32-bit word inside the entry)", l.OwnerOff)
		}
		if l.OwnerMask == 0 {
			return bad("empty ownership mask")
		}
		if l.WrongPhase&^l.OwnerMask != 0 || (l.WrongPhase != 0 && l.Convention == DescriptorDone) {
			return bad("wrong-phase value %#x outside the ownership mask %#x", l.WrongPhase, l.OwnerMask)
		}
	}
	if l.Held != 0 && (l.Convention != DescriptorDone || l.Held&l.OwnerMask != 0) {
		return bad("held value %#x: only for the descriptor-done convention, outside the ownership mask %#x", l.Held, l.OwnerMask)
	}
	if l.Doorbell > DoorbellCount {
		return bad("doorbell mode %d", l.Doorbell)
	}
	fl := l.Fields.list()
	for i, f := range fl {
		if _, err := compileField(f, l.EntrySize); err != nil {
			return bad("field %s: %v", fieldNames[i], err)
		}
	}
	if l.Fields.Flags.Bits > 8 {
		return bad("field Flags: at most 8 device flag bits, not %d", l.Fields.Flags.Bits)
	}
	return nil
}

func compileField(f Field, esz int) (cfield, error) {
	if f.Bits == 0 {
		return cfield{}, nil
	}
	if f.Bits < 0 || f.Bits > 64 || f.Off < 0 || f.Shift < 0 {
		return cfield{}, fmt.Errorf("offset %d shift %d bits %d", f.Off, f.Shift, f.Bits)
	}
	byteOff := f.Off + f.Shift/8
	bitShift := f.Shift % 8
	if (byteOff*8 + bitShift + f.Bits) > esz*8 {
		return cfield{}, fmt.Errorf("offset %d shift %d bits %d beyond a %d-byte entry", f.Off, f.Shift, f.Bits, esz)
	}
	load := byteOff
	if load+8 > esz {
		load = esz - 8
	}
	shift := (byteOff-load)*8 + bitShift
	if shift+f.Bits > 64 {
		return cfield{}, fmt.Errorf("offset %d shift %d bits %d does not fit one 64-bit load", f.Off, f.Shift, f.Bits)
	}
	mask := ^uint64(0)
	if f.Bits < 64 {
		mask = 1<<uint(f.Bits) - 1
	}
	return cfield{off: uintptr(load), shift: uint(shift), mask: mask}, nil
}
