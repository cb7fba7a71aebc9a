// Package rxbuf keeps a receive queue's buffers for the NIC drivers: which
// are free, posted to the device or lent to the caller in a completion,
// and the checks on a buffer address the caller hands back (Repost,
// Release, Frame), which every driver makes alike.
package rxbuf

import (
	"fmt"
	"unsafe"

	"github.com/vfnic/vfnic/dma"
	"github.com/vfnic/vfnic/nic"
)

// Errors of a buffer address handed back; both match nic.ErrBadBuffer.
var (
	ErrNotLent   = fmt.Errorf("%w: buffer is not lent to the caller", nic.ErrBadBuffer)
	ErrNotBuffer = fmt.Errorf("%w: address is not the start of a frame in this queue's buffers", nic.ErrBadBuffer)
)

// Buffer states.
const (
	stFree   = 0
	stPosted = 1 // lent to the device
	stLent   = 2 // lent to the caller in a completion
)

// Pool is one queue's receive buffers: a dma.Pool (its methods give the
// bytes, the IOVA and the free list) and each buffer's state. The frame
// in buffer b starts Headroom bytes in (virtio-net's header); completions
// report that address. It is not safe for concurrent use: the queue's
// lock guards it.
type Pool struct {
	*dma.Pool
	base     uintptr // address of buffer 0
	stride   uintptr
	headroom uintptr
	state    []uint8
}

// New returns the receive buffers of p, with frames headroom bytes into
// each buffer.
func New(p *dma.Pool, headroom int) Pool {
	return Pool{Pool: p, base: uintptr(unsafe.Pointer(&p.Buf(0)[0])), stride: uintptr(p.BufSize()),
		headroom: uintptr(headroom), state: make([]uint8, p.Cap())}
}

// Start is the address of buffer b, as a posted operation records it.
func (p *Pool) Start(b uint32) uintptr { return p.base + uintptr(b)*p.stride }

// Of is the buffer at addr, an address inside it that the ring reader
// reported from a posted operation (not from the device).
func (p *Pool) Of(addr uintptr) uint32 { return uint32((addr - p.base) / p.stride) }

// Posted records that buffer b is lent to the device.
func (p *Pool) Posted(b uint32) { p.state[b] = stPosted }

// Lend records that buffer b is lent to the caller in a completion.
func (p *Pool) Lend(b uint32) { p.state[b] = stLent }

// Recycle returns buffer b, which this queue took from the free list, to
// it.
func (p *Pool) Recycle(b uint32) {
	p.state[b] = stFree
	_ = p.Put(b) // b is in range and not free: Put cannot fail
}

// RecyclePosted returns every buffer still lent to the device to the free
// list and reports how many: a closing queue's, whose operations complete
// as canceled or flushed (which lend the caller nothing), so each posted
// buffer goes back exactly once. Buffers lent to the caller stay lent.
func (p *Pool) RecyclePosted() int {
	n := 0
	for b, s := range p.state {
		if s == stPosted {
			p.Recycle(uint32(b))
			n++
		}
	}
	return n
}

// Lent maps the frame address of a buffer lent to the caller back to the
// buffer.
func (p *Pool) Lent(frame uintptr) (uint32, error) {
	off := frame - p.base - p.headroom
	if frame < p.base+p.headroom || off%p.stride != 0 || off/p.stride >= uintptr(len(p.state)) {
		return 0, ErrNotBuffer
	}
	b := uint32(off / p.stride)
	if p.state[b] != stLent {
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

// Bytes returns the first length bytes of the frame at frame, an address
// the ring reader reported from a posted operation, for a completion's
// Data. The reader has checked length against the posted buffer.
func (p *Pool) Bytes(frame uintptr, length int) []byte { return p.frame(p.Of(frame), length) }

func (p *Pool) frame(b uint32, length int) []byte {
	h := int(p.headroom)
	return p.Buf(b)[h : h+length]
}

// Counts returns how many buffers are posted to the device and lent to
// the caller (the rest are free), for a queue's accounting checks.
func (p *Pool) Counts() (posted, lent int) {
	for _, s := range p.state {
		switch s {
		case stPosted:
			posted++
		case stLent:
			lent++
		}
	}
	return posted, lent
}
