package vfio

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Group is an IOMMU group attached to a Container. Its methods are safe for
// concurrent use. Only Container.OpenGroup makes a Group: any other (the
// zero value) owns no descriptor, its OpenDevice returns an error matching
// ErrInvalid and its Close does nothing.
type Group struct {
	c    *Container // nil in a Group that OpenGroup did not make
	num  int
	path string

	mu      sync.Mutex
	fd      int
	closed  bool
	devices []*Device
}

// Number is the IOMMU group number.
func (g *Group) Number() int { return g.num }

// OpenDevice opens the device named addr (a PCI address such as
// "0000:00:04.0", as listed in /sys/kernel/iommu_groups/<n>/devices) with
// VFIO_GROUP_GET_DEVICE_FD and reads its device info. A device not in the
// group wraps ErrNoDevice; one already open (here or, with EBUSY, by the
// kernel's account) wraps ErrBusy. The device-request interrupt is
// registered at once (see Device.Request).
func (g *Group) OpenDevice(addr string) (*Device, error) {
	const op = "VFIO_GROUP_GET_DEVICE_FD"
	if addr == "" || strings.IndexByte(addr, 0) >= 0 {
		return nil, fmt.Errorf("vfio: %s on group %d: bad device name %q: %w", op, g.num, addr, ErrInvalid)
	}
	name, err := unix.BytePtrFromString(addr)
	if err != nil {
		return nil, fmt.Errorf("vfio: %s on group %d: bad device name %q: %w", op, g.num, addr, ErrInvalid)
	}
	if g.c == nil {
		return nil, errNotMade(op, "Group")
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil, fmt.Errorf("vfio: %s %s on group %d: %w", op, addr, g.num, ErrClosed)
	}
	// The kernel hands out several fds for one device, but two Devices
	// would each believe they own its interrupts and mappings.
	for _, d := range g.devices {
		if d.addr == addr {
			return nil, fmt.Errorf("vfio: %s: device %s is already open in group %d; use the existing Device: %w", op, addr, g.num, ErrBusy)
		}
	}
	fd, err := ioctlPtr(g.fd, ioctlGroupGetDeviceFD, unsafe.Pointer(name))
	if err != nil {
		switch err {
		case unix.ENODEV, unix.ENOENT:
			return nil, fmt.Errorf("vfio: %s: device %s is not in IOMMU group %d or not bound to vfio-pci: %w: %w", op, addr, g.num, err, ErrNoDevice)
		case unix.EBUSY:
			return nil, fmt.Errorf("vfio: %s: device %s is already open: %w: %w", op, addr, err, ErrBusy)
		}
		return nil, fmt.Errorf("vfio: %s: device %s in group %d: %w", op, addr, g.num, err)
	}
	d, err := newDevice(g, addr, fd)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	if err := d.registerRequest(); err != nil {
		unix.Close(fd)
		return nil, err
	}
	g.devices = append(g.devices, d)
	return d, nil
}

// forget drops a closed device from the group's list.
func (g *Group) forget(d *Device) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.devices = slices.DeleteFunc(g.devices, func(x *Device) bool { return x == d })
}

// closeDevices closes every device opened through the group.
func (g *Group) closeDevices() error {
	g.mu.Lock()
	devs := slices.Clone(g.devices)
	g.mu.Unlock()
	var errs []error
	for _, d := range devs {
		errs = append(errs, d.Close())
	}
	return errors.Join(errs...)
}

// Close closes the group's devices, detaches the group from its container
// (VFIO_GROUP_UNSET_CONTAINER) and closes the group fd. Detaching the
// container's last group makes the kernel drop the IOMMU and all DMA
// mappings. Idempotent. Close of a Group that OpenGroup did not make does
// nothing.
func (g *Group) Close() error {
	if g.c == nil {
		return nil
	}
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil
	}
	g.closed = true
	g.mu.Unlock()

	errs := []error{g.closeDevices()}
	// EINVAL is the kernel's "not attached to a container": when the
	// kernel took the device back (an unbind), it may have detached the
	// group itself once the device fd closed. The group ends detached
	// either way.
	if _, err := ioctl(g.fd, ioctlGroupUnsetContainer, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		errs = append(errs, fmt.Errorf("vfio: VFIO_GROUP_UNSET_CONTAINER on group %d (%s): %w", g.num, g.path, err))
	}
	if err := unix.Close(g.fd); err != nil {
		errs = append(errs, fmt.Errorf("vfio: close group %d (%s): %w", g.num, g.path, err))
	}
	g.c.detach(g)
	return errors.Join(errs...)
}
