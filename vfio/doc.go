// Package vfio drives the Linux VFIO container, group and device interfaces
// with the type1v2 IOMMU, in pure Go (no cgo): opening /dev/vfio/vfio and
// /dev/vfio/<group>, mapping DMA memory at IOVAs the IOMMU reports as
// usable, reading region (BAR) information and mmap-ing BARs, reading and
// writing PCI config space, and wiring interrupts (MSI-X, MSI, INTx) to
// eventfds. It knows nothing about what the device is.
//
// Every device it opens has its device-request interrupt
// (VFIO_PCI_REQ_IRQ_INDEX) wired to an eventfd, Device.Request: when the
// kernel wants the device back (a sysfs unbind, a hot-unplug) it signals
// that eventfd and waits for the device to be closed, instead of blocking
// until the process exits.
//
// Typical use:
//
//	c, err := vfio.OpenContainer()       // /dev/vfio/vfio
//	g, err := c.OpenGroup(5)             // /dev/vfio/5; first group sets the type1v2 IOMMU
//	d, err := g.OpenDevice("0000:00:04.0")
//	ranges, err := c.IOVARanges()        // allocate IOVAs only from these
//	err = c.MapDMA(hugepageMem, iova)    // device may now read/write mem at iova
//	bar, err := d.MapRegion(4)           // BAR4, shared MMIO mapping
//	cfg := d.ConfigReader()              // io.ReaderAt over config space
//	err = d.EnableMSIX(eventfds)         // all vectors at once
//	defer c.Close()                      // closes everything below it too
//
// # Closing order
//
// Container.Close closes everything it owns, in the order the kernel needs:
// devices first (vfio-pci disables bus mastering and interrupts when the
// device fd is released, so the device stops DMA), then every DMA mapping
// still present is unmapped, then each group is detached from the container
// (VFIO_GROUP_UNSET_CONTAINER, which the kernel refuses while a device fd is
// open) and closed, and finally the container fd. Group.Close closes the
// group's devices, unsets the container and closes the group; Device.Close
// unmaps the device's region mappings and closes the device fd. All Close
// methods are idempotent. Detaching the last group from a container makes
// the kernel drop the IOMMU and every DMA mapping, so the container forgets
// its mappings then; the next OpenGroup sets the IOMMU again.
//
// Slices returned by MapRegion, and memory given to MapDMA, must not be
// used by the device or the program after the corresponding Close/Unmap.
//
// # Memory for DMA
//
// MapDMA pins the pages behind the slice it is given and makes them
// reachable by the device at the IOVA. The slice should come from memory
// outside the Go heap (the hugepage package); its address, length and the
// IOVA must be multiples of the IOMMU's smallest page size. Pinning needs
// CAP_IPC_LOCK or a large enough RLIMIT_MEMLOCK.
//
// The ioctl numbers and structure layouts follow include/uapi/linux/vfio.h;
// only 64-bit Linux is supported (the structures assume 8-byte alignment of
// 64-bit fields, as __aligned_u64 does).
package vfio
