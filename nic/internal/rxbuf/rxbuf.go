// Package rxbuf keeps a receive queue's buffers for the NIC drivers: the
// free list, which buffers are lent to the caller in a completion, and the
// checks on a buffer address the caller hands back (Repost, Release,
// Frame), which every driver makes alike. Which buffers the device holds
// is recorded once, by the ring's table of posted operations (the buffer
// address of each): a buffer neither free nor lent is posted.
package rxbuf

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"unsafe"

	"github.com/vfnic/vfnic/dma"
	"github.com/vfnic/vfnic/nic"
)

// Errors of a buffer address handed back; both match nic.ErrBadBuffer.
var (
	ErrNotLent   = fmt.Errorf("%w: buffer is not lent to the caller", nic.ErrBadBuffer)
	ErrNotBuffer = fmt.Errorf("%w: address is not the start of a frame in this queue's buffers", nic.ErrBadBuffer)
)

// Pool is one queue's receive buffers: a dma.Pool (its methods give the
// bytes, the IOVA and the free list) and which are lent to the caller. The frame
// in buffer b starts Headroom bytes in (virtio-net's header); completions
// report that address. It is not safe for concurrent use: the queue's
// lock guards it.
type Pool struct {
	*dma.Pool
	base   uintptr // address of buffer 0
	stride uintptr
	// recip is ceil(2^64/stride): Of, on every completion's path
	// (lending, Data, a driver's look at its header), multiplies by it
	// and keeps the high word where it would divide (a 64-bit division
	// takes tens of cycles). Exact for offsets below 2^64/stride, which
	// New checks for the whole pool (0: Of divides).
	recip    uint64
	headroom uintptr
	lent     []bool
	mem      []byte // every buffer, for Bytes
}

// New returns the receive buffers of p, with frames headroom bytes into
// each buffer.
func New(p *dma.Pool, headroom int) Pool {
	stride := uint64(p.BufSize())
	var recip uint64
	if hi, _ := bits.Mul64(stride*uint64(p.Cap()), stride); stride > 1 && hi == 0 {
		// The pool's size times the stride below 2^64: every offset x
		// in it has x*(recip*stride-2^64) < 2^64, so floor(x*recip/2^64)
		// is floor(x/stride).
		recip = (1<<64-1)/stride + 1
	}
	first := &p.Buf(0)[0]
	return Pool{Pool: p, base: uintptr(unsafe.Pointer(first)), stride: uintptr(stride), recip: recip,
		headroom: uintptr(headroom), lent: make([]bool, p.Cap()), mem: unsafe.Slice(first, p.Cap()*p.BufSize())}
}

// Start is the address of buffer b, as a posted operation records it.
func (p *Pool) Start(b uint32) uintptr { return p.base + uintptr(b)*p.stride }

// FrameStart is the address of the frame in buffer b, headroom bytes in,
// as a good receive's completion reports it.
func (p *Pool) FrameStart(b uint32) uintptr { return p.Start(b) + p.headroom }

// Of is the buffer at addr, an address inside it that the ring reader
// reported from a posted operation (not from the device).
func (p *Pool) Of(addr uintptr) uint32 {
	if p.recip != 0 {
		hi, _ := bits.Mul64(uint64(addr-p.base), p.recip)
		return uint32(hi)
	}
	return uint32((addr - p.base) / p.stride)
}

// Lend records that buffer b, which the device held, is lent to the
// caller in a completion.
func (p *Pool) Lend(b uint32) { p.lent[b] = true }

// Unlend records that buffer b, lent to the caller, was posted again
// (Repost).
func (p *Pool) Unlend(b uint32) { p.lent[b] = false }

// Recycle returns buffer b, which this queue took from the free list, to
// it: a buffer the device held whose completion lends nothing (refused,
// canceled, flushed), or one lent and released.
func (p *Pool) Recycle(b uint32) {
	p.lent[b] = false
	_ = p.Put(b) // b is in range and not free: Put cannot fail
}

// Lent maps the frame address of a buffer lent to the caller back to the
// buffer.
func (p *Pool) Lent(frame uintptr) (uint32, error) {
	// The buffer frame would be in, by Of's multiplication (no
	// division: this runs for every buffer reposted), then the one
	// offset its frame starts at. Below the pool, off wraps around.
	off := frame - p.headroom - p.base
	if off >= uintptr(len(p.mem)) {
		return 0, ErrNotBuffer
	}
	b := p.Of(p.base + off)
	if uintptr(b)*p.stride != off {
		return 0, ErrNotBuffer
	}
	if !p.lent[b] {
		return 0, ErrNotLent
	}
	return b, nil
}

// Release returns a buffer lent to the caller to the free list.
func (p *Pool) Release(frame uintptr) error {
	b, err := p.Lent(frame)
	if err != nil {
		return err
	}
	p.Recycle(b)
	return nil
}

// Frame returns the first length bytes of the frame lent to the caller at
// frame, at most max.
func (p *Pool) Frame(frame uintptr, length, max int) ([]byte, error) {
	b, err := p.Lent(frame)
	if err != nil {
		return nil, err
	}
	if length < 0 || length > max {
		return nil, fmt.Errorf("%w: %d bytes in a %d-byte frame buffer", nic.ErrInvalid, length, max)
	}
	return p.frame(b, length), nil
}

// Bytes returns the first length bytes of the frame at frame, for a
// completion's Data: frame is a posted buffer's start plus the headroom,
// the address a driver reports for a good receive, and the reader has
// checked length against the posted buffer. The slice's capacity ends
// with the buffer. No division or multiplication: the frame's offset in
// the pool is its address's.
func (p *Pool) Bytes(frame uintptr, length int) []byte {
	off := frame - p.base
	return p.mem[off : off+uintptr(length) : off+p.stride-p.headroom]
}

func (p *Pool) frame(b uint32, length int) []byte {
	h := int(p.headroom)
	return p.Buf(b)[h : h+length]
}

// HeadUint16 returns the little-endian 16-bit word at byte at of the
// headroom of the buffer that starts at addr (virtio-net's header
// fields), a posted buffer's address as the ring reader reported it: one
// load, found by offset like Bytes.
func (p *Pool) HeadUint16(addr, at uintptr) uint16 {
	off := addr - p.base + at
	return binary.LittleEndian.Uint16(p.mem[off : off+2 : off+2])
}

// Counts returns how many buffers are posted to the device (neither free
// nor lent) and lent to the caller, for a queue's accounting checks.
func (p *Pool) Counts() (posted, lent int) {
	for _, l := range p.lent {
		if l {
			lent++
		}
	}
	return p.Cap() - p.Free() - lent, lent
}
