package qpsim

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"runtime"
	"time"
	"unsafe"

	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/cq/ring"
	"github.com/vfnic/vfnic/dma"
	"github.com/vfnic/vfnic/doorbell"
	"github.com/vfnic/vfnic/eventfd"
)

// CQE is the software device's completion entry as it lies in the ring
// (little-endian fields; see the package documentation). It is the one
// declaration of the format: the Off* constants, CQESize and Layout are
// derived from it.
type CQE struct {
	ID       uint32   // the id the driver put in the descriptor (ring.Table id)
	Queue    uint16   // 2k for QP k's send queue, 2k+1 for its receive queue
	Opcode   Opcode   // what completed
	Status   Status   // StatusOK or an error
	ByteLen  uint32   // bytes sent or received
	DevFlags uint32   // Dev* bits
	Data     uint64   // remote CQ data (DevHasData)
	Tag      uint64   // message tag (DevTagged)
	Src      uint64   // source address (DevHasSrc)
	Syndrome uint32   // vendor error detail
	BufOff   uint32   // offset inside a multi-receive buffer
	_        [12]byte // reserved, written as 0
	Owner    uint32   // OwnerBit is the phase; written last
}

// CQE geometry and field offsets, from CQE.
const (
	CQESize     = int(unsafe.Sizeof(CQE{}))
	OffID       = int(unsafe.Offsetof(CQE{}.ID))
	OffQueue    = int(unsafe.Offsetof(CQE{}.Queue))
	OffOpcode   = int(unsafe.Offsetof(CQE{}.Opcode))
	OffStatus   = int(unsafe.Offsetof(CQE{}.Status))
	OffByteLen  = int(unsafe.Offsetof(CQE{}.ByteLen))
	OffDevFlags = int(unsafe.Offsetof(CQE{}.DevFlags))
	OffData     = int(unsafe.Offsetof(CQE{}.Data))
	OffTag      = int(unsafe.Offsetof(CQE{}.Tag))
	OffSrc      = int(unsafe.Offsetof(CQE{}.Src))
	OffSyndrome = int(unsafe.Offsetof(CQE{}.Syndrome))
	OffBufOff   = int(unsafe.Offsetof(CQE{}.BufOff))
	OffOwner    = int(unsafe.Offsetof(CQE{}.Owner))
	// OwnerBit is the phase bit in the owner word.
	OwnerBit = 1 << 31
)

// The documented format is 64 bytes with the owner word last: a change to
// CQE that breaks it does not compile.
var (
	_ [64 - CQESize]struct{}
	_ [CQESize - 64]struct{}
	_ [60 - OffOwner]struct{}
	_ [OffOwner - 60]struct{}
)

// bits returns the width in bits of a CQE field of size bytes.
func bitsOf(size uintptr) int { return int(8 * size) }

// Opcode is the CQE opcode.
type Opcode uint8

// Opcodes.
const (
	OpSend            Opcode = 0
	OpRecv            Opcode = 1
	OpWrite           Opcode = 2
	OpRead            Opcode = 3
	OpRecvRDMAWithImm Opcode = 4
)

// Status is the CQE status.
type Status uint8

// Statuses.
const (
	StatusOK              Status = 0
	StatusLocalLenErr     Status = 1
	StatusLocalProtErr    Status = 2
	StatusWRFlushErr      Status = 3
	StatusRemoteAccessErr Status = 4
	StatusGeneralErr      Status = 5
)

// CQE dev_flags bits.
const (
	DevHasData   = 1 << 0
	DevTagged    = 1 << 1
	DevMultiRecv = 1 << 2
	DevMore      = 1 << 3
	DevHasSrc    = 1 << 4
)

// CQ status page offsets.
const (
	OffCQConsumer = 0
	OffCQArm      = 8
	OffCQOverrun  = 16
	OffCQProducer = 20
)

// CQ sizes.
const (
	DefaultCQSize = 1024
	MaxCQSize     = 65536
)

// Layout returns the ring layout of a CQ of size entries, for ring.Ring.
func Layout(size int) ring.Layout {
	var e CQE
	return ring.Layout{
		Name: "sim", EntrySize: CQESize, Entries: size, Convention: ring.PhaseBit,
		OwnerOff: OffOwner, OwnerMask: OwnerBit, InitPhase: 1,
		DetectHoles: true, Doorbell: ring.DoorbellCount,
		Fields: ring.Fields{
			ID:       ring.Field{Off: OffID, Bits: bitsOf(unsafe.Sizeof(e.ID))},
			Queue:    ring.Field{Off: OffQueue, Bits: bitsOf(unsafe.Sizeof(e.Queue))},
			Opcode:   ring.Field{Off: OffOpcode, Bits: bitsOf(unsafe.Sizeof(e.Opcode))},
			Status:   ring.Field{Off: OffStatus, Bits: bitsOf(unsafe.Sizeof(e.Status))},
			Len:      ring.Field{Off: OffByteLen, Bits: bitsOf(unsafe.Sizeof(e.ByteLen))},
			Flags:    ring.Field{Off: OffDevFlags, Bits: 8}, // the Dev* bits
			Data:     ring.Field{Off: OffData, Bits: bitsOf(unsafe.Sizeof(e.Data))},
			Tag:      ring.Field{Off: OffTag, Bits: bitsOf(unsafe.Sizeof(e.Tag))},
			Src:      ring.Field{Off: OffSrc, Bits: bitsOf(unsafe.Sizeof(e.Src))},
			SrcValid: ring.Field{Off: OffDevFlags, Shift: bits.TrailingZeros(DevHasSrc), Bits: 1},
			Syndrome: ring.Field{Off: OffSyndrome, Bits: bitsOf(unsafe.Sizeof(e.Syndrome))},
			BufOff:   ring.Field{Off: OffBufOff, Bits: bitsOf(unsafe.Sizeof(e.BufOff))},
		},
	}
}

// Codes returns the meaning of the CQE's status, opcode and flag values.
func Codes() ring.Codes {
	return ring.Codes{
		Statuses: []ring.Status{
			{Value: uint32(StatusOK), Name: "OK"},
			{Value: uint32(StatusLocalLenErr), Err: cq.ETRUNC, Name: "LOCAL_LEN_ERR"},
			{Value: uint32(StatusLocalProtErr), Err: cq.EFAULT, Name: "LOCAL_PROT_ERR"},
			{Value: uint32(StatusWRFlushErr), Err: cq.ECANCELED, Name: "WR_FLUSH_ERR"},
			{Value: uint32(StatusRemoteAccessErr), Err: cq.EACCES, Name: "REMOTE_ACCESS_ERR"},
			{Value: uint32(StatusGeneralErr), Err: cq.EIO, Name: "GENERAL_ERR"},
		},
		Opcodes: []ring.Opcode{
			{Value: uint32(OpSend), Flags: cq.FlagSend, Name: "SEND"},
			{Value: uint32(OpRecv), Flags: cq.FlagRecv, Name: "RECV"},
			{Value: uint32(OpWrite), Flags: cq.FlagRMA | cq.FlagWrite, Name: "WRITE"},
			{Value: uint32(OpRead), Flags: cq.FlagRMA | cq.FlagRead, Name: "READ"},
			{Value: uint32(OpRecvRDMAWithImm), Flags: cq.FlagRMA | cq.FlagRemoteWrite | cq.FlagRemoteCQData, Name: "RECV_RDMA_WITH_IMM"},
		},
		FlagBits: [8]cq.Flags{cq.FlagRemoteCQData, cq.FlagTagged, cq.FlagMultiRecv, cq.FlagMore},
	}
}

// Limits are the CQ attributes the device supports.
func Limits() cq.Limits {
	return cq.Limits{DefaultSize: DefaultCQSize, MaxSize: MaxCQSize, PowerOfTwo: true,
		DefaultFormat: cq.FormatData, Vectors: runtime.NumCPU()}
}

// cqe is a completion before the device writes it.
type cqe struct {
	CQE
	solicited bool // device-internal: counts for solicited-only arms
}

// devCQ is the device side of a CQ.
type devCQ struct {
	c      *cq.CQ
	src    *ring.RingSource
	region *dma.Region
	extra  *dma.Region // the ring after a resize (the status page stays in region)
	ring   []byte
	win    doorbell.Window
	size   uint32
	shift  uint // log2(size)
	cons   doorbell.Reg32
	arm    doorbell.Reg64
	over   doorbell.Reg32
	prodR  doorbell.Reg32
	irq    *eventfd.FD

	prod     uint32
	consSeen uint32 // last consumer count read: re-read only when the ring looks full
	dead     bool
	armSeq   uint8
	armed    bool
	armCI    uint32
	armThr   uint32
	armSol   bool
	solSeen  bool
	solProd  uint32 // producer count just past the last solicited or error entry
	hasSol   bool   // solProd is set
	lose     int
	faults   []Fault
	rng      uint64 // FaultGarbage's generator
	last     cqe
	hasLast  bool
	closed   bool

	// Counters, under d.mu.
	written, dropped, interrupts, overruns, driverErrors uint64
	lastWrite                                            time.Duration
}

// CQStats are a CQ's device-side counters.
type CQStats struct {
	Written    uint64 // entries written (including injected ones)
	Dropped    uint64 // completions dropped after an overrun
	Interrupts uint64 // interrupts raised (lost ones not counted)
	Overruns   uint64 // 1 once the CQ overran
	// DriverErrors is 1 once the driver's consumer count was found ahead of
	// the producer (entries consumed that the device never wrote); the CQ
	// then writes nothing more.
	DriverErrors uint64
	LastWrite    time.Duration // device clock (Device.Now) of the last entry written
}

// notifier is the driver side of the arm doorbell.
type notifier struct {
	d   *Device
	arm doorbell.Reg64
	seq uint8
}

// Arm writes the arm doorbell (ring.Notifier).
func (n *notifier) Arm(consumed uint32, solicitedOnly bool, threshold int) error {
	n.seq++
	thr := uint64(min(max(threshold, 1), 0xffff))
	v := uint64(consumed) | thr<<32 | uint64(n.seq)<<56
	if solicitedOnly {
		v |= 1 << 48
	}
	n.arm.Write(v)
	n.d.kickDevice()
	return nil
}

type closerFunc func() error

// Close calls f.
func (f closerFunc) Close() error { return f() }

// OpenCQ opens a completion queue backed by a device completion ring of
// the attribute's size (rounded up to a power of two; 0 means 1024; at most
// 65536). FormatUnspec means FormatData.
func (d *Device) OpenCQ(attr cq.Attr) (*cq.CQ, error) {
	c, err := cq.New(attr, Limits())
	if err != nil {
		return nil, err
	}
	size := c.Attr().Size
	d.mu.Lock()
	r, err := d.alloc(size*CQESize + 4096)
	d.mu.Unlock()
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	dc, src, err := d.newDevCQ(c, r, size)
	if err == nil {
		err = c.Driver().AddSource(src)
	}
	if err != nil {
		_ = c.Close()
		d.mu.Lock()
		_ = d.free(r)
		d.mu.Unlock()
		return nil, err
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		_ = c.Close()
		return nil, ErrClosed
	}
	d.cqs[c] = dc
	d.cqList = append(d.cqList, dc)
	d.mu.Unlock()
	return c, nil
}

func (d *Device) newDevCQ(c *cq.CQ, r *dma.Region, size int) (*devCQ, *ring.RingSource, error) {
	entries, err := r.Carve(size*CQESize, 4096)
	if err != nil {
		return nil, nil, err
	}
	page, err := r.Carve(64, 64)
	if err != nil {
		return nil, nil, err
	}
	pw := doorbell.NewWindow(page.Bytes)
	dc := &devCQ{c: c, region: r, ring: entries.Bytes, win: doorbell.NewWindow(entries.Bytes),
		size: uint32(size), shift: uint(bits.TrailingZeros(uint(size))), irq: c.Driver().Interrupt()}
	var errs [4]error
	dc.cons, errs[0] = pw.Reg32(OffCQConsumer)
	dc.arm, errs[1] = pw.Reg64(OffCQArm)
	dc.over, errs[2] = pw.Reg32(OffCQOverrun)
	dc.prodR, errs[3] = pw.Reg32(OffCQProducer)
	for _, e := range errs {
		if e != nil {
			return nil, nil, e
		}
	}
	src, err := ring.NewRingSource(ring.RingConfig{
		Mem: entries.Bytes, Layout: Layout(size), Codes: Codes(),
		Regs:     ring.RingRegs{Doorbell: doorbell.NewDoorbell(dc.cons), Overrun: dc.over, OverrunMask: 1},
		Notifier: &notifier{d: d, arm: dc.arm},
		Closer:   closerFunc(func() error { return d.releaseCQ(dc) }),
	})
	if err != nil {
		return nil, nil, err
	}
	dc.src = src
	return dc, src, nil
}

// releaseCQ is the ring source's Closer: it runs from cq.CQ.Close, after
// every queue pair has unbound.
func (d *Device) releaseCQ(dc *devCQ) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if dc.closed {
		return nil
	}
	dc.closed = true
	delete(d.cqs, dc.c)
	for i, x := range d.cqList {
		if x == dc {
			d.cqList = append(d.cqList[:i], d.cqList[i+1:]...)
			break
		}
	}
	if dc.extra != nil {
		_ = d.free(dc.extra)
	}
	return d.free(dc.region)
}

// ResizeCQ gives c a ring of entries entries (rounded up to a power of
// two, at most MaxCQSize) and returns the new size (the device side of
// ibv_resize_cq). The entries not yet consumed move to the new ring in
// order, with every later completion written there; held more than fit
// (held counts entries the caller keeps elsewhere, such as a read buffer)
// is an error matching cq.ErrInvalid and changes nothing. The device is
// paused meanwhile; the caller must keep every reader of c out during the
// call.
func (d *Device) ResizeCQ(c *cq.CQ, entries, held int) (int, error) {
	if entries < 1 || entries > MaxCQSize || held < 0 {
		return 0, fmt.Errorf("sim: resize to %d entries (1 to %d): %w", entries, MaxCQSize, cq.ErrInvalid)
	}
	size := uint32(1) << bits.Len(uint(entries-1))
	d.mu.Lock()
	defer d.mu.Unlock()
	dc, err := d.devCQOf(c)
	if err != nil {
		return 0, err
	}
	if dc.dead {
		return 0, fmt.Errorf("sim: resize: %w", cq.ErrOverrun)
	}
	cons := dc.src.Ring().Count()
	if n := dc.prod - cons + uint32(held); n > size {
		return 0, fmt.Errorf("sim: resize to %d entries: the CQ holds %d: %w", size, n, cq.ErrInvalid)
	}
	r, err := d.alloc(int(size) * CQESize)
	if err != nil {
		return 0, err
	}
	mem := r.Bytes()[:int(size)*CQESize]
	shift := uint(bits.TrailingZeros32(size))
	phase := func(x uint32, shift uint) uint32 { return 1 ^ (x>>shift)&1 } // of lap x>>shift
	win := doorbell.NewWindow(mem)
	owner := func(x uint32) doorbell.Reg32 {
		reg, _ := win.Reg32(uintptr(int(x&(size-1))*CQESize + OffOwner)) // in range
		return reg
	}
	// Not ready for the lap the reader is on at each position...
	for x := cons; x != cons+size; x++ {
		owner(x).Write((phase(x, shift) ^ 1) << 31)
	}
	// ...then the held entries in order, each with the phase of its new
	// lap; one written with a wrong phase (FaultWrongPhase) stays wrong.
	for x := cons; x != dc.prod; x++ {
		from := int(x&(dc.size-1)) * CQESize
		to := int(x&(size-1)) * CQESize
		copy(mem[to:to+OffOwner], dc.ring[from:from+OffOwner])
		oldOwner, _ := dc.win.Reg32(uintptr(from + OffOwner))
		wrong := oldOwner.Read()>>31 ^ phase(x, dc.shift)
		owner(x).Write((phase(x, shift) ^ wrong) << 31)
	}
	if err := dc.src.Remap(mem, int(size)); err != nil {
		_ = d.free(r)
		return 0, err
	}
	if dc.extra != nil {
		_ = d.free(dc.extra)
	}
	dc.extra, dc.ring, dc.win, dc.size, dc.shift = r, mem, win, size, shift
	dc.consSeen = cons
	return int(size), nil
}

// devCQOf finds the device side of c. Called with d.mu held.
func (d *Device) devCQOf(c *cq.CQ) (*devCQ, error) {
	if d.closed {
		return nil, ErrClosed
	}
	dc, ok := d.cqs[c]
	if !ok {
		return nil, ErrUnknownCQ
	}
	return dc, nil
}

// CQStats returns the device-side counters of c.
func (d *Device) CQStats(c *cq.CQ) (CQStats, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	dc, err := d.devCQOf(c)
	if err != nil {
		return CQStats{}, err
	}
	return CQStats{Written: dc.written, Dropped: dc.dropped, Interrupts: dc.interrupts,
		Overruns: dc.overruns, DriverErrors: dc.driverErrors, LastWrite: dc.lastWrite}, nil
}

// stepCQ takes a new arm request and fires if it is already satisfied.
// Device loop, d.mu held.
func (d *Device) stepCQ(dc *devCQ) bool {
	if dc.prodR.Read() != dc.prod {
		dc.prodR.Write(dc.prod) // once per pass: the line is shared with the consumer doorbell
	}
	v := dc.arm.Read()
	seq := uint8(v >> 56)
	if seq == dc.armSeq {
		return false
	}
	dc.armSeq = seq
	dc.armed = true
	dc.armCI = uint32(v)
	dc.armThr = max(uint32(v>>32)&0xffff, 1)
	dc.armSol = v&(1<<48) != 0
	// A solicited entry written beyond the arm's consumer count fires it,
	// as for a "next" arm: one written after the driver's arm doorbell
	// but before this pass read it must not be lost.
	dc.solSeen = dc.hasSol && int32(dc.solProd-dc.armCI) > 0
	d.maybeFire(dc)
	return true
}

// maybeFire raises the interrupt when an arm is satisfied.
func (d *Device) maybeFire(dc *devCQ) {
	if !dc.armed || dc.irq == nil {
		return
	}
	if dc.armSol {
		if !dc.solSeen {
			return
		}
	} else if dc.prod-dc.armCI < dc.armThr {
		return
	}
	dc.armed = false
	if dc.lose > 0 {
		dc.lose--
		return
	}
	if err := dc.irq.Add(1); err == nil {
		dc.interrupts++
		d.fired = true
	}
}

// complete writes a completion, applying the next pending fault. Device
// loop, d.mu held.
func (d *Device) complete(dc *devCQ, e cqe) {
	if dc.dead || dc.closed {
		dc.dropped++
		return
	}
	if len(dc.faults) > 0 {
		f := dc.faults[0]
		dc.faults = dc.faults[1:]
		switch f.Kind {
		case FaultErrorStatus:
			e.Status = f.Status
			if f.Status == StatusOK {
				e.Status = StatusGeneralErr
			}
			e.Syndrome = f.Syndrome
		case FaultBadLen:
			e.ByteLen += 4096
		case FaultBadStatus:
			e.Status = 0xee
		case FaultBadOpcode:
			e.Opcode = 0xee
		case FaultWrongOpcode:
			if e.Opcode == OpRecv || e.Opcode == OpRecvRDMAWithImm {
				e.Opcode = OpSend
			} else {
				e.Opcode = OpRecv
			}
		case FaultBadID:
			bad := e
			bad.ID ^= 0x80000000 // same slot, another generation: never outstanding
			if !d.write(dc, bad, false) {
				return
			}
		case FaultDuplicateID:
			dup := e
			if dc.hasLast {
				dup = dc.last
			} else {
				dup.ID ^= 0x80000000
			}
			if !d.write(dc, dup, false) {
				return
			}
		case FaultWrongPhase:
			// A copy of the real entry, left with the previous lap's
			// phase: misreading it would complete the operation twice.
			if !d.write(dc, e, true) {
				return
			}
		case FaultGarbage:
			if !d.write(dc, dc.garbage(), false) {
				return
			}
		case FaultRewriteID:
			if d.write(dc, e, false) {
				// After the hand-over (the owner word is written), a stale
				// id for about a microsecond, then the real one again: a
				// reader sees one or the other, and must act on the one it
				// read, never look up one and release the other.
				at := int((dc.prod-1)&(dc.size-1)) * CQESize
				binary.LittleEndian.PutUint32(dc.ring[at+OffID:], e.ID^0x80000000)
				for t := time.Now(); time.Since(t) < time.Microsecond; {
				}
				binary.LittleEndian.PutUint32(dc.ring[at+OffID:], e.ID)
				dc.last, dc.hasLast = e, true
			}
			return
		}
	}
	if d.write(dc, e, false) {
		dc.last, dc.hasLast = e, true
	}
}

// garbage returns an entry of pseudo-random fields (xorshift64, seeded by
// the CQ), for FaultGarbage.
func (dc *devCQ) garbage() cqe {
	next := func() uint64 {
		if dc.rng == 0 {
			dc.rng = 0x9e3779b97f4a7c15 ^ uint64(dc.size)
		}
		dc.rng ^= dc.rng << 13
		dc.rng ^= dc.rng >> 7
		dc.rng ^= dc.rng << 17
		return dc.rng
	}
	a, b, c := next(), next(), next()
	return cqe{CQE: CQE{ID: uint32(a), Queue: uint16(a >> 32), Opcode: Opcode(a >> 48), Status: Status(a >> 56),
		ByteLen: uint32(b), DevFlags: uint32(b >> 32), Data: c, Tag: c * 31, Src: b ^ c,
		Syndrome: uint32(c >> 32), BufOff: uint32(c)}}
}

// write puts one entry in the ring, or enters the overrun state when the
// ring is full. It reports whether the entry was written.
func (d *Device) write(dc *devCQ, e cqe, wrongPhase bool) bool {
	if dc.prod-dc.consSeen >= dc.size {
		dc.consSeen = dc.cons.Read()
		// Signed: a consumer count ahead of the producer is not a full
		// ring but a driver that consumed entries never written.
		switch used := int32(dc.prod - dc.consSeen); {
		case used < 0:
			d.driverError(dc)
			return false
		case used >= int32(dc.size):
			d.overrun(dc)
			return false
		}
	}
	pos := dc.prod & (dc.size - 1)
	// Build the entry on the stack and copy it with wide stores: the ring
	// line is in the reader's cache, and a few wide stores waiting for it
	// fill the store buffer less than a dozen narrow ones.
	var t [CQESize]byte
	le := binary.LittleEndian
	le.PutUint32(t[OffID:], e.ID)
	le.PutUint16(t[OffQueue:], e.Queue)
	t[OffOpcode] = byte(e.Opcode)
	t[OffStatus] = byte(e.Status)
	le.PutUint32(t[OffByteLen:], e.ByteLen)
	le.PutUint32(t[OffDevFlags:], e.DevFlags)
	le.PutUint64(t[OffData:], e.Data)
	le.PutUint64(t[OffTag:], e.Tag)
	le.PutUint64(t[OffSrc:], e.Src)
	le.PutUint32(t[OffSyndrome:], e.Syndrome)
	le.PutUint32(t[OffBufOff:], e.BufOff)
	at := int(pos) * CQESize
	copy(dc.ring[at:at+OffOwner], t[:OffOwner])
	phase := uint32(1) ^ (dc.prod>>dc.shift)&1
	if wrongPhase {
		phase ^= 1
	}
	owner, _ := dc.win.Reg32(uintptr(at + OffOwner)) // in range: pos < size
	owner.Write(phase << 31)                         // last, a release store
	dc.prod++
	dc.written++
	dc.lastWrite = d.stamp()
	if e.solicited || e.Status != 0 {
		dc.solProd, dc.hasSol = dc.prod, true
		if dc.armed && dc.armSol {
			dc.solSeen = true
		}
	}
	d.maybeFire(dc)
	return true
}

// overrun makes the CQ fatal: the flag tells the driver, an interrupt
// wakes a blocked reader, and every later completion is dropped.
func (d *Device) overrun(dc *devCQ) {
	if dc.dead {
		return
	}
	dc.dead = true
	dc.over.Write(1)
	dc.overruns++
	dc.dropped++
	if dc.irq != nil {
		if err := dc.irq.Add(1); err == nil {
			dc.interrupts++
			d.fired = true
		}
	}
}

// driverError stops the CQ when the driver's consumer count is ahead of
// the producer: the ring's state is no longer known, so the device writes
// nothing more (every later completion is dropped), does not report an
// overrun, and counts the error (CQStats.DriverErrors).
func (d *Device) driverError(dc *devCQ) {
	dc.dead = true
	dc.driverErrors++
	dc.dropped++
}

// FaultKind selects an injected fault.
type FaultKind int

// Faults. Those that change or add an entry apply to the next completion
// the device writes on the CQ, one fault per completion, in order.
const (
	// FaultErrorStatus: the next completion carries Status (GENERAL_ERR
	// when zero) and Syndrome.
	FaultErrorStatus FaultKind = iota + 1
	// FaultBadID: an extra entry whose id was never posted precedes the
	// next completion.
	FaultBadID
	// FaultDuplicateID: an extra entry repeating the previous completion's
	// id precedes the next completion.
	FaultDuplicateID
	// FaultBadLen: the next completion reports 4096 bytes more than it
	// transferred (more than posted).
	FaultBadLen
	// FaultBadStatus: the next completion carries an undefined status.
	FaultBadStatus
	// FaultBadOpcode: the next completion carries an undefined opcode.
	FaultBadOpcode
	// FaultWrongPhase: a copy of the next completion is first written with
	// the wrong phase bit.
	FaultWrongPhase
	// FaultOverrun: the CQ overruns now.
	FaultOverrun
	// FaultLostIRQ: the next interrupt is not delivered.
	FaultLostIRQ
	// FaultSpuriousIRQ: an interrupt is raised now with nothing new.
	FaultSpuriousIRQ
	// FaultGarbage: an extra entry of random fields, with the right
	// phase, precedes the next completion.
	FaultGarbage
	// FaultRewriteID: right after handing the next completion over (owner
	// word written) the device rewrites its id to a stale one for about a
	// microsecond, then back: a reader sees either id. The operation
	// completes, or its completion is refused (ProvBadID) and it stays
	// outstanding: lost by the device, never completed twice.
	FaultRewriteID
	// FaultWrongOpcode: the next completion reports the other kind of
	// operation than the one it completes (RECV for a send, SEND for a
	// receive), an opcode the device defines.
	FaultWrongOpcode
)

// String names the fault.
func (k FaultKind) String() string {
	names := [...]string{"", "error-status", "bad-id", "duplicate-id", "bad-len", "bad-status",
		"bad-opcode", "wrong-phase", "overrun", "lost-irq", "spurious-irq", "garbage", "rewrite-id", "wrong-opcode"}
	if k > 0 && int(k) < len(names) {
		return names[k]
	}
	return fmt.Sprintf("FaultKind(%d)", int(k))
}

// Fault is an injected fault.
type Fault struct {
	Kind     FaultKind // what goes wrong
	Status   Status    // FaultErrorStatus
	Syndrome uint32    // FaultErrorStatus
}

// Inject makes the device misbehave on CQ c.
func (d *Device) Inject(c *cq.CQ, f Fault) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	dc, err := d.devCQOf(c)
	if err != nil {
		return err
	}
	switch f.Kind {
	case FaultErrorStatus, FaultBadID, FaultDuplicateID, FaultBadLen, FaultBadStatus, FaultBadOpcode, FaultWrongPhase,
		FaultGarbage, FaultRewriteID, FaultWrongOpcode:
		dc.faults = append(dc.faults, f)
	case FaultOverrun:
		d.overrun(dc)
	case FaultLostIRQ:
		dc.lose++
	case FaultSpuriousIRQ:
		if dc.irq == nil {
			return fmt.Errorf("sim: %v: CQ has no interrupt: %w", f.Kind, cq.ErrNoData)
		}
		return dc.irq.Add(1)
	default:
		return fmt.Errorf("sim: unknown fault %v", f.Kind)
	}
	return nil
}
