// Package dma provides memory that a device reads and writes: hugepage memory
// mapped at I/O virtual addresses (IOVAs) allocated from the ranges the IOMMU
// reported, never identity-mapped virtual addresses; rings carved from it with
// their alignment; and fixed-size buffer pools for packets. A Space is one
// device's address space, backed by a Mapper: the VFIO container, or the
// identity mapping the software device uses.
package dma

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"unsafe"

	"github.com/vfnic/vfnic/hugepage"
	"github.com/vfnic/vfnic/vfio"
)

// Mapper installs and removes IOMMU translations. *vfio.Container is one.
type Mapper interface {
	MapDMA(mem []byte, iova uint64) error
	UnmapDMA(iova, size uint64) error
}

// ErrClosed is returned when a closed Space or Region is used. It is
// os.ErrClosed.
var ErrClosed = os.ErrClosed

// ErrNoRoom means a region has no space left for a ring or pool.
var ErrNoRoom = errors.New("dma: region full")

// Space is the DMA address space of one device (or one VFIO container).
type Space struct {
	mapper   Mapper
	iova     *IOVAAllocator // nil for the identity space
	mu       sync.Mutex
	closed   bool
	detached bool // Detach ran: no new region
	regions  map[*Region]struct{}
	identity bool
}

// NewSpace returns a space that maps through m at IOVAs from ranges, none
// below floor.
func NewSpace(m Mapper, ranges []Range, floor uint64) (*Space, error) {
	a, err := NewIOVAAllocator(ranges, floor)
	if err != nil {
		return nil, err
	}
	return &Space{mapper: m, iova: a, regions: map[*Region]struct{}{}}, nil
}

// NewVFIOSpace returns the DMA address space of a VFIO container: IOVAs
// from the ranges its IOMMU reports, none below floor.
func NewVFIOSpace(c *vfio.Container, floor uint64) (*Space, error) {
	rs, err := c.IOVARanges()
	if err != nil {
		return nil, err
	}
	ranges := make([]Range, len(rs))
	for i, r := range rs {
		ranges[i] = Range(r)
	}
	return NewSpace(c, ranges, floor)
}

// Ranges returns the IOVA ranges the space allocates from (nil for the
// identity space, which allocates none).
func (s *Space) Ranges() []Range {
	if s.iova == nil {
		return nil
	}
	return s.iova.Ranges()
}

// NewIdentitySpace returns a space whose IOVA is the virtual address, for a
// device that lives in this process (the software NIC): nothing is mapped.
func NewIdentitySpace() *Space {
	return &Space{identity: true, regions: map[*Region]struct{}{}}
}

// Alloc maps size bytes of pinned memory for the device.
func (s *Space) Alloc(size int, opts hugepage.Options) (*Region, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.detached {
		return nil, ErrClosed
	}
	mem, err := hugepage.Alloc(size, opts)
	if err != nil {
		return nil, err
	}
	r := &Region{space: s, mem: mem, b: mem.Bytes()}
	if s.identity {
		r.iova = uint64(mem.Addr())
	} else {
		page := uint64(mem.PageSize())
		iova, err := s.iova.Alloc(uint64(len(r.b)), page)
		if err != nil {
			_ = mem.Close()
			return nil, err
		}
		if err := s.mapper.MapDMA(r.b, iova); err != nil {
			_ = s.iova.Free(iova, uint64(len(r.b)))
			_ = mem.Close()
			return nil, fmt.Errorf("dma: map %d bytes at IOVA %#x: %w", len(r.b), iova, err)
		}
		r.iova = iova
	}
	s.regions[r] = struct{}{}
	return r, nil
}

// Detach takes every region out of the device's reach (its IOMMU
// mappings go, so that the container can be closed and the device given
// back) but leaves the memory mapped in this process until Close: a
// device the kernel takes back asynchronously must not pull buffers from
// under a goroutine still reading frames it was lent. Alloc fails after
// it.
func (s *Space) Detach() error {
	s.mu.Lock()
	s.detached = true
	regions := make([]*Region, 0, len(s.regions))
	for r := range s.regions {
		regions = append(regions, r)
	}
	s.mu.Unlock()
	var errs []error
	for _, r := range regions {
		errs = append(errs, r.detach())
	}
	return errors.Join(errs...)
}

// Close releases every region still open in the space.
func (s *Space) Close() error {
	s.mu.Lock()
	regions := s.regions
	s.regions = map[*Region]struct{}{}
	s.closed = true
	s.mu.Unlock()
	var errs []error
	for r := range regions {
		errs = append(errs, r.release())
	}
	return errors.Join(errs...)
}

// Region is pinned memory that the device reaches at IOVA().
type Region struct {
	space *Space
	mem   *hugepage.Memory
	b     []byte
	iova  uint64
	next  int // carve cursor
	// detached: the IOMMU mapping is gone (Space.Detach), the memory not.
	detached bool
	mu       sync.Mutex
}

// Bytes returns the region's memory (nil after Close).
func (r *Region) Bytes() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.b
}

// IOVA returns the device address of the first byte.
func (r *Region) IOVA() uint64 { return r.iova }

// Len returns the region size.
func (r *Region) Len() int { return len(r.Bytes()) }

// PageSize returns the page size backing the region.
func (r *Region) PageSize() hugepage.Size { return r.mem.PageSize() }

// Slice is a piece of a region: its bytes and the device address of the first.
type Slice struct {
	Bytes []byte
	IOVA  uint64
}

// Ptr returns the address of the first byte, for lock-free access to
// device-shared words through sync/atomic. It is not a Go heap pointer.
func (s Slice) Ptr() unsafe.Pointer {
	if len(s.Bytes) == 0 {
		return nil
	}
	return unsafe.Pointer(&s.Bytes[0])
}

// Carve takes the next size bytes aligned to align (a power of two) from the
// region, zeroed, for a ring or a buffer area. Carved slices live until the
// region is closed.
func (r *Region) Carve(size, align int) (Slice, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.b == nil {
		return Slice{}, ErrClosed
	}
	if size <= 0 || align <= 0 || align&(align-1) != 0 {
		return Slice{}, fmt.Errorf("%w: carve size %d align %d", ErrBadRange, size, align)
	}
	// Align the device address, not only the offset: both coincide because
	// regions start page-aligned, but say what the device needs.
	off := int((r.iova+uint64(r.next)+uint64(align)-1)&^uint64(align-1) - r.iova)
	if off > len(r.b) || len(r.b)-off < size {
		return Slice{}, fmt.Errorf("%w: %d bytes aligned to %d, %d of %d used", ErrNoRoom, size, align, r.next, len(r.b))
	}
	r.next = off + size
	b := r.b[off : off+size : off+size]
	clear(b)
	return Slice{Bytes: b, IOVA: r.iova + uint64(off)}, nil
}

// Close unmaps the region from the device and frees its memory.
func (r *Region) Close() error {
	r.space.mu.Lock()
	_, open := r.space.regions[r]
	delete(r.space.regions, r)
	r.space.mu.Unlock()
	if !open {
		return nil
	}
	return r.release()
}

func (r *Region) release() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.b == nil {
		return nil
	}
	// Unmap before the memory goes back to the kernel: the device must
	// never be able to write into pages that are reused.
	errs := []error{r.unmapLocked()}
	errs = append(errs, r.mem.Close())
	r.b = nil
	return errors.Join(errs...)
}

// detach removes the region's IOMMU mapping and keeps its memory.
func (r *Region) detach() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.b == nil {
		return nil
	}
	return r.unmapLocked()
}

// unmapLocked removes the IOMMU mapping once (none in the identity space).
func (r *Region) unmapLocked() error {
	if r.space.identity || r.detached {
		return nil
	}
	r.detached = true
	n := uint64(len(r.b))
	if err := r.space.mapper.UnmapDMA(r.iova, n); err != nil {
		return fmt.Errorf("dma: unmap IOVA %#x: %w", r.iova, err)
	}
	return r.space.iova.Free(r.iova, n)
}
