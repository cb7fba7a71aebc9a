package vfio

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

func TestCheckIOVA(t *testing.T) {
	ok := []struct{ iova, size uint64 }{
		{0, 0x1000},
		{0xfedff000, 0x1000},                  // last page below the hole
		{0xfef00000, 0x200000},                // first pages above it
		{1<<48 - 0x1000, 0x1000},              // last page of the space
		{0x100000, 0xfedfffff - 0x100000 + 1}, // up to the hole exactly
	}
	for _, c := range ok {
		if err := CheckIOVA(holeyRanges, c.iova, c.size); err != nil {
			t.Errorf("iova %#x size %#x: %v", c.iova, c.size, err)
		}
	}
	bad := []struct{ iova, size uint64 }{
		{0xfee00000, 0x1000},         // inside the MSI hole
		{0xfedff000, 0x2000},         // straddles into the hole
		{0xfed00000, 0x300000},       // spans the hole: touches both ranges, inside neither
		{1 << 48, 0x1000},            // beyond aw-bits
		{1<<48 - 0x1000, 0x2000},     // crosses the top
		{^uint64(0) - 0xfff, 0x2000}, // wraps
	}
	for _, c := range bad {
		err := CheckIOVA(holeyRanges, c.iova, c.size)
		if !errors.Is(err, ErrOutOfRange) {
			t.Errorf("iova %#x size %#x: err %v, want ErrOutOfRange", c.iova, c.size, err)
			continue
		}
		msg := err.Error()
		if !strings.Contains(msg, "0xfef00000-0xffffffffffff") && !strings.Contains(msg, "wraps") {
			t.Errorf("error does not name the ranges: %s", msg)
		}
	}
	if err := CheckIOVA(holeyRanges, 0x1000, 0); !errors.Is(err, ErrInvalid) {
		t.Errorf("size 0: %v", err)
	}
	if err := CheckIOVA(nil, 0xfee00000, 0x1000); err != nil {
		t.Errorf("unknown ranges should accept: %v", err)
	}
	if err := CheckIOVA([]IOVARange{}, 0, 0x1000); !errors.Is(err, ErrOutOfRange) {
		t.Errorf("empty ranges should refuse: %v", err)
	}
}

func TestCheckDMAAlignment(t *testing.T) {
	cases := []struct {
		vaddr, iova, size uint64
		want              error
	}{
		{0x7f0000000000, 0x200000, 0x200000, nil},
		{0x7f0000000800, 0x200000, 0x1000, ErrUnaligned},
		{0x7f0000000000, 0x200800, 0x1000, ErrUnaligned},
		{0x7f0000000000, 0x200000, 0x1800, ErrUnaligned},
		{0x7f0000000000, 0xfee00000, 0x1000, ErrOutOfRange},
		{0x7f0000000000, 0x1000, 0, ErrInvalid},
	}
	for _, c := range cases {
		err := checkDMA(holeyRanges, 0x1000, c.vaddr, c.iova, c.size)
		if c.want == nil && err != nil || c.want != nil && !errors.Is(err, c.want) {
			t.Errorf("vaddr %#x iova %#x size %#x: err %v, want %v", c.vaddr, c.iova, c.size, err, c.want)
		}
	}
}

// fakeType1 models the type1v2 IOMMU: it refuses overlapping maps (EEXIST)
// and unmaps that split a mapping (EINVAL), reports unmapped sizes, and
// answers GET_INFO with a capability chain, the two-call way.
type fakeType1 struct {
	info   []byte
	maps   map[uint64]uint64 // iova -> size
	calls  []string
	failOn string
}

func newFakeType1(ranges ...IOVARange) *fakeType1 {
	return &fakeType1{
		info: iommuInfoFix(0x40201000, iovaCap(ranges...), dmaAvailCap(65535)),
		maps: map[uint64]uint64{},
	}
}

func (f *fakeType1) getInfo(buf []byte) error {
	f.calls = append(f.calls, "info")
	n := 0
	return fakeInfoKernel(f.info, 16, &n)(buf)
}

func (f *fakeType1) mapDMA(vaddr, iova, size uint64) error {
	f.calls = append(f.calls, "map")
	if f.failOn == "map" {
		return unix.ENOMEM
	}
	for a, s := range f.maps {
		if iova < a+s && a < iova+size {
			return unix.EEXIST
		}
	}
	f.maps[iova] = size
	return nil
}

func (f *fakeType1) unmapDMA(iova, size uint64) (uint64, error) {
	f.calls = append(f.calls, "unmap")
	var done uint64
	for a, s := range f.maps {
		if a < iova+size && iova < a+s && (a < iova || a+s > iova+size) {
			return 0, unix.EINVAL
		}
	}
	for a, s := range f.maps {
		if a >= iova && a+s <= iova+size {
			delete(f.maps, a)
			done += s
		}
	}
	return done, nil
}

// fakeContainer is a Container with an attached "group" whose IOMMU is
// the model above; the info comes through the real two-call path.
func fakeContainer(t *testing.T, f *fakeType1) *Container {
	t.Helper()
	c := &Container{path: "fake-container", made: true, fd: -1, iommu: f, iommuSet: true}
	if err := c.refreshInfoLocked(); err != nil {
		t.Fatal(err)
	}
	return c
}

// pages returns n page-aligned pages outside the Go heap.
func pages(t *testing.T, n int) []byte {
	t.Helper()
	b, err := unix.Mmap(-1, 0, n*4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	return b
}

func TestMapDMARangeCheckedBeforeIoctl(t *testing.T) {
	f := newFakeType1(holeyRanges...)
	c := fakeContainer(t, f)
	mem := pages(t, 4)
	f.calls = nil
	err := c.MapDMA(mem, 0xfee00000)
	if !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("map into the MSI hole: %v", err)
	}
	for _, s := range []string{"VFIO_IOMMU_MAP_DMA", "0xfee00000", "0x4000", "0x0-0xfedfffff"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not mention %s", err, s)
		}
	}
	if err := c.MapDMA(mem[0x800:], 0x100000); !errors.Is(err, ErrUnaligned) {
		t.Errorf("unaligned address: %v", err)
	}
	if err := c.MapDMA(mem, 0x100800); !errors.Is(err, ErrUnaligned) {
		t.Errorf("unaligned iova: %v", err)
	}
	if err := c.MapDMA(mem[:0x1800], 0x100000); !errors.Is(err, ErrUnaligned) {
		t.Errorf("unaligned size: %v", err)
	}
	if err := c.MapDMA(nil, 0x100000); !errors.Is(err, ErrInvalid) {
		t.Errorf("empty: %v", err)
	}
	if err := c.UnmapDMA(1<<48, 0x1000); !errors.Is(err, ErrOutOfRange) {
		t.Errorf("unmap out of range: %v", err)
	}
	if len(f.calls) != 0 {
		t.Errorf("ioctls issued for refused requests: %v", f.calls)
	}
}

func TestMapUnmapTracking(t *testing.T) {
	f := newFakeType1(holeyRanges...)
	c := fakeContainer(t, f)
	mem := pages(t, 8)
	a, b := mem[:0x4000], mem[0x4000:]
	if err := c.MapDMA(a, 0x100000); err != nil {
		t.Fatal(err)
	}
	if err := c.MapDMA(b, 0x200000); err != nil {
		t.Fatal(err)
	}
	// Overlap is refused before the ioctl.
	f.calls = nil
	if err := c.MapDMA(b, 0x102000); !errors.Is(err, ErrOverlap) {
		t.Errorf("overlap: %v", err)
	}
	if err := c.MapDMA(b, 0xfe000); !errors.Is(err, ErrOverlap) {
		t.Errorf("overlap from below: %v", err)
	}
	// Splitting a mapping and unmapping nothing are refused before the ioctl.
	if err := c.UnmapDMA(0x100000, 0x2000); !errors.Is(err, ErrOverlap) {
		t.Errorf("split: %v", err)
	}
	if err := c.UnmapDMA(0x300000, 0x1000); !errors.Is(err, ErrNotMapped) {
		t.Errorf("nothing mapped: %v", err)
	}
	if len(f.calls) != 0 {
		t.Errorf("ioctls issued for refused requests: %v", f.calls)
	}
	want := []DMAMapping{
		{IOVA: 0x100000, Size: 0x4000, Addr: uintptr(unsafe.Pointer(&a[0]))},
		{IOVA: 0x200000, Size: 0x4000, Addr: uintptr(unsafe.Pointer(&b[0]))},
	}
	if got := c.Mappings(); !reflect.DeepEqual(got, want) {
		t.Errorf("mappings %+v, want %+v", got, want)
	}
	// One unmap covering both mappings and the gap between them.
	if err := c.UnmapDMA(0x100000, 0x104000); err != nil {
		t.Fatal(err)
	}
	if len(c.Mappings()) != 0 || len(f.maps) != 0 {
		t.Errorf("left mapped: %v %v", c.Mappings(), f.maps)
	}
	// Kernel failure is reported with the ioctl name and not tracked.
	f.failOn = "map"
	err := c.MapDMA(a, 0x100000)
	if !errors.Is(err, unix.ENOMEM) || !strings.Contains(err.Error(), "VFIO_IOMMU_MAP_DMA") || !strings.Contains(err.Error(), "MEMLOCK") {
		t.Errorf("kernel failure: %v", err)
	}
	if len(c.Mappings()) != 0 {
		t.Error("failed map tracked")
	}
}

func TestContainerCloseUnmapsAll(t *testing.T) {
	f := newFakeType1(holeyRanges...)
	c := fakeContainer(t, f)
	mem := pages(t, 4)
	for i := range 4 {
		if err := c.MapDMA(mem[i*4096:(i+1)*4096], 0xfef00000+uint64(i)*0x10000); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if len(f.maps) != 0 {
		t.Errorf("Close left %d mappings in the IOMMU", len(f.maps))
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := c.MapDMA(mem, 0x100000); !errors.Is(err, ErrClosed) {
		t.Errorf("map after close: %v", err)
	}
	if _, err := c.IOVARanges(); !errors.Is(err, ErrClosed) {
		t.Errorf("ranges after close: %v", err)
	}
}

func TestContainerWithoutGroup(t *testing.T) {
	c := &Container{path: "fake", made: true, fd: -1, iommu: newFakeType1(holeyRanges...)}
	if err := c.MapDMA(make([]byte, 4096), 0); !errors.Is(err, ErrNoGroup) {
		t.Errorf("map without group: %v", err)
	}
	if _, err := c.IOVARanges(); !errors.Is(err, ErrNoGroup) {
		t.Errorf("ranges without group: %v", err)
	}
}

func TestIOVARangesAndInfo(t *testing.T) {
	f := newFakeType1(holeyRanges...)
	c := fakeContainer(t, f)
	rs, err := c.IOVARanges()
	if err != nil || !reflect.DeepEqual(rs, holeyRanges) {
		t.Fatalf("ranges %v %v", rs, err)
	}
	rs[0].End = 0 // the caller's copy
	info, err := c.IOMMUInfo()
	if err != nil || info.IOVARanges[0].End != 0xfedfffff || info.MinPageSize() != 4096 || info.DMAAvail != 65535 {
		t.Errorf("info %+v %v", info, err)
	}
	// A kernel without the IOVA range capability.
	f.info = iommuInfoFix(0x1000, dmaAvailCap(3))
	if _, err := c.IOVARanges(); !errors.Is(err, ErrNotSupported) {
		t.Errorf("no range cap: %v", err)
	}
}

func TestLastGroupDetachForgetsMappings(t *testing.T) {
	f := newFakeType1(holeyRanges...)
	c := fakeContainer(t, f)
	g := &Group{c: c, num: 3, fd: -1}
	c.groups = []*Group{g}
	if err := c.MapDMA(pages(t, 1), 0x1000); err != nil {
		t.Fatal(err)
	}
	c.detach(g)
	if c.iommuSet || len(c.Mappings()) != 0 {
		t.Errorf("after the last group left: iommuSet %v, mappings %v", c.iommuSet, c.Mappings())
	}
}
