package vfio

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

// ioc re-implements the kernel's _IOC(dir, type, nr, size) macro from
// include/uapi/asm-generic/ioctl.h (nr 8 bits, type 8 bits, size from bit
// 16, direction from bit iocDirShift).
func ioc(dir, typ, nr, size uintptr) uintptr {
	return dir<<iocDirShift | size<<16 | typ<<8 | nr
}

// ioNone is _IO(type, nr).
func ioNone(typ, nr uintptr) uintptr { return ioc(iocNone, typ, nr, 0) }

func TestIoctlNumbersFromMacros(t *testing.T) {
	want := []struct {
		name string
		got  uintptr
		n    uintptr
	}{
		{"VFIO_GET_API_VERSION", ioctlGetAPIVersion, 0},
		{"VFIO_CHECK_EXTENSION", ioctlCheckExtension, 1},
		{"VFIO_SET_IOMMU", ioctlSetIOMMU, 2},
		{"VFIO_GROUP_GET_STATUS", ioctlGroupGetStatus, 3},
		{"VFIO_GROUP_SET_CONTAINER", ioctlGroupSetContainer, 4},
		{"VFIO_GROUP_UNSET_CONTAINER", ioctlGroupUnsetContainer, 5},
		{"VFIO_GROUP_GET_DEVICE_FD", ioctlGroupGetDeviceFD, 6},
		{"VFIO_DEVICE_GET_INFO", ioctlDeviceGetInfo, 7},
		{"VFIO_DEVICE_GET_REGION_INFO", ioctlDeviceGetRegionInfo, 8},
		{"VFIO_DEVICE_GET_IRQ_INFO", ioctlDeviceGetIRQInfo, 9},
		{"VFIO_DEVICE_SET_IRQS", ioctlDeviceSetIRQs, 10},
		{"VFIO_DEVICE_RESET", ioctlDeviceReset, 11},
		{"VFIO_IOMMU_GET_INFO", ioctlIOMMUGetInfo, 12},
		{"VFIO_IOMMU_MAP_DMA", ioctlIOMMUMapDMA, 13},
		{"VFIO_IOMMU_UNMAP_DMA", ioctlIOMMUUnmapDMA, 14},
	}
	for _, w := range want {
		// #define VFIO_TYPE (';'), VFIO_BASE 100, each request _IO(VFIO_TYPE, VFIO_BASE + n).
		if exp := ioNone(';', 100+w.n); w.got != exp {
			t.Errorf("%s = %#x, _IO(';', 100+%d) = %#x", w.name, w.got, w.n, exp)
		}
		if runtime.GOARCH == "amd64" || runtime.GOARCH == "arm64" {
			if exp := 0x3B64 + w.n; w.got != exp {
				t.Errorf("%s = %#x, want %#x on %s", w.name, w.got, exp, runtime.GOARCH)
			}
		}
	}
}

// layout is one struct's size and field offsets as the kernel header
// defines them (64-bit ABI).
type layout struct {
	cname   string
	size    uintptr
	goSize  uintptr
	offsets map[string][2]uintptr // C field -> {kernel offset, Go offset}
}

func goLayouts() []layout {
	var gs groupStatus
	var di deviceInfo
	var ri regionInfo
	var ii irqInfo
	var is irqSet
	var io iommuType1Info
	var dm dmaMap
	var du dmaUnmap
	return []layout{
		{"vfio_group_status", 8, unsafe.Sizeof(gs), map[string][2]uintptr{
			"argsz": {0, unsafe.Offsetof(gs.Argsz)}, "flags": {4, unsafe.Offsetof(gs.Flags)}}},
		{"vfio_device_info", 24, unsafe.Sizeof(di), map[string][2]uintptr{
			"argsz": {0, unsafe.Offsetof(di.Argsz)}, "flags": {4, unsafe.Offsetof(di.Flags)},
			"num_regions": {8, unsafe.Offsetof(di.NumRegions)}, "num_irqs": {12, unsafe.Offsetof(di.NumIRQs)},
			"cap_offset": {16, unsafe.Offsetof(di.CapOffset)}}},
		{"vfio_region_info", 32, unsafe.Sizeof(ri), map[string][2]uintptr{
			"argsz": {0, unsafe.Offsetof(ri.Argsz)}, "flags": {4, unsafe.Offsetof(ri.Flags)},
			"index": {8, unsafe.Offsetof(ri.Index)}, "cap_offset": {12, unsafe.Offsetof(ri.CapOffset)},
			"size": {16, unsafe.Offsetof(ri.Size)}, "offset": {24, unsafe.Offsetof(ri.Offset)}}},
		{"vfio_irq_info", 16, unsafe.Sizeof(ii), map[string][2]uintptr{
			"argsz": {0, unsafe.Offsetof(ii.Argsz)}, "flags": {4, unsafe.Offsetof(ii.Flags)},
			"index": {8, unsafe.Offsetof(ii.Index)}, "count": {12, unsafe.Offsetof(ii.Count)}}},
		{"vfio_irq_set", 20, unsafe.Sizeof(is), map[string][2]uintptr{
			"argsz": {0, unsafe.Offsetof(is.Argsz)}, "flags": {4, unsafe.Offsetof(is.Flags)},
			"index": {8, unsafe.Offsetof(is.Index)}, "start": {12, unsafe.Offsetof(is.Start)},
			"count": {16, unsafe.Offsetof(is.Count)}, "data": {20, unsafe.Sizeof(is)}}},
		{"vfio_iommu_type1_info", 24, unsafe.Sizeof(io), map[string][2]uintptr{
			"argsz": {0, unsafe.Offsetof(io.Argsz)}, "flags": {4, unsafe.Offsetof(io.Flags)},
			"iova_pgsizes": {8, unsafe.Offsetof(io.IOVAPgsizes)}, "cap_offset": {16, unsafe.Offsetof(io.CapOffset)}}},
		{"vfio_iommu_type1_dma_map", 32, unsafe.Sizeof(dm), map[string][2]uintptr{
			"argsz": {0, unsafe.Offsetof(dm.Argsz)}, "flags": {4, unsafe.Offsetof(dm.Flags)},
			"vaddr": {8, unsafe.Offsetof(dm.Vaddr)}, "iova": {16, unsafe.Offsetof(dm.IOVA)},
			"size": {24, unsafe.Offsetof(dm.Size)}}},
		{"vfio_iommu_type1_dma_unmap", 24, unsafe.Sizeof(du), map[string][2]uintptr{
			"argsz": {0, unsafe.Offsetof(du.Argsz)}, "flags": {4, unsafe.Offsetof(du.Flags)},
			"iova": {8, unsafe.Offsetof(du.IOVA)}, "size": {16, unsafe.Offsetof(du.Size)},
			"data": {24, unsafe.Sizeof(du)}}},
	}
}

func TestStructLayouts(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("layouts checked for the 64-bit ABI only")
	}
	for _, l := range goLayouts() {
		if l.goSize != l.size {
			t.Errorf("sizeof(struct %s) = %d in Go, %d in the header", l.cname, l.goSize, l.size)
		}
		for f, o := range l.offsets {
			if o[0] != o[1] {
				t.Errorf("offsetof(struct %s, %s) = %d in Go, %d in the header", l.cname, f, o[1], o[0])
			}
		}
	}
	// Fixed sizes the byte parsers use.
	for name, got := range map[string][2]int{
		"vfio_info_cap_header":                   {sizeofCapHeader, 8},
		"vfio_iommu_type1_info_cap_iova_range":   {sizeofIOVARangeCap, 16},
		"vfio_iova_range":                        {sizeofIOVARange, 16},
		"vfio_region_info_cap_sparse_mmap":       {sizeofSparseCap, 16},
		"vfio_region_sparse_mmap_area":           {sizeofSparseArea, 16},
		"vfio_region_info_cap_type":              {sizeofTypeCap, 16},
		"vfio_iommu_type1_info_dma_avail(avail)": {sizeofDMAAvailCap, 12},
	} {
		if got[0] != got[1] {
			t.Errorf("%s: %d, want %d", name, got[0], got[1])
		}
	}
	if unsafe.Sizeof(IOVARange{}) != 16 || unsafe.Offsetof(IOVARange{}.End) != 8 {
		t.Errorf("IOVARange must mirror struct vfio_iova_range {u64 start, end}")
	}
}

// goConstants maps header names to this package's values, for the
// cross-check against the C header.
func goConstants() map[string]uint64 {
	return map[string]uint64{
		"VFIO_GET_API_VERSION":                                            uint64(ioctlGetAPIVersion),
		"VFIO_CHECK_EXTENSION":                                            uint64(ioctlCheckExtension),
		"VFIO_SET_IOMMU":                                                  uint64(ioctlSetIOMMU),
		"VFIO_GROUP_GET_STATUS":                                           uint64(ioctlGroupGetStatus),
		"VFIO_GROUP_SET_CONTAINER":                                        uint64(ioctlGroupSetContainer),
		"VFIO_GROUP_UNSET_CONTAINER":                                      uint64(ioctlGroupUnsetContainer),
		"VFIO_GROUP_GET_DEVICE_FD":                                        uint64(ioctlGroupGetDeviceFD),
		"VFIO_DEVICE_GET_INFO":                                            uint64(ioctlDeviceGetInfo),
		"VFIO_DEVICE_GET_REGION_INFO":                                     uint64(ioctlDeviceGetRegionInfo),
		"VFIO_DEVICE_GET_IRQ_INFO":                                        uint64(ioctlDeviceGetIRQInfo),
		"VFIO_DEVICE_SET_IRQS":                                            uint64(ioctlDeviceSetIRQs),
		"VFIO_DEVICE_RESET":                                               uint64(ioctlDeviceReset),
		"VFIO_IOMMU_GET_INFO":                                             uint64(ioctlIOMMUGetInfo),
		"VFIO_IOMMU_MAP_DMA":                                              uint64(ioctlIOMMUMapDMA),
		"VFIO_IOMMU_UNMAP_DMA":                                            uint64(ioctlIOMMUUnmapDMA),
		"VFIO_API_VERSION":                                                APIVersion,
		"VFIO_TYPE1_IOMMU":                                                ExtType1IOMMU,
		"VFIO_TYPE1v2_IOMMU":                                              ExtType1v2IOMMU,
		"VFIO_DMA_CC_IOMMU":                                               ExtDMACCIOMMU,
		"VFIO_NOIOMMU_IOMMU":                                              ExtNoIOMMU,
		"VFIO_UNMAP_ALL":                                                  ExtUnmapAll,
		"VFIO_GROUP_FLAGS_VIABLE":                                         groupFlagsViable,
		"VFIO_GROUP_FLAGS_CONTAINER_SET":                                  groupFlagsContainerSet,
		"VFIO_DEVICE_FLAGS_RESET":                                         uint64(DeviceFlagReset),
		"VFIO_DEVICE_FLAGS_PCI":                                           uint64(DeviceFlagPCI),
		"VFIO_DEVICE_FLAGS_PLATFORM":                                      uint64(DeviceFlagPlatform),
		"VFIO_DEVICE_FLAGS_AMBA":                                          uint64(DeviceFlagAMBA),
		"VFIO_DEVICE_FLAGS_CCW":                                           uint64(DeviceFlagCCW),
		"VFIO_DEVICE_FLAGS_AP":                                            uint64(DeviceFlagAP),
		"VFIO_DEVICE_FLAGS_FSL_MC":                                        uint64(DeviceFlagFSLMC),
		"VFIO_DEVICE_FLAGS_CAPS":                                          uint64(DeviceFlagCaps),
		"VFIO_REGION_INFO_FLAG_READ":                                      uint64(RegionFlagRead),
		"VFIO_REGION_INFO_FLAG_WRITE":                                     uint64(RegionFlagWrite),
		"VFIO_REGION_INFO_FLAG_MMAP":                                      uint64(RegionFlagMmap),
		"VFIO_REGION_INFO_FLAG_CAPS":                                      uint64(RegionFlagCaps),
		"VFIO_REGION_INFO_CAP_SPARSE_MMAP":                                regionCapSparseMmap,
		"VFIO_REGION_INFO_CAP_TYPE":                                       regionCapType,
		"VFIO_REGION_INFO_CAP_MSIX_MAPPABLE":                              regionCapMSIXMappable,
		"VFIO_PCI_BAR0_REGION_INDEX":                                      RegionBAR0,
		"VFIO_PCI_BAR5_REGION_INDEX":                                      RegionBAR5,
		"VFIO_PCI_ROM_REGION_INDEX":                                       RegionROM,
		"VFIO_PCI_CONFIG_REGION_INDEX":                                    RegionConfig,
		"VFIO_PCI_VGA_REGION_INDEX":                                       RegionVGA,
		"VFIO_IRQ_INFO_EVENTFD":                                           uint64(IRQFlagEventfd),
		"VFIO_IRQ_INFO_MASKABLE":                                          uint64(IRQFlagMaskable),
		"VFIO_IRQ_INFO_AUTOMASKED":                                        uint64(IRQFlagAutomasked),
		"VFIO_IRQ_INFO_NORESIZE":                                          uint64(IRQFlagNoResize),
		"VFIO_PCI_INTX_IRQ_INDEX":                                         IRQINTx,
		"VFIO_PCI_MSI_IRQ_INDEX":                                          IRQMSI,
		"VFIO_PCI_MSIX_IRQ_INDEX":                                         IRQMSIX,
		"VFIO_PCI_ERR_IRQ_INDEX":                                          IRQErr,
		"VFIO_PCI_REQ_IRQ_INDEX":                                          IRQReq,
		"VFIO_IRQ_SET_DATA_NONE":                                          irqSetDataNone,
		"VFIO_IRQ_SET_DATA_BOOL":                                          irqSetDataBool,
		"VFIO_IRQ_SET_DATA_EVENTFD":                                       irqSetDataEventfd,
		"VFIO_IRQ_SET_ACTION_MASK":                                        irqSetActionMask,
		"VFIO_IRQ_SET_ACTION_UNMASK":                                      irqSetActionUnmask,
		"VFIO_IRQ_SET_ACTION_TRIGGER":                                     irqSetActionTrigger,
		"VFIO_IOMMU_INFO_PGSIZES":                                         uint64(IOMMUFlagPageSizes),
		"VFIO_IOMMU_INFO_CAPS":                                            uint64(IOMMUFlagCaps),
		"VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE":                            iommuCapIOVARange,
		"VFIO_IOMMU_TYPE1_INFO_CAP_MIGRATION":                             iommuCapMigration,
		"VFIO_IOMMU_TYPE1_INFO_DMA_AVAIL":                                 iommuCapDMAAvail,
		"VFIO_DMA_MAP_FLAG_READ":                                          dmaMapFlagRead,
		"VFIO_DMA_MAP_FLAG_WRITE":                                         dmaMapFlagWrite,
		"sizeof(struct vfio_info_cap_header)":                             sizeofCapHeader,
		"sizeof(struct vfio_iommu_type1_info_cap_iova_range)":             sizeofIOVARangeCap,
		"sizeof(struct vfio_iova_range)":                                  sizeofIOVARange,
		"sizeof(struct vfio_region_info_cap_sparse_mmap)":                 sizeofSparseCap,
		"sizeof(struct vfio_region_sparse_mmap_area)":                     sizeofSparseArea,
		"sizeof(struct vfio_region_info_cap_type)":                        sizeofTypeCap,
		"offsetof(struct vfio_iommu_type1_info_dma_avail, avail)":         8,
		"offsetof(struct vfio_iommu_type1_info_cap_iova_range, nr_iovas)": 8,
		"offsetof(struct vfio_region_info_cap_sparse_mmap, nr_areas)":     8,
	}
}

// TestAgainstCHeader compiles a C program against the host's
// <linux/vfio.h> and compares every number, size and offset it prints
// with this package's. Skipped without gcc or kernel headers.
func TestAgainstCHeader(t *testing.T) {
	if _, err := os.Stat("/usr/include/linux/vfio.h"); err != nil {
		t.Skip("no /usr/include/linux/vfio.h (install linux-libc-dev)")
	}
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("no gcc")
	}
	consts := goConstants()
	var src strings.Builder
	src.WriteString("#include <stdio.h>\n#include <stddef.h>\n#include <linux/vfio.h>\n" +
		"#define P(n, v) printf(\"%s %llu\\n\", n, (unsigned long long)(v))\nint main(void) {\n")
	for name := range consts {
		if strings.HasPrefix(name, "sizeof") || strings.HasPrefix(name, "offsetof") {
			src.WriteString("P(\"" + name + "\", " + name + ");\n")
			continue
		}
		// Enumerators are not macros; #ifdef only guards macros the host header may lack.
		if strings.Contains(name, "_INDEX") {
			src.WriteString("P(\"" + name + "\", " + name + ");\n")
			continue
		}
		src.WriteString("#ifdef " + name + "\nP(\"" + name + "\", " + name + ");\n#endif\n")
	}
	for _, l := range goLayouts() {
		src.WriteString("P(\"sizeof(struct " + l.cname + ")\", sizeof(struct " + l.cname + "));\n")
		for f := range l.offsets {
			src.WriteString("P(\"offsetof(struct " + l.cname + ", " + f + ")\", offsetof(struct " + l.cname + ", " + f + "));\n")
		}
	}
	src.WriteString("return 0;\n}\n")

	dir := t.TempDir()
	cfile, bin := filepath.Join(dir, "layout.c"), filepath.Join(dir, "layout")
	if err := os.WriteFile(cfile, []byte(src.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(gcc, "-o", bin, cfile).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	c := map[string]uint64{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseUint(line[i+1:], 10, 64)
		if err != nil {
			t.Fatalf("bad line %q", line)
		}
		c[line[:i]] = v
	}
	checked := 0
	for name, want := range c {
		got, ok := consts[name]
		if !ok {
			continue
		}
		checked++
		if got != want {
			t.Errorf("%s: Go %#x, C header %#x", name, got, want)
		}
	}
	for _, l := range goLayouts() {
		key := "sizeof(struct " + l.cname + ")"
		cs := c[key]
		// vfio_device_info grew a pad word after cap_offset; older headers
		// end at cap_offset and the kernel accepts a larger argsz.
		if l.cname == "vfio_device_info" && uint64(l.goSize) >= cs && cs >= 20 {
			checked++
		} else if uint64(l.goSize) != cs {
			t.Errorf("%s: Go %d, C header %d", key, l.goSize, cs)
		} else {
			checked++
		}
		for f, o := range l.offsets {
			key := "offsetof(struct " + l.cname + ", " + f + ")"
			if uint64(o[1]) != c[key] {
				t.Errorf("%s: Go %d, C header %d", key, o[1], c[key])
			}
			checked++
		}
	}
	if checked < 80 {
		t.Errorf("only %d values cross-checked; header too old?", checked)
	}
	t.Logf("%d values cross-checked against /usr/include/linux/vfio.h", checked)
}
