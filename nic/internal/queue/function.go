package queue

import (
	"errors"

	"github.com/vfnic/vfnic/dma"
	"github.com/vfnic/vfnic/eventfd"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/nic/internal/owner"
	"github.com/vfnic/vfnic/vfio"
)

// The end of a device that drives a PCI function through VFIO (igb,
// virtio). Its DMA memory is freed only by the program's Close or a
// failed Open, never by the close that the kernel's request for the
// function starts: that close's hw only takes the memory out of the
// device's reach (ReleaseFunction, dma.Space.Detach), so that a frame
// lent before the kernel took the device back stays readable until the
// program closes the device.

// CloseFunction is nic.Device.Close for a driver of the PCI function own
// holds, its DMA memory space (nil when Open made none): Close with
// nic.ErrClosed, then, once a close the kernel's request started has
// ended too (own.Wait), the memory freed.
func (d *Device) CloseFunction(own *owner.Owner, space *dma.Space, hw func() error) error {
	err := d.Close(nic.ErrClosed, own, hw)
	own.Wait()
	return errors.Join(err, freeMemory(space))
}

// FailOpen releases what a failed Open of such a driver set up: the
// queues and hw torn down (Teardown), the memory freed, the function
// given back. It returns err joined with what that met.
func (d *Device) FailOpen(err error, own *owner.Owner, space *dma.Space, hw func() error) error {
	return errors.Join(err, d.Teardown(nic.ErrClosed, hw), freeMemory(space), own.GiveBack(nic.ErrClosed))
}

// ReleaseFunction is the end of such a driver's hw, once the device no
// longer uses its rings: MSI-X off (when efds were wired), bus mastering
// off, the DMA memory out of the device's reach but still mapped, the
// container and the eventfds closed. The parts a failed Open did not make
// are nil, and skipped.
func ReleaseFunction(vdev *vfio.Device, container *vfio.Container, space *dma.Space, efds []*eventfd.FD) error {
	var errs []error
	if vdev != nil {
		if len(efds) > 0 {
			errs = append(errs, vdev.DisableMSIX())
		}
		errs = append(errs, vdev.SetBusMaster(false))
	}
	if space != nil {
		errs = append(errs, space.Detach())
	}
	if container != nil {
		errs = append(errs, container.Close())
	}
	for _, e := range efds {
		errs = append(errs, e.Close())
	}
	return errors.Join(errs...)
}

// freeMemory unmaps space, which hw detached from the device.
func freeMemory(space *dma.Space) error {
	if space == nil {
		return nil
	}
	return space.Close()
}
