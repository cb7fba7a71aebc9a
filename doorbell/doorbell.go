// Package doorbell gives ordered access to device registers (MMIO) and the
// doorbell helpers built on them: a register written once per batch, and the
// event-index test that tells whether the device asked to be notified.
//
// Register loads and stores are single machine instructions in assembly on
// amd64 (atomics elsewhere): the compiler cannot merge, split, hoist or drop
// them, and a locked instruction is never sent to uncached device memory.
// Offsets are checked once, when a register handle is made, so the accesses
// themselves carry no bounds checks and cannot fault on a bad offset.
package doorbell

import (
	"errors"
	"fmt"
	"unsafe"
)

// ErrRange means a register lies outside the window or is misaligned.
var ErrRange = errors.New("doorbell: register outside window or misaligned")

// Window is a mapped register area, such as a BAR mapping from VFIO or a
// page of ordinary memory standing in for one in the software device.
type Window struct {
	base unsafe.Pointer
	size uintptr
}

// NewWindow wraps mem, which must be memory outside the Go heap (an mmap) and
// must stay mapped while the Window and its registers are used.
func NewWindow(mem []byte) Window {
	if len(mem) == 0 {
		return Window{}
	}
	return Window{base: unsafe.Pointer(&mem[0]), size: uintptr(len(mem))}
}

// Size returns the window length in bytes.
func (w Window) Size() int { return int(w.size) }

func (w Window) ptr(off, width uintptr) (unsafe.Pointer, error) {
	if w.base == nil || off%width != 0 || off > w.size || w.size-off < width {
		return nil, fmt.Errorf("%w: offset %#x width %d in window of %#x", ErrRange, off, width, w.size)
	}
	return unsafe.Add(w.base, off), nil
}

// Reg8 is an 8-bit register.
type Reg8 struct{ p unsafe.Pointer }

// Reg16 is a 16-bit register.
type Reg16 struct{ p unsafe.Pointer }

// Reg32 is a 32-bit register.
type Reg32 struct{ p unsafe.Pointer }

// Reg64 is a 64-bit register.
type Reg64 struct{ p unsafe.Pointer }

// Reg8 returns the 8-bit register at off.
func (w Window) Reg8(off uintptr) (Reg8, error) { p, err := w.ptr(off, 1); return Reg8{p}, err }

// Reg16 returns the 16-bit register at off (2-byte aligned).
func (w Window) Reg16(off uintptr) (Reg16, error) { p, err := w.ptr(off, 2); return Reg16{p}, err }

// Reg32 returns the 32-bit register at off (4-byte aligned).
func (w Window) Reg32(off uintptr) (Reg32, error) { p, err := w.ptr(off, 4); return Reg32{p}, err }

// Reg64 returns the 64-bit register at off (8-byte aligned).
func (w Window) Reg64(off uintptr) (Reg64, error) { p, err := w.ptr(off, 8); return Reg64{p}, err }

// Read8 reads an 8-bit register at off, for one-off accesses outside a hot path.
func (w Window) Read8(off uintptr) (uint8, error) {
	r, err := w.Reg8(off)
	if err != nil {
		return 0, err
	}
	return r.Read(), nil
}

// Read16 reads a 16-bit register at off.
func (w Window) Read16(off uintptr) (uint16, error) {
	r, err := w.Reg16(off)
	if err != nil {
		return 0, err
	}
	return r.Read(), nil
}

// Read32 reads a 32-bit register at off.
func (w Window) Read32(off uintptr) (uint32, error) {
	r, err := w.Reg32(off)
	if err != nil {
		return 0, err
	}
	return r.Read(), nil
}

// Read64 reads a 64-bit register at off.
func (w Window) Read64(off uintptr) (uint64, error) {
	r, err := w.Reg64(off)
	if err != nil {
		return 0, err
	}
	return r.Read(), nil
}

// Write8 writes an 8-bit register at off.
func (w Window) Write8(off uintptr, v uint8) error {
	r, err := w.Reg8(off)
	if err == nil {
		r.Write(v)
	}
	return err
}

// Write16 writes a 16-bit register at off.
func (w Window) Write16(off uintptr, v uint16) error {
	r, err := w.Reg16(off)
	if err == nil {
		r.Write(v)
	}
	return err
}

// Write32 writes a 32-bit register at off.
func (w Window) Write32(off uintptr, v uint32) error {
	r, err := w.Reg32(off)
	if err == nil {
		r.Write(v)
	}
	return err
}

// Write64 writes a 64-bit register at off.
func (w Window) Write64(off uintptr, v uint64) error {
	r, err := w.Reg64(off)
	if err == nil {
		r.Write(v)
	}
	return err
}

// Valid reports whether the register was made from a window.
func (r Reg32) Valid() bool { return r.p != nil }

// Read loads the register once.
func (r Reg8) Read() uint8 { return load8(r.p) }

// Write stores v once.
func (r Reg8) Write(v uint8) { store8(r.p, v) }

// Read loads the register once.
func (r Reg16) Read() uint16 { return load16(r.p) }

// Write stores v once.
func (r Reg16) Write(v uint16) { store16(r.p, v) }

// Read loads the register once.
func (r Reg32) Read() uint32 { return load32(r.p) }

// Write stores v once.
func (r Reg32) Write(v uint32) { store32(r.p, v) }

// Read loads the register once.
func (r Reg64) Read() uint64 { return load64(r.p) }

// Write stores v once.
func (r Reg64) Write(v uint64) { store64(r.p, v) }

// Doorbell is a 32-bit register that tells the device a new producer or
// consumer index, written at most once per batch and skipped when the
// value has not moved. Make one with NewDoorbell.
type Doorbell struct {
	reg   Reg32
	last  uint64 // the last value written, or noValue
	rings uint64
}

// noValue is a Doorbell's last value before its first write: no uint32
// equals it, so one comparison tells a repeated value.
const noValue = 1 << 32

// NewDoorbell wraps a register.
func NewDoorbell(r Reg32) *Doorbell { return &Doorbell{reg: r, last: noValue} }

// Ring publishes v: a store fence orders the descriptor or index writes
// before it, then the register is written. A repeated value is not written.
func (d *Doorbell) Ring(v uint32) {
	if uint64(v) == d.last {
		return
	}
	wmbStore32(d.reg.p, v) // Wmb and Write, in one call
	d.last = uint64(v)
	d.rings++
}

// Force writes v even when it equals the last value written.
func (d *Doorbell) Force(v uint32) {
	d.last = noValue
	d.Ring(v)
}

// Rings returns how many times the register was written.
func (d *Doorbell) Rings() uint64 { return d.rings }

// NeedEvent reports whether moving an index from old to new crosses the
// event index the other side published, i.e. whether it asked to be told
// (the virtio EVENT_IDX rule, in 16-bit wrapping arithmetic).
func NeedEvent(event, new, old uint16) bool {
	return new-event-1 < new-old
}
