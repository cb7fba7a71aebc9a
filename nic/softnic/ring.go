package softnic

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vfnic/vfnic/cq"
	cqring "github.com/vfnic/vfnic/cq/ring"
	"github.com/vfnic/vfnic/doorbell"
	"github.com/vfnic/vfnic/eventfd"
)

// The completion entry, 16 bytes, little-endian (see the package doc).
const (
	entrySize = 16
	offID     = 0
	offLen    = 4
	offStatus = 8
	offOwner  = 12
	ownerBit  = 1 << 31

	// statusOK completes an operation; statusMore a receive buffer whose
	// frame continues in the next one (a frame longer than a buffer).
	statusOK   = 0
	statusMore = 1
)

// rewriteWindow is how long RingRewriteID leaves the stale id in place:
// long enough for a reader polling on another CPU to see it now and then.
const rewriteWindow = 50 * time.Microsecond

// provMultiBuffer is the provider error number of statusMore entries.
const provMultiBuffer cq.ProvErrno = statusMore

// layout is the completion ring of n entries for cq/ring: NVMe-style
// phase bit, written strictly in order (a hole is a wrong phase), and the
// consumer count published through a doorbell, as mlx5's is.
func layout(n int) cqring.Layout {
	return cqring.Layout{
		Name: "softnic", EntrySize: entrySize, Entries: n, Convention: cqring.PhaseBit,
		OwnerOff: offOwner, OwnerMask: ownerBit, InitPhase: 1, DetectHoles: true,
		Doorbell: cqring.DoorbellCount,
		Fields: cqring.Fields{
			ID:     cqring.Field{Off: offID, Bits: 32},
			Len:    cqring.Field{Off: offLen, Bits: 32},
			Status: cqring.Field{Off: offStatus, Bits: 8},
		},
	}
}

var codes = cqring.Codes{Statuses: []cqring.Status{
	{Value: statusOK, Name: "OK"},
	{Value: statusMore, Err: cq.ETRUNC, Name: "MORE (the frame continues in the next buffer)"},
}}

// RingFault is a fault the device writes into a queue's completion ring
// (Device.InjectRing): each applies to the next completion it writes on
// that queue, one fault per completion, in order.
type RingFault int

// Ring faults.
const (
	// RingBadID: an extra entry whose id was never posted (another
	// generation of the same slot) precedes the next completion.
	RingBadID RingFault = iota + 1
	// RingDuplicateID: an extra entry repeating the previous completion
	// (its id no longer outstanding) precedes the next completion.
	RingDuplicateID
	// RingBadLen: the next completion reports 64 KiB more than the posted
	// buffer holds.
	RingBadLen
	// RingWrongPhase: a copy of the next completion is first written with
	// the previous lap's phase bit: an entry out of phase before a valid
	// one.
	RingWrongPhase
	// RingRewriteID: right after handing the next completion over (owner
	// word written) the device rewrites its id to a stale one for 50 µs,
	// then back: a reader sees either, and must act on the
	// one it read (the operation completes, or stays outstanding after a
	// refused entry; it never completes twice).
	RingRewriteID
)

// String names the fault.
func (f RingFault) String() string {
	names := [...]string{"", "bad-id", "duplicate-id", "bad-len", "wrong-phase", "rewrite-id"}
	if f > 0 && int(f) < len(names) {
		return names[f]
	}
	return fmt.Sprintf("RingFault(%d)", int(f))
}

// devRing is the device side of a queue: the descriptors the driver
// published, and the completion ring the device writes. Everything in it
// is guarded by mu, which the driver side never takes except to arm,
// switch the interrupt target and close.
type devRing struct {
	mu sync.Mutex
	// dead is set when the queue closes: the device writes nothing more
	// into memory about to be unmapped.
	dead bool

	mem   []byte // completion entries, in DMA memory
	win   doorbell.Window
	n     uint32 // completion entries (twice the descriptors: room for fault entries)
	shift uint
	cons  doorbell.Reg32 // consumer count, written by the ring reader
	prod  uint32

	// irq is what the queue's interrupt signals: the queue's eventfd, or
	// the CQ it feeds.
	irq     *eventfd.FD
	armed   bool
	armCI   uint32
	armThr  uint32
	fire    atomic.Bool   // an interrupt to raise once the writer unlocks
	raised  atomic.Uint64 // interrupts raised
	faults  []RingFault
	last    [offOwner]byte // the previous completion, for RingDuplicateID
	hasLast bool
}

// room reports whether an extra entry fits beside the completions every
// posted operation may still need (half the ring).
func (r *devRing) room() bool { return r.prod-r.cons.Read() < r.n/2 }

// complete writes the completion of an operation posted under id, with
// the next pending fault. Called with mu held.
func (r *devRing) complete(id, length uint32, status uint8) {
	var e [offOwner]byte
	le := binary.LittleEndian
	le.PutUint32(e[offID:], id)
	le.PutUint32(e[offLen:], length)
	e[offStatus] = status
	rewrite := false
	if len(r.faults) > 0 && r.room() {
		f := r.faults[0]
		r.faults = r.faults[1:]
		switch f {
		case RingBadID:
			bad := e
			le.PutUint32(bad[offID:], id^0x80000000)
			r.write(&bad, false)
		case RingDuplicateID:
			if r.hasLast {
				dup := r.last
				r.write(&dup, false)
			}
		case RingBadLen:
			le.PutUint32(e[offLen:], length+64<<10)
		case RingWrongPhase:
			r.write(&e, true)
		case RingRewriteID:
			rewrite = true
		}
	}
	r.write(&e, false)
	r.last, r.hasLast = e, true
	if rewrite {
		at := int((r.prod-1)&(r.n-1)) * entrySize
		id32, _ := r.win.Reg32(uintptr(at + offID)) // in range
		id32.Write(id ^ 0x80000000)
		for t := time.Now(); time.Since(t) < rewriteWindow; {
		}
		id32.Write(id)
	}
}

// write puts one entry at the producer position: the fields first, the
// owner word last (a release store), as hardware does. Called with mu
// held.
func (r *devRing) write(e *[offOwner]byte, wrongPhase bool) {
	at := int(r.prod&(r.n-1)) * entrySize
	copy(r.mem[at:at+offOwner], e[:])
	phase := uint32(1) ^ (r.prod>>r.shift)&1
	if wrongPhase {
		phase ^= 1
	}
	owner, _ := r.win.Reg32(uintptr(at + offOwner)) // in range
	owner.Write(phase << 31)
	r.prod++
	if r.armed && r.prod-r.armCI >= r.armThr {
		r.armed = false
		r.fire.Store(true)
	}
}

// arm asks for one interrupt once thr entries beyond the consumer count
// ci are written, counting only entries written from now on: those
// written before raise nothing (the caller polls again after arming).
// False: the interrupt signals nothing (a CQ without an eventfd).
func (r *devRing) arm(ci uint32, thr int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.irq == nil {
		return false
	}
	r.armed, r.armCI, r.armThr = true, ci, uint32(min(max(thr, 1), int(r.n)))
	return true
}

// target points the interrupt at irq (the queue's eventfd, or the CQ's
// it feeds), as an MSI-X vector's routing does; an arm made for the old
// target's reader is dropped.
func (r *devRing) target(irq *eventfd.FD) {
	r.mu.Lock()
	if r.irq != irq {
		r.irq, r.armed = irq, false
	}
	r.mu.Unlock()
}

// kill stops the device side: it writes nothing more into memory about
// to be unmapped, once the write in progress, if any, is done.
func (r *devRing) kill() {
	r.mu.Lock()
	r.dead = true
	r.mu.Unlock()
}

// disarm cancels an arm (a Poll that returned completions).
func (r *devRing) disarm() {
	r.mu.Lock()
	r.armed = false
	r.mu.Unlock()
}

// raise delivers the interrupt the last writes asked for. Called unlocked,
// so that a reader woken on this CPU does not find the ring locked by the
// writer it preempted.
func (r *devRing) raise() bool {
	if !r.fire.Swap(false) {
		return false
	}
	r.mu.Lock()
	irq, dead := r.irq, r.dead
	r.mu.Unlock()
	if dead || irq == nil || irq.Add(1) != nil {
		return false
	}
	r.raised.Add(1)
	return true
}

// newDevRing lays the completion ring of n entries (a power of two) and
// its consumer count register over mem.
func newDevRing(mem, page []byte, n int, irq *eventfd.FD) (*devRing, error) {
	r := &devRing{mem: mem, win: doorbell.NewWindow(mem), n: uint32(n), shift: uint(bits.TrailingZeros(uint(n))), irq: irq}
	var err error
	if r.cons, err = doorbell.NewWindow(page).Reg32(0); err != nil {
		return nil, err
	}
	return r, nil
}
