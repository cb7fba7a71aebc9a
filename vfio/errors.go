package vfio

import (
	"errors"
	"fmt"
	"os"
)

// Sentinel errors; every error returned by this package that has one of
// these causes wraps it (use errors.Is). Errors from a failed ioctl also
// wrap the unix.Errno the kernel returned.
var (
	// ErrNoVFIO: /dev/vfio/vfio is missing; the vfio modules are not loaded.
	ErrNoVFIO = errors.New("vfio: VFIO not available")
	// ErrNotVFIO: a path opened as a container or group is not a VFIO device file.
	ErrNotVFIO = errors.New("vfio: not a VFIO device file")
	// ErrNotSupported: the kernel or device lacks a required feature
	// (API version, type1v2 IOMMU, reset, IOVA range reporting, ...).
	ErrNotSupported = errors.ErrUnsupported
	// ErrGroupNotViable: some device of the IOMMU group is bound to a host driver.
	ErrGroupNotViable = errors.New("vfio: IOMMU group not viable")
	// ErrNoDevice: the group or device does not exist (or is not bound to vfio-pci).
	ErrNoDevice = errors.New("vfio: no such group or device")
	// ErrBusy: the group or device is already in use.
	ErrBusy = errors.New("vfio: busy")
	// ErrNoGroup: the container has no group attached, so no IOMMU is set.
	ErrNoGroup = errors.New("vfio: no group attached to the container")
	// ErrOutOfRange: an IOVA range lies outside the IOMMU's usable ranges,
	// or an index/count is beyond what the device reports.
	ErrOutOfRange = errors.New("vfio: out of range")
	// ErrUnaligned: an address or size is not a multiple of the required page size.
	ErrUnaligned = errors.New("vfio: not aligned to the IOMMU page size")
	// ErrOverlap: a DMA mapping would overlap or split an existing one.
	ErrOverlap = errors.New("vfio: overlaps an existing DMA mapping")
	// ErrNotMapped: nothing is mapped in the IOVA range given to UnmapDMA.
	ErrNotMapped = errors.New("vfio: no DMA mapping in range")
	// ErrNotMappable: the region cannot be mmap'ed (no MMAP flag, empty, or no mmap-able area).
	ErrNotMappable = errors.New("vfio: region cannot be mmap'ed")
	// ErrBadInfo: the kernel's info structure or capability chain is malformed.
	ErrBadInfo = errors.New("vfio: malformed info structure")
	// ErrInvalid: an argument is invalid (negative index, empty list, ...),
	// or a Container, Group or Device is a zero value this package did not
	// open. It is os.ErrInvalid.
	ErrInvalid = os.ErrInvalid
	// ErrClosed: the container, group, device or mapping was closed. It is
	// os.ErrClosed.
	ErrClosed = os.ErrClosed
)

// errNotMade reports op on a what (Container, Group, Device) that this
// package did not open: a zero value, which owns no descriptor.
func errNotMade(op, what string) error {
	return fmt.Errorf("vfio: %s on a %s that this package did not open (a zero value): %w", op, what, ErrInvalid)
}
