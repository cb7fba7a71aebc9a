package vfio

import (
	"errors"
	"fmt"
	"math"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// MappedArea is one mmap'ed piece of a region.
type MappedArea struct {
	Offset uint64 // offset of Bytes[0] within the region
	Bytes  []byte // the shared mapping; invalid after Close
}

// RegionMapping is a region (BAR) mmap'ed MAP_SHARED from the device fd.
// Accesses to its memory are MMIO: use the doorbell package's accessors,
// not plain loads and stores the compiler may merge or reorder.
type RegionMapping struct {
	d    *Device
	info RegionInfo

	mu     sync.Mutex
	areas  []MappedArea
	closed bool
}

// MapRegion mmaps region index (PROT_READ/PROT_WRITE as the region allows,
// MAP_SHARED, at the region's offset in the device fd). A region with a
// sparse-mmap capability is mapped area by area (Areas); otherwise it is
// one mapping (Bytes). A region that is empty, lacks the MMAP flag or has
// no mmap-able area wraps ErrNotMappable. The mapping is released by its
// Close or by Device.Close.
func (d *Device) MapRegion(index int) (*RegionMapping, error) {
	const op = "mmap"
	d.mu.Lock()
	defer d.mu.Unlock()
	ri, err := d.regionInfoLocked(index)
	if err != nil {
		return nil, err
	}
	switch {
	case ri.Size == 0:
		return nil, d.errf(op, fmt.Errorf("region %d is not implemented (size 0): %w", index, ErrNotMappable))
	case ri.Flags&RegionFlagMmap == 0:
		return nil, d.errf(op, fmt.Errorf("region %d (flags %#x) does not support mmap; use ReadRegion/WriteRegion: %w", index, uint32(ri.Flags), ErrNotMappable))
	case ri.Sparse && len(ri.SparseAreas) == 0:
		return nil, d.errf(op, fmt.Errorf("region %d has no mmap-able sparse area: %w", index, ErrNotMappable))
	}
	areas := ri.SparseAreas
	if !ri.Sparse {
		areas = []SparseArea{{Offset: 0, Size: ri.Size}}
	}
	prot := 0
	if ri.Flags&RegionFlagRead != 0 {
		prot |= unix.PROT_READ
	}
	if ri.Flags&RegionFlagWrite != 0 {
		prot |= unix.PROT_WRITE
	}
	page := uint64(os.Getpagesize())
	m := &RegionMapping{d: d, info: ri}
	for _, a := range areas {
		pos := ri.Offset + a.Offset
		if pos%page != 0 {
			m.unmapAll()
			return nil, d.errf(op, fmt.Errorf("region %d area at %#x: device offset %#x not page aligned: %w", index, a.Offset, pos, ErrNotMappable))
		}
		if pos > math.MaxInt64 || a.Size > math.MaxInt {
			m.unmapAll()
			return nil, d.errf(op, fmt.Errorf("region %d area at %#x size %#x cannot be mapped: %w", index, a.Offset, a.Size, ErrOutOfRange))
		}
		b, err := unix.Mmap(d.fd, int64(pos), int(a.Size), prot, unix.MAP_SHARED)
		if err != nil {
			m.unmapAll()
			return nil, d.errf(op, fmt.Errorf("region %d area offset %#x size %#x: %w", index, a.Offset, a.Size, err))
		}
		m.areas = append(m.areas, MappedArea{Offset: a.Offset, Bytes: b})
	}
	d.maps = append(d.maps, m)
	return m, nil
}

// Info is the region info the mapping was made from.
func (m *RegionMapping) Info() RegionInfo { return m.info }

// Bytes is the whole region when it was mapped in one piece; nil for a
// sparse region (use Areas or Slice) or after Close.
func (m *RegionMapping) Bytes() []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || m.info.Sparse || len(m.areas) != 1 {
		return nil
	}
	return m.areas[0].Bytes
}

// Areas lists the mapped pieces (one, at offset 0, for a non-sparse
// region); nil after Close.
func (m *RegionMapping) Areas() []MappedArea {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	return append([]MappedArea(nil), m.areas...)
}

// Slice returns the n bytes at region offset off, which must lie inside
// one mapped area (ErrOutOfRange otherwise).
func (m *RegionMapping) Slice(off, n uint64) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, m.d.errf("region slice", fmt.Errorf("region %d: %w", m.info.Index, ErrClosed))
	}
	for _, a := range m.areas {
		size := uint64(len(a.Bytes))
		if off >= a.Offset && off-a.Offset <= size && n <= size-(off-a.Offset) {
			s := off - a.Offset
			return a.Bytes[s : s+n : s+n], nil
		}
	}
	return nil, m.d.errf("region slice", fmt.Errorf("region %d: %#x bytes at %#x are not inside one mapped area: %w", m.info.Index, n, off, ErrOutOfRange))
}

// unmapAll munmaps every area; errors are joined.
func (m *RegionMapping) unmapAll() error {
	var errs []error
	for _, a := range m.areas {
		if err := unix.Munmap(a.Bytes); err != nil {
			errs = append(errs, m.d.errf("munmap", fmt.Errorf("region %d area %#x: %w", m.info.Index, a.Offset, err)))
		}
	}
	m.areas = nil
	return errors.Join(errs...)
}

// Close unmaps the region. The memory must no longer be accessed.
// Idempotent.
func (m *RegionMapping) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	err := m.unmapAll()
	m.mu.Unlock()
	m.d.forget(m)
	return err
}
