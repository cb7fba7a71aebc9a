package vfio

import (
	"errors"
	"testing"
)

// The parsers take bytes the kernel wrote; whatever they are, parsing must
// end with a result or an ErrBadInfo error, never a panic or a hang.

func FuzzParseIOMMUInfo(f *testing.F) {
	f.Add(iommuInfoFix(0x40201000, migrationCap(), dmaAvailCap(65000), iovaCap(holeyRanges...)))
	f.Add(iommuInfoFix(0x1000))
	f.Add(iommuInfoFix(0x1000, iovaCap()))
	cyc := iommuInfoFix(0x1000, dmaAvailCap(1))
	ne.PutUint32(cyc[sizeofIOMMUInfo+4:], uint32(sizeofIOMMUInfo))
	f.Add(cyc)
	f.Fuzz(func(t *testing.T, buf []byte) {
		info, err := parseIOMMUInfo(buf)
		if err != nil {
			if !errors.Is(err, ErrBadInfo) {
				t.Fatalf("error without ErrBadInfo: %v", err)
			}
			return
		}
		for _, r := range info.IOVARanges {
			if r.Start > r.End {
				t.Fatalf("accepted inverted range %v", r)
			}
		}
		if uint64(len(info.IOVARanges))*sizeofIOVARange > uint64(len(buf)) {
			t.Fatalf("%d ranges from %d bytes", len(info.IOVARanges), len(buf))
		}
		if p := info.MinPageSize(); p != 0 && p&(p-1) != 0 {
			t.Fatalf("page size %#x not a power of two", p)
		}
	})
}

func FuzzParseRegionInfo(f *testing.F) {
	f.Add(regionInfoFix(2, RegionFlagRead|RegionFlagWrite|RegionFlagMmap, 0x4000, 2<<40,
		sparseCap(SparseArea{0, 0x2000}, SparseArea{0x3000, 0x1000}), typeCap(1, 2), msixMappableCap()))
	f.Add(regionInfoFix(7, RegionFlagRead, 256, 7<<40))
	f.Add(regionInfoFix(0, RegionFlagMmap, 0x1000, 0, sparseCap()))
	f.Fuzz(func(t *testing.T, buf []byte) {
		ri, err := parseRegionInfo(buf)
		if err != nil {
			if !errors.Is(err, ErrBadInfo) {
				t.Fatalf("error without ErrBadInfo: %v", err)
			}
			return
		}
		for _, a := range ri.SparseAreas {
			if a.Size == 0 || a.Offset > ri.Size || a.Size > ri.Size-a.Offset {
				t.Fatalf("accepted area %+v in region of %#x", a, ri.Size)
			}
		}
	})
}

func FuzzCheckIOVA(f *testing.F) {
	f.Add(uint64(0xfedff000), uint64(0x2000), uint64(0xfedfffff), uint64(0xfef00000))
	f.Add(uint64(0), uint64(1), uint64(0), uint64(1))
	f.Fuzz(func(t *testing.T, iova, size, holeStart, holeEnd uint64) {
		rs := []IOVARange{{0, holeStart}, {holeEnd, ^uint64(0)}}
		if err := CheckIOVA(rs, iova, size); err == nil {
			last := iova + size - 1
			if size == 0 || last < iova {
				t.Fatalf("accepted empty or wrapping iova %#x size %#x", iova, size)
			}
			if !(last <= rs[0].End) && !(iova >= rs[1].Start) {
				t.Fatalf("accepted iova %#x size %#x outside %v", iova, size, rs)
			}
		} else if !errors.Is(err, ErrOutOfRange) && !errors.Is(err, ErrInvalid) {
			t.Fatalf("unexpected error %v", err)
		}
	})
}
