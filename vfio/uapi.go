package vfio

import "unsafe"

// Values and layouts from include/uapi/linux/vfio.h. Every VFIO ioctl is
// defined with _IO(VFIO_TYPE, VFIO_BASE + n): the argument size is carried
// in each structure's argsz field, not in the request number.
const (
	vfioType = 0x3B // ';'
	vfioBase = 100
)

// ioBase is _IO(VFIO_TYPE, VFIO_BASE): direction "none", size 0; request
// n is ioBase + n.
const ioBase = iocNone<<iocDirShift | vfioType<<8 | vfioBase

// Request numbers.
const (
	ioctlGetAPIVersion       = ioBase + 0
	ioctlCheckExtension      = ioBase + 1
	ioctlSetIOMMU            = ioBase + 2
	ioctlGroupGetStatus      = ioBase + 3
	ioctlGroupSetContainer   = ioBase + 4
	ioctlGroupUnsetContainer = ioBase + 5
	ioctlGroupGetDeviceFD    = ioBase + 6
	ioctlDeviceGetInfo       = ioBase + 7
	ioctlDeviceGetRegionInfo = ioBase + 8
	ioctlDeviceGetIRQInfo    = ioBase + 9
	ioctlDeviceSetIRQs       = ioBase + 10
	ioctlDeviceReset         = ioBase + 11
	ioctlIOMMUGetInfo        = ioBase + 12
	ioctlIOMMUMapDMA         = ioBase + 13
	ioctlIOMMUUnmapDMA       = ioBase + 14
)

// APIVersion is the VFIO_API_VERSION this package speaks.
const APIVersion = 0

// Extensions accepted by VFIO_CHECK_EXTENSION and VFIO_SET_IOMMU.
const (
	ExtType1IOMMU   = 1 // VFIO_TYPE1_IOMMU
	ExtType1v2IOMMU = 3 // VFIO_TYPE1v2_IOMMU: the IOMMU model this package uses
	ExtDMACCIOMMU   = 4 // VFIO_DMA_CC_IOMMU: IOMMU enforces cache coherence
	ExtNoIOMMU      = 8 // VFIO_NOIOMMU_IOMMU
	ExtUnmapAll     = 9 // VFIO_UNMAP_ALL
)

// Group status flags (struct vfio_group_status).
const (
	groupFlagsViable       = 1 << 0
	groupFlagsContainerSet = 1 << 1
)

// DeviceFlags are the flags of struct vfio_device_info.
type DeviceFlags uint32

// Device flags.
const (
	DeviceFlagReset    DeviceFlags = 1 << 0 // VFIO_DEVICE_FLAGS_RESET: VFIO_DEVICE_RESET is supported
	DeviceFlagPCI      DeviceFlags = 1 << 1 // VFIO_DEVICE_FLAGS_PCI: a vfio-pci device
	DeviceFlagPlatform DeviceFlags = 1 << 2 // VFIO_DEVICE_FLAGS_PLATFORM
	DeviceFlagAMBA     DeviceFlags = 1 << 3 // VFIO_DEVICE_FLAGS_AMBA
	DeviceFlagCCW      DeviceFlags = 1 << 4 // VFIO_DEVICE_FLAGS_CCW
	DeviceFlagAP       DeviceFlags = 1 << 5 // VFIO_DEVICE_FLAGS_AP
	DeviceFlagFSLMC    DeviceFlags = 1 << 6 // VFIO_DEVICE_FLAGS_FSL_MC
	DeviceFlagCaps     DeviceFlags = 1 << 7 // VFIO_DEVICE_FLAGS_CAPS: info carries a capability chain
)

// RegionFlags are the flags of struct vfio_region_info.
type RegionFlags uint32

// Region flags.
const (
	RegionFlagRead  RegionFlags = 1 << 0 // VFIO_REGION_INFO_FLAG_READ: pread works
	RegionFlagWrite RegionFlags = 1 << 1 // VFIO_REGION_INFO_FLAG_WRITE: pwrite works
	RegionFlagMmap  RegionFlags = 1 << 2 // VFIO_REGION_INFO_FLAG_MMAP: mmap works
	RegionFlagCaps  RegionFlags = 1 << 3 // VFIO_REGION_INFO_FLAG_CAPS: info carries a capability chain
)

// Region capability IDs.
const (
	regionCapSparseMmap   = 1 // VFIO_REGION_INFO_CAP_SPARSE_MMAP
	regionCapType         = 2 // VFIO_REGION_INFO_CAP_TYPE
	regionCapMSIXMappable = 3 // VFIO_REGION_INFO_CAP_MSIX_MAPPABLE
)

// vfio-pci region indexes (fixed user ABI).
const (
	RegionBAR0   = 0 // VFIO_PCI_BAR0_REGION_INDEX
	RegionBAR1   = 1 // VFIO_PCI_BAR1_REGION_INDEX
	RegionBAR2   = 2 // VFIO_PCI_BAR2_REGION_INDEX
	RegionBAR3   = 3 // VFIO_PCI_BAR3_REGION_INDEX
	RegionBAR4   = 4 // VFIO_PCI_BAR4_REGION_INDEX
	RegionBAR5   = 5 // VFIO_PCI_BAR5_REGION_INDEX
	RegionROM    = 6 // VFIO_PCI_ROM_REGION_INDEX
	RegionConfig = 7 // VFIO_PCI_CONFIG_REGION_INDEX
	RegionVGA    = 8 // VFIO_PCI_VGA_REGION_INDEX
)

// IRQFlags are the flags of struct vfio_irq_info.
type IRQFlags uint32

// IRQ info flags.
const (
	IRQFlagEventfd    IRQFlags = 1 << 0 // VFIO_IRQ_INFO_EVENTFD: can signal an eventfd
	IRQFlagMaskable   IRQFlags = 1 << 1 // VFIO_IRQ_INFO_MASKABLE: MASK/UNMASK actions work
	IRQFlagAutomasked IRQFlags = 1 << 2 // VFIO_IRQ_INFO_AUTOMASKED: masked after each signal (INTx); unmask to get the next
	IRQFlagNoResize   IRQFlags = 1 << 3 // VFIO_IRQ_INFO_NORESIZE: vectors are enabled as one set; cannot grow while enabled
)

// vfio-pci IRQ indexes (fixed user ABI).
const (
	IRQINTx = 0 // VFIO_PCI_INTX_IRQ_INDEX
	IRQMSI  = 1 // VFIO_PCI_MSI_IRQ_INDEX
	IRQMSIX = 2 // VFIO_PCI_MSIX_IRQ_INDEX
	IRQErr  = 3 // VFIO_PCI_ERR_IRQ_INDEX
	IRQReq  = 4 // VFIO_PCI_REQ_IRQ_INDEX
)

// struct vfio_irq_set flags.
const (
	irqSetDataNone      = 1 << 0
	irqSetDataBool      = 1 << 1
	irqSetDataEventfd   = 1 << 2
	irqSetActionMask    = 1 << 3
	irqSetActionUnmask  = 1 << 4
	irqSetActionTrigger = 1 << 5
)

// IOMMUFlags are the flags of struct vfio_iommu_type1_info.
type IOMMUFlags uint32

// IOMMU info flags.
const (
	IOMMUFlagPageSizes IOMMUFlags = 1 << 0 // VFIO_IOMMU_INFO_PGSIZES: the page-size bitmap is valid
	IOMMUFlagCaps      IOMMUFlags = 1 << 1 // VFIO_IOMMU_INFO_CAPS: info carries a capability chain
)

// IOMMU info capability IDs.
const (
	iommuCapIOVARange = 1 // VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE
	iommuCapMigration = 2 // VFIO_IOMMU_TYPE1_INFO_CAP_MIGRATION
	iommuCapDMAAvail  = 3 // VFIO_IOMMU_TYPE1_INFO_DMA_AVAIL
)

// DMA map/unmap flags.
const (
	dmaMapFlagRead  = 1 << 0
	dmaMapFlagWrite = 1 << 1
)

// struct vfio_group_status.
type groupStatus struct {
	Argsz uint32
	Flags uint32
}

// struct vfio_device_info in its current layout (with cap_offset and pad;
// kernels before 5.x are 16 bytes long and accept the larger argsz).
type deviceInfo struct {
	Argsz      uint32
	Flags      uint32
	NumRegions uint32
	NumIRQs    uint32
	CapOffset  uint32
	Pad        uint32
}

// struct vfio_region_info (fixed part; the capability chain follows it).
type regionInfo struct {
	Argsz     uint32
	Flags     uint32
	Index     uint32
	CapOffset uint32
	Size      uint64
	Offset    uint64
}

// struct vfio_irq_info.
type irqInfo struct {
	Argsz uint32
	Flags uint32
	Index uint32
	Count uint32
}

// struct vfio_irq_set without its flexible data[] tail.
type irqSet struct {
	Argsz uint32
	Flags uint32
	Index uint32
	Start uint32
	Count uint32
}

// struct vfio_iommu_type1_info (fixed part; the capability chain follows it).
type iommuType1Info struct {
	Argsz       uint32
	Flags       uint32
	IOVAPgsizes uint64
	CapOffset   uint32
	Pad         uint32
}

// struct vfio_iommu_type1_dma_map.
type dmaMap struct {
	Argsz uint32
	Flags uint32
	Vaddr uint64
	IOVA  uint64
	Size  uint64
}

// struct vfio_iommu_type1_dma_unmap without its flexible data[] tail.
type dmaUnmap struct {
	Argsz uint32
	Flags uint32
	IOVA  uint64
	Size  uint64
}

// Sizes of the fixed parts; capability chains are parsed from bytes at
// these offsets (struct vfio_info_cap_header is 8 bytes: u16 id, u16
// version, u32 next; capability payloads start right after it).
const (
	sizeofGroupStatus  = int(unsafe.Sizeof(groupStatus{}))
	sizeofDeviceInfo   = int(unsafe.Sizeof(deviceInfo{}))
	sizeofRegionInfo   = int(unsafe.Sizeof(regionInfo{}))
	sizeofIRQInfo      = int(unsafe.Sizeof(irqInfo{}))
	sizeofIRQSet       = int(unsafe.Sizeof(irqSet{}))
	sizeofIOMMUInfo    = int(unsafe.Sizeof(iommuType1Info{}))
	sizeofDMAMap       = int(unsafe.Sizeof(dmaMap{}))
	sizeofDMAUnmap     = int(unsafe.Sizeof(dmaUnmap{}))
	sizeofCapHeader    = 8
	sizeofIOVARangeCap = 16 // header, u32 nr_iovas, u32 reserved
	sizeofIOVARange    = 16 // u64 start, u64 end (inclusive)
	sizeofSparseCap    = 16 // header, u32 nr_areas, u32 reserved
	sizeofSparseArea   = 16 // u64 offset, u64 size
	sizeofTypeCap      = 16 // header, u32 type, u32 subtype
	sizeofDMAAvailCap  = 12 // header, u32 avail
)
