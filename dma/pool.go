package dma

import (
	"errors"
	"fmt"
	"math"
)

// ErrBadBuffer means a buffer index or address is not one the pool handed
// out, or a buffer was returned twice.
var ErrBadBuffer = errors.New("dma: bad buffer")

// Pool is a set of fixed-size packet buffers in device memory with
// constant-time Get and Put and no allocation. Buffers are named by index;
// the device sees Addr(i). A Pool belongs to one queue and is not safe for
// concurrent use.
type Pool struct {
	mem     Slice
	size    uint32
	count   uint32
	free    []uint32 // stack of free indexes (a queue from head when fifo)
	head    int
	fifo    bool
	out     []uint64 // bitmap of buffers handed out, to catch double Put
	iovaEnd uint64
}

// NewPool carves count buffers of size bytes (rounded up to 64 for cache
// lines) from r.
func NewPool(r *Region, count, size int) (*Pool, error) {
	if r == nil {
		return nil, fmt.Errorf("%w: pool in a nil region", ErrBadRange)
	}
	if count <= 0 || size <= 0 || count > 1<<24 || size > 1<<24 {
		return nil, fmt.Errorf("%w: pool of %d x %d bytes", ErrBadRange, count, size)
	}
	size = (size + 63) &^ 63
	if uint64(count)*uint64(size) > math.MaxInt { // only where int has 32 bits
		return nil, fmt.Errorf("%w: pool of %d x %d bytes exceeds the address space", ErrBadRange, count, size)
	}
	mem, err := r.Carve(count*size, 64)
	if err != nil {
		return nil, err
	}
	return newPool(mem, count, size), nil
}

// NewPoolOver makes a pool of count buffers of size bytes (a multiple of
// 64) over mem, memory the caller mapped that no device reaches through
// an IOVA (a packet socket's ring, whose slots are the buffers): Addr is
// a buffer's offset in mem. Get hands buffers out in index order first,
// then in the order Put returned them, as a ring that the device fills in
// order wants them back.
func NewPoolOver(mem []byte, count, size int) (*Pool, error) {
	if count <= 0 || size <= 0 || size%64 != 0 || count > 1<<24 || size > 1<<24 || len(mem)/size < count {
		return nil, fmt.Errorf("%w: pool of %d x %d bytes over %d", ErrBadRange, count, size, len(mem))
	}
	p := newPool(Slice{Bytes: mem[:count*size]}, count, size)
	p.fifo = true
	for i := range p.free {
		p.free[i] = uint32(i)
	}
	return p, nil
}

func newPool(mem Slice, count, size int) *Pool {
	p := &Pool{mem: mem, size: uint32(size), count: uint32(count),
		free: make([]uint32, count), out: make([]uint64, (count+63)/64)}
	for i := range p.free {
		p.free[i] = uint32(count - 1 - i) // index 0 comes out first
	}
	p.iovaEnd = mem.IOVA + uint64(count*size)
	return p
}

// Get takes a free buffer; ok is false when all are in use.
func (p *Pool) Get() (idx uint32, ok bool) {
	n := len(p.free)
	switch {
	case n == p.head:
		return 0, false
	case p.fifo:
		idx = p.free[p.head]
		p.head++
	default:
		idx = p.free[n-1]
		p.free = p.free[:n-1]
	}
	p.out[idx/64] |= 1 << (idx % 64)
	return idx, true
}

// Put returns a buffer. A bad index or a double Put is refused, not absorbed.
func (p *Pool) Put(idx uint32) error {
	if idx >= p.count {
		return fmt.Errorf("%w: index %d of %d", ErrBadBuffer, idx, p.count)
	}
	bit := uint64(1) << (idx % 64)
	if p.out[idx/64]&bit == 0 {
		return fmt.Errorf("%w: buffer %d returned twice", ErrBadBuffer, idx)
	}
	p.out[idx/64] &^= bit
	if p.head > 0 && len(p.free) == cap(p.free) {
		p.free = p.free[:copy(p.free, p.free[p.head:])] // the queue moves to the front, allocating nothing
		p.head = 0
	}
	p.free = append(p.free, idx)
	return nil
}

// InUse reports whether buffer idx is handed out.
func (p *Pool) InUse(idx uint32) bool {
	return idx < p.count && p.out[idx/64]&(1<<(idx%64)) != 0
}

// Buf returns buffer idx's bytes (nil for a bad index).
func (p *Pool) Buf(idx uint32) []byte {
	if idx >= p.count {
		return nil
	}
	// In uint, not uint32: pools can pass 4 GiB (NewPool bounds the
	// product by MaxInt).
	off := uint(idx) * uint(p.size)
	end := off + uint(p.size)
	return p.mem.Bytes[off:end:end]
}

// Addr returns the device address of buffer idx.
func (p *Pool) Addr(idx uint32) uint64 { return p.mem.IOVA + uint64(idx)*uint64(p.size) }

// Index maps a device address back to the buffer that holds it, refusing
// addresses the device may have invented.
func (p *Pool) Index(iova uint64) (uint32, error) {
	if iova < p.mem.IOVA || iova >= p.iovaEnd {
		return 0, fmt.Errorf("%w: address %#x outside the pool", ErrBadBuffer, iova)
	}
	return uint32((iova - p.mem.IOVA) / uint64(p.size)), nil
}

// BufSize returns the size of each buffer.
func (p *Pool) BufSize() int { return int(p.size) }

// Cap returns the number of buffers.
func (p *Pool) Cap() int { return int(p.count) }

// Free returns the number of buffers not in use.
func (p *Pool) Free() int { return len(p.free) - p.head }
