package vfio

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"strings"
)

// ne decodes kernel structures, which are in host byte order.
var ne = binary.NativeEndian

// maxInfoSize bounds the buffer an INFO ioctl may ask for, so a confused
// or hostile argsz cannot make us allocate without limit.
const maxInfoSize = 1 << 20

// maxInfoCalls bounds the two-call dance: the chain may grow between calls
// (a group added concurrently), but not forever.
const maxInfoCalls = 4

// fetchInfo runs an INFO ioctl whose result may carry a capability chain.
// The kernel answers a buffer that is too small with the fixed part filled,
// the CAPS flag set, cap_offset 0 and argsz raised to the size needed; the
// call is then repeated with a buffer of that size. prep fills the input
// fields after argsz (an index); call issues the ioctl.
func fetchInfo(fixed int, prep func(buf []byte), call func(buf []byte) error) ([]byte, error) {
	size := fixed
	for range maxInfoCalls {
		buf := make([]byte, size)
		ne.PutUint32(buf[0:], uint32(size))
		if prep != nil {
			prep(buf)
		}
		if err := call(buf); err != nil {
			return nil, err
		}
		need := int(ne.Uint32(buf[0:]))
		if need <= size {
			return buf, nil
		}
		if need > maxInfoSize {
			return nil, fmt.Errorf("kernel asks for a %d-byte info buffer (limit %d): %w", need, maxInfoSize, ErrBadInfo)
		}
		size = need
	}
	return nil, fmt.Errorf("capability chain still growing after %d calls: %w", maxInfoCalls, ErrBadInfo)
}

// infoBounds validates the argsz of an info buffer and returns how many
// bytes of it are meaningful. An argsz larger than the buffer means the
// capability chain did not fit.
func infoBounds(buf []byte, fixed int) (int, error) {
	if len(buf) < fixed {
		return 0, fmt.Errorf("info is %d bytes, shorter than its %d-byte fixed part: %w", len(buf), fixed, ErrBadInfo)
	}
	argsz := uint64(ne.Uint32(buf[0:]))
	if argsz < uint64(fixed) {
		return 0, fmt.Errorf("info argsz %d is smaller than its %d-byte fixed part: %w", argsz, fixed, ErrBadInfo)
	}
	if argsz > uint64(len(buf)) {
		return 0, fmt.Errorf("info truncated: argsz %d but only %d bytes present: %w", argsz, len(buf), ErrBadInfo)
	}
	return int(argsz), nil
}

// walkCaps visits the capability chain of an info buffer starting at
// offset first. Offsets are relative to the start of buf; a capability must
// lie after the fixed part and its 8-byte header inside buf. A chain that
// revisits an offset is a cycle. fn receives the capability's offset and
// parses its payload with its own bounds checks.
func walkCaps(buf []byte, fixed int, first uint32, fn func(id, version uint16, off int) error) error {
	seen := make(map[uint32]bool)
	for off := first; off != 0; {
		if seen[off] {
			return fmt.Errorf("capability chain has a cycle at offset %d: %w", off, ErrBadInfo)
		}
		seen[off] = true
		if uint64(off) < uint64(fixed) {
			return fmt.Errorf("capability offset %d inside the %d-byte fixed part: %w", off, fixed, ErrBadInfo)
		}
		if uint64(off)+sizeofCapHeader > uint64(len(buf)) {
			return fmt.Errorf("capability offset %d beyond the %d-byte info: %w", off, len(buf), ErrBadInfo)
		}
		o := int(off)
		id, ver, next := ne.Uint16(buf[o:]), ne.Uint16(buf[o+2:]), ne.Uint32(buf[o+4:])
		if err := fn(id, ver, o); err != nil {
			return err
		}
		off = next
	}
	return nil
}

// capArray checks that a capability at off with a hdr-byte head followed
// by n entries of size elem fits inside buf, without overflow.
func capArray(buf []byte, off, hdr int, n uint32, elem int, what string) error {
	end := uint64(off) + uint64(hdr) + uint64(n)*uint64(elem)
	if end > uint64(len(buf)) {
		return fmt.Errorf("%s capability at offset %d with %d entries needs %d bytes, info has %d: %w",
			what, off, n, end, len(buf), ErrBadInfo)
	}
	return nil
}

// IOVARange is a range of IO virtual addresses the IOMMU can map; End is
// inclusive, as in struct vfio_iova_range. The dma package converts it with
// a struct conversion: keep exactly these two fields in this order.
type IOVARange struct {
	Start, End uint64
}

// String formats the range as "0xstart-0xend".
func (r IOVARange) String() string { return fmt.Sprintf("%#x-%#x", r.Start, r.End) }

// formatRanges prints ranges for error messages.
func formatRanges(rs []IOVARange) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = r.String()
	}
	return "[" + strings.Join(s, " ") + "]"
}

// IOMMUInfo is what VFIO_IOMMU_GET_INFO reports for a type1 container.
type IOMMUInfo struct {
	Flags IOMMUFlags
	// PageSizes is the bitmap of supported IOMMU page sizes (bit n set:
	// pages of 2^n bytes); valid when Flags has IOMMUFlagPageSizes.
	PageSizes uint64
	// IOVARanges are the usable IOVA ranges (End inclusive), in kernel
	// order; nil when the kernel does not report them (before Linux 5.4).
	IOVARanges []IOVARange
	// DMAAvail is how many more DMA mappings the container accepts;
	// valid when HasDMAAvail.
	DMAAvail    uint32
	HasDMAAvail bool
}

// MinPageSize is the smallest IOMMU page size: the unit of alignment for
// MAP_DMA addresses and sizes. 0 when no page size is reported.
func (i IOMMUInfo) MinPageSize() uint64 {
	if i.Flags&IOMMUFlagPageSizes == 0 || i.PageSizes == 0 {
		return 0
	}
	return 1 << bits.TrailingZeros64(i.PageSizes)
}

// parseIOMMUInfo decodes a struct vfio_iommu_type1_info and its capability
// chain: IOVA ranges and DMA-avail are decoded, migration and unknown
// capabilities are skipped.
func parseIOMMUInfo(buf []byte) (IOMMUInfo, error) {
	n, err := infoBounds(buf, sizeofIOMMUInfo)
	if err != nil {
		return IOMMUInfo{}, err
	}
	buf = buf[:n]
	info := IOMMUInfo{
		Flags:     IOMMUFlags(ne.Uint32(buf[4:])),
		PageSizes: ne.Uint64(buf[8:]),
	}
	capOff := ne.Uint32(buf[16:])
	if info.Flags&IOMMUFlagCaps == 0 || capOff == 0 {
		return info, nil
	}
	sawRanges := false
	err = walkCaps(buf, sizeofIOMMUInfo, capOff, func(id, _ uint16, off int) error {
		switch id {
		case iommuCapIOVARange:
			if sawRanges {
				return fmt.Errorf("second IOVA range capability at offset %d: %w", off, ErrBadInfo)
			}
			sawRanges = true
			if err := capArray(buf, off, sizeofIOVARangeCap, 0, 0, "IOVA range"); err != nil {
				return err
			}
			nr := ne.Uint32(buf[off+8:])
			if err := capArray(buf, off, sizeofIOVARangeCap, nr, sizeofIOVARange, "IOVA range"); err != nil {
				return err
			}
			info.IOVARanges = make([]IOVARange, nr)
			for i := range info.IOVARanges {
				p := off + sizeofIOVARangeCap + i*sizeofIOVARange
				r := IOVARange{Start: ne.Uint64(buf[p:]), End: ne.Uint64(buf[p+8:])}
				if r.Start > r.End {
					return fmt.Errorf("IOVA range %d starts after it ends (%s): %w", i, r, ErrBadInfo)
				}
				info.IOVARanges[i] = r
			}
		case iommuCapDMAAvail:
			if err := capArray(buf, off, sizeofDMAAvailCap, 0, 0, "DMA avail"); err != nil {
				return err
			}
			info.DMAAvail = ne.Uint32(buf[off+8:])
			info.HasDMAAvail = true
		case iommuCapMigration:
			// Dirty-page tracking for live migration: not used here.
		}
		return nil
	})
	if err != nil {
		return IOMMUInfo{}, err
	}
	return info, nil
}

// SparseArea is one mmap-able piece of a region, relative to the region start.
type SparseArea struct {
	Offset, Size uint64
}

// RegionInfo is what VFIO_DEVICE_GET_REGION_INFO reports for one region.
type RegionInfo struct {
	Index  int
	Flags  RegionFlags
	Size   uint64 // bytes; 0 for an unimplemented region (absent BAR)
	Offset uint64 // offset of the region within the device fd (for pread/pwrite/mmap)
	// Sparse is set when the kernel restricts mmap to SparseAreas (which
	// may then be empty: nothing is mmap-able).
	Sparse      bool
	SparseAreas []SparseArea
	// MSIXMappable: the region holds the MSI-X table and it may be mmap'ed anyway.
	MSIXMappable bool
	// Type and Subtype come from a VFIO_REGION_INFO_CAP_TYPE capability
	// (device-specific regions); valid when HasType.
	Type, Subtype uint32
	HasType       bool
}

// Mappable reports whether the region (or some area of it) can be mmap'ed.
func (r RegionInfo) Mappable() bool {
	return r.Flags&RegionFlagMmap != 0 && r.Size != 0 && (!r.Sparse || len(r.SparseAreas) > 0)
}

// parseRegionInfo decodes a struct vfio_region_info and its capability
// chain: sparse mmap areas, MSI-X mappable and region type are decoded,
// unknown capabilities are skipped.
func parseRegionInfo(buf []byte) (RegionInfo, error) {
	n, err := infoBounds(buf, sizeofRegionInfo)
	if err != nil {
		return RegionInfo{}, err
	}
	buf = buf[:n]
	info := RegionInfo{
		Flags:  RegionFlags(ne.Uint32(buf[4:])),
		Index:  int(ne.Uint32(buf[8:])),
		Size:   ne.Uint64(buf[16:]),
		Offset: ne.Uint64(buf[24:]),
	}
	if info.Size != 0 && info.Offset+info.Size-1 < info.Offset {
		return RegionInfo{}, fmt.Errorf("region %d offset %#x size %#x wraps: %w", info.Index, info.Offset, info.Size, ErrBadInfo)
	}
	capOff := ne.Uint32(buf[12:])
	if info.Flags&RegionFlagCaps == 0 || capOff == 0 {
		return info, nil
	}
	err = walkCaps(buf, sizeofRegionInfo, capOff, func(id, _ uint16, off int) error {
		switch id {
		case regionCapSparseMmap:
			if info.Sparse {
				return fmt.Errorf("second sparse mmap capability at offset %d: %w", off, ErrBadInfo)
			}
			if err := capArray(buf, off, sizeofSparseCap, 0, 0, "sparse mmap"); err != nil {
				return err
			}
			nr := ne.Uint32(buf[off+8:])
			if err := capArray(buf, off, sizeofSparseCap, nr, sizeofSparseArea, "sparse mmap"); err != nil {
				return err
			}
			info.Sparse = true
			info.SparseAreas = make([]SparseArea, 0, nr)
			for i := range int(nr) {
				p := off + sizeofSparseCap + i*sizeofSparseArea
				a := SparseArea{Offset: ne.Uint64(buf[p:]), Size: ne.Uint64(buf[p+8:])}
				if a.Size == 0 {
					continue // an empty area maps nothing
				}
				if a.Offset > info.Size || a.Size > info.Size-a.Offset {
					return fmt.Errorf("sparse area %d (offset %#x size %#x) outside region %d of %#x bytes: %w",
						i, a.Offset, a.Size, info.Index, info.Size, ErrBadInfo)
				}
				info.SparseAreas = append(info.SparseAreas, a)
			}
		case regionCapType:
			if err := capArray(buf, off, sizeofTypeCap, 0, 0, "region type"); err != nil {
				return err
			}
			info.Type, info.Subtype, info.HasType = ne.Uint32(buf[off+8:]), ne.Uint32(buf[off+12:]), true
		case regionCapMSIXMappable:
			info.MSIXMappable = true
		}
		return nil
	})
	if err != nil {
		return RegionInfo{}, err
	}
	return info, nil
}

// CheckIOVA reports whether [iova, iova+size) lies inside one of ranges
// (End inclusive); the error wraps ErrOutOfRange and names the request and
// the ranges. A nil ranges slice means "unknown" and accepts everything
// that does not wrap around; an empty non-nil slice accepts nothing.
func CheckIOVA(ranges []IOVARange, iova, size uint64) error {
	if err := checkIOVA(ranges, iova, size); err != nil {
		return fmt.Errorf("vfio: %w", err)
	}
	return nil
}

// checkIOVA is CheckIOVA without the package prefix, for callers that
// add their own context.
func checkIOVA(ranges []IOVARange, iova, size uint64) error {
	if size == 0 {
		return fmt.Errorf("iova %#x size 0: empty range: %w", iova, ErrInvalid)
	}
	last := iova + size - 1
	if last < iova {
		return fmt.Errorf("iova %#x size %#x wraps past 2^64: %w", iova, size, ErrOutOfRange)
	}
	if ranges == nil {
		return nil
	}
	for _, r := range ranges {
		if iova >= r.Start && last <= r.End {
			return nil
		}
	}
	return fmt.Errorf("iova %#x size %#x (last byte %#x) not inside one usable IOVA range %s: %w",
		iova, size, last, formatRanges(ranges), ErrOutOfRange)
}

// checkDMA validates a MAP_DMA/UNMAP_DMA request before any ioctl:
// alignment of vaddr (when mapping), iova and size to the IOMMU page size,
// then the IOVA ranges.
func checkDMA(ranges []IOVARange, pageSize uint64, vaddr, iova, size uint64) error {
	if size == 0 {
		return fmt.Errorf("iova %#x size 0: empty range: %w", iova, ErrInvalid)
	}
	if pageSize != 0 && pageSize&(pageSize-1) == 0 {
		mask := pageSize - 1
		switch {
		case vaddr&mask != 0:
			return fmt.Errorf("address %#x not a multiple of the IOMMU page size %#x: %w", vaddr, pageSize, ErrUnaligned)
		case iova&mask != 0:
			return fmt.Errorf("iova %#x not a multiple of the IOMMU page size %#x: %w", iova, pageSize, ErrUnaligned)
		case size&mask != 0:
			return fmt.Errorf("size %#x not a multiple of the IOMMU page size %#x: %w", size, pageSize, ErrUnaligned)
		}
	}
	return checkIOVA(ranges, iova, size)
}
