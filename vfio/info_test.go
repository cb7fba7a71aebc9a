package vfio

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestParseIOMMUInfoRangesWithHoles(t *testing.T) {
	buf := iommuInfoFix(0x40201000, migrationCap(), dmaAvailCap(65000), iovaCap(holeyRanges...))
	info, err := parseIOMMUInfo(buf)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(info.IOVARanges, holeyRanges) {
		t.Errorf("ranges %v, want %v", info.IOVARanges, holeyRanges)
	}
	if !info.HasDMAAvail || info.DMAAvail != 65000 {
		t.Errorf("dma avail %v %d", info.HasDMAAvail, info.DMAAvail)
	}
	if info.PageSizes != 0x40201000 || info.MinPageSize() != 0x1000 {
		t.Errorf("page sizes %#x min %#x", info.PageSizes, info.MinPageSize())
	}
	if info.Flags != IOMMUFlagPageSizes|IOMMUFlagCaps {
		t.Errorf("flags %#x", info.Flags)
	}
}

func TestParseIOMMUInfoNoCaps(t *testing.T) {
	info, err := parseIOMMUInfo(iommuInfoFix(0x1000))
	if err != nil {
		t.Fatal(err)
	}
	if info.IOVARanges != nil || info.HasDMAAvail {
		t.Errorf("caps decoded from a chain-less info: %+v", info)
	}
	// CAPS flag with cap_offset 0: the chain did not fit; nothing to walk.
	buf := iommuInfoFix(0x1000)
	ne.PutUint32(buf[4:], uint32(IOMMUFlagPageSizes|IOMMUFlagCaps))
	if _, err := parseIOMMUInfo(buf); err != nil {
		t.Fatal(err)
	}
	if (IOMMUInfo{}).MinPageSize() != 0 {
		t.Error("MinPageSize without PGSIZES flag should be 0")
	}
}

func TestParseRegionInfoSparseAndMSIX(t *testing.T) {
	areas := []SparseArea{{0, 0x2000}, {0x3000, 0x1000}}
	buf := regionInfoFix(2, RegionFlagRead|RegionFlagWrite|RegionFlagMmap, 0x4000, 2<<40,
		sparseCap(areas...), typeCap(0x80008086, 1), msixMappableCap())
	ri, err := parseRegionInfo(buf)
	if err != nil {
		t.Fatal(err)
	}
	if ri.Index != 2 || ri.Size != 0x4000 || ri.Offset != 2<<40 {
		t.Errorf("fixed part %+v", ri)
	}
	if !ri.Sparse || !reflect.DeepEqual(ri.SparseAreas, areas) {
		t.Errorf("sparse %v %v", ri.Sparse, ri.SparseAreas)
	}
	if !ri.MSIXMappable || !ri.HasType || ri.Type != 0x80008086 || ri.Subtype != 1 {
		t.Errorf("caps %+v", ri)
	}
	if !ri.Mappable() {
		t.Error("not mappable")
	}
	plain, err := parseRegionInfo(regionInfoFix(7, RegionFlagRead|RegionFlagWrite, 256, 7<<40))
	if err != nil {
		t.Fatal(err)
	}
	if plain.Sparse || plain.MSIXMappable || plain.Mappable() {
		t.Errorf("config region %+v", plain)
	}
	// Sparse with zero areas: nothing may be mmap'ed.
	empty, err := parseRegionInfo(regionInfoFix(0, RegionFlagMmap, 0x1000, 0, sparseCap()))
	if err != nil {
		t.Fatal(err)
	}
	if !empty.Sparse || empty.Mappable() {
		t.Errorf("empty sparse %+v", empty)
	}
}

func TestParseMalformed(t *testing.T) {
	good := iommuInfoFix(0x1000, dmaAvailCap(1), iovaCap(holeyRanges...))
	_, offs := appendCaps(make([]byte, sizeofIOMMUInfo), []capFix{dmaAvailCap(1), iovaCap(holeyRanges...)})
	mut := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }

	cases := []struct {
		name string
		buf  []byte
		want string
	}{
		{"short", good[:10], "shorter than"},
		{"argsz below fixed", mut(func(b []byte) []byte { ne.PutUint32(b, 8); return b }), "smaller than"},
		{"truncated", good[:len(good)-8], "truncated"},
		{"self cycle", mut(func(b []byte) []byte { ne.PutUint32(b[offs[0]+4:], uint32(offs[0])); return b }), "cycle"},
		{"two-cap cycle", mut(func(b []byte) []byte { ne.PutUint32(b[offs[1]+4:], uint32(offs[0])); return b }), "cycle"},
		{"next beyond argsz", mut(func(b []byte) []byte { ne.PutUint32(b[offs[0]+4:], uint32(len(b))); return b }), "beyond"},
		{"next far beyond", mut(func(b []byte) []byte { ne.PutUint32(b[offs[0]+4:], 0xfffffff8); return b }), "beyond"},
		{"first inside fixed part", mut(func(b []byte) []byte { ne.PutUint32(b[16:], 8); return b }), "inside the"},
		{"huge nr_iovas", mut(func(b []byte) []byte { ne.PutUint32(b[offs[1]+8:], 0xffffffff); return b }), "needs"},
		{"nr_iovas one too many", mut(func(b []byte) []byte { ne.PutUint32(b[offs[1]+8:], 3); return b }), "needs"},
		{"range start after end", mut(func(b []byte) []byte { ne.PutUint64(b[offs[1]+16:], 0xffffffffff); return b }), "starts after"},
		{"dma avail cut", iommuInfoFix(0x1000, capFix{id: iommuCapDMAAvail, ver: 1})[:sizeofIOMMUInfo+8], "needs"},
		{"duplicate ranges", iommuInfoFix(0x1000, iovaCap(holeyRanges...), iovaCap(holeyRanges...)), "second"},
	}
	for _, c := range cases {
		_, err := parseIOMMUInfo(c.buf)
		if !errors.Is(err, ErrBadInfo) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want ErrBadInfo mentioning %q", c.name, err, c.want)
		}
	}

	rgood := regionInfoFix(0, RegionFlagMmap, 0x4000, 0, msixMappableCap(), sparseCap(SparseArea{0, 0x1000}))
	_, roffs := appendCaps(make([]byte, sizeofRegionInfo), []capFix{msixMappableCap(), sparseCap(SparseArea{0, 0x1000})})
	rmut := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), rgood...)) }
	rcases := []struct {
		name string
		buf  []byte
		want string
	}{
		{"short", rgood[:31], "shorter than"},
		{"truncated", rgood[:len(rgood)-1], "truncated"},
		{"cycle", rmut(func(b []byte) []byte { ne.PutUint32(b[roffs[1]+4:], uint32(roffs[0])); return b }), "cycle"},
		{"next beyond", rmut(func(b []byte) []byte { ne.PutUint32(b[roffs[0]+4:], uint32(len(b)-4)); return b }), "beyond"},
		{"huge nr_areas", rmut(func(b []byte) []byte { ne.PutUint32(b[roffs[1]+8:], 1<<31); return b }), "needs"},
		{"area outside region", rmut(func(b []byte) []byte { ne.PutUint64(b[roffs[1]+16:], 0x3800); return b }), "outside region"},
		{"area wraps", rmut(func(b []byte) []byte {
			ne.PutUint64(b[roffs[1]+16:], 0x1000)
			ne.PutUint64(b[roffs[1]+24:], ^uint64(0))
			return b
		}), "outside region"},
		{"region wraps", regionInfoFix(0, 0, 0x2000, ^uint64(0)-0xfff), "wraps"},
		{"duplicate sparse", regionInfoFix(0, RegionFlagMmap, 0x1000, 0, sparseCap(), sparseCap()), "second"},
		{"type cap cut", regionInfoFix(0, 0, 0x1000, 0, capFix{id: regionCapType, ver: 1}), "needs"},
	}
	for _, c := range rcases {
		_, err := parseRegionInfo(c.buf)
		if !errors.Is(err, ErrBadInfo) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("region %s: err = %v, want ErrBadInfo mentioning %q", c.name, err, c.want)
		}
	}
}

// fakeInfoKernel answers INFO calls the way the kernel does: a buffer too
// small for the chain gets the fixed part, CAPS, cap_offset 0 and the
// needed argsz; a large enough one gets everything.
func fakeInfoKernel(full []byte, capOffField int, calls *int) func([]byte) error {
	fixed := capOffField + 4
	return func(buf []byte) error {
		*calls++
		argsz := int(ne.Uint32(buf))
		if argsz < len(full) {
			copy(buf, full[:min(fixed, len(buf))])
			ne.PutUint32(buf[0:], uint32(len(full)))
			ne.PutUint32(buf[capOffField:], 0)
			return nil
		}
		copy(buf, full)
		ne.PutUint32(buf[0:], uint32(argsz))
		return nil
	}
}

func TestFetchInfoTwoCalls(t *testing.T) {
	full := iommuInfoFix(0x1000, iovaCap(holeyRanges...), dmaAvailCap(7))
	calls := 0
	buf, err := fetchInfo(sizeofIOMMUInfo, nil, fakeInfoKernel(full, 16, &calls))
	if err != nil {
		t.Fatal(err)
	}
	if calls != 2 {
		t.Errorf("%d calls, want 2 (size probe, then fetch)", calls)
	}
	info, err := parseIOMMUInfo(buf)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(info.IOVARanges, holeyRanges) || info.DMAAvail != 7 {
		t.Errorf("info %+v", info)
	}

	// The first answer alone (chain did not fit) parses without caps.
	first := make([]byte, sizeofIOMMUInfo)
	ne.PutUint32(first, uint32(sizeofIOMMUInfo))
	calls = 0
	_ = fakeInfoKernel(full, 16, &calls)(first)
	if ne.Uint32(first) != uint32(len(full)) || ne.Uint32(first[4:])&uint32(IOMMUFlagCaps) == 0 {
		t.Fatalf("fake kernel did not report the needed size")
	}

	// Region info: prep sets the index before each call.
	rfull := regionInfoFix(4, RegionFlagMmap|RegionFlagRead, 0x4000, 4<<40, msixMappableCap())
	calls = 0
	var sawIndex []uint32
	kern := fakeInfoKernel(rfull, 12, &calls)
	buf, err = fetchInfo(sizeofRegionInfo, func(b []byte) { ne.PutUint32(b[8:], 4) }, func(b []byte) error {
		sawIndex = append(sawIndex, ne.Uint32(b[8:]))
		return kern(b)
	})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(sawIndex, []uint32{4, 4}) {
		t.Errorf("indexes passed %v", sawIndex)
	}
	if ri, err := parseRegionInfo(buf); err != nil || !ri.MSIXMappable {
		t.Errorf("region %+v %v", ri, err)
	}
}

func TestFetchInfoMisbehavingKernel(t *testing.T) {
	// Always asks for more: bounded number of calls.
	calls := 0
	_, err := fetchInfo(24, nil, func(b []byte) error {
		calls++
		ne.PutUint32(b, uint32(len(b)+8))
		return nil
	})
	if !errors.Is(err, ErrBadInfo) || calls != maxInfoCalls {
		t.Errorf("growing chain: err %v after %d calls", err, calls)
	}
	// Asks for an absurd size: refused without allocating it.
	_, err = fetchInfo(24, nil, func(b []byte) error { ne.PutUint32(b, 0xffffffff); return nil })
	if !errors.Is(err, ErrBadInfo) {
		t.Errorf("huge argsz: %v", err)
	}
	// ioctl errors pass through.
	sentinel := errors.New("boom")
	if _, err := fetchInfo(24, nil, func([]byte) error { return sentinel }); err != sentinel {
		t.Errorf("ioctl error: %v", err)
	}
}
