package vfio

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/vfnic/vfnic/eventfd"
)

// IRQInfo is what VFIO_DEVICE_GET_IRQ_INFO reports for one IRQ index.
type IRQInfo struct {
	Index int
	Flags IRQFlags
	Count int // vectors in this index; 0 when the device lacks it
}

// irqName names vfio-pci IRQ indexes in errors.
func irqName(index int) string {
	switch index {
	case IRQINTx:
		return "INTx"
	case IRQMSI:
		return "MSI"
	case IRQMSIX:
		return "MSI-X"
	case IRQErr:
		return "ERR"
	case IRQReq:
		return "REQ"
	}
	return fmt.Sprintf("IRQ index %d", index)
}

// IRQInfo returns the flags and vector count of IRQ index (IRQINTx,
// IRQMSI, IRQMSIX, ...).
func (d *Device) IRQInfo(index int) (IRQInfo, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.irqInfoLocked(index)
}

func (d *Device) irqInfoLocked(index int) (IRQInfo, error) {
	const op = "VFIO_DEVICE_GET_IRQ_INFO"
	if err := d.usableLocked(op); err != nil {
		return IRQInfo{}, err
	}
	if index < 0 || index >= d.info.NumIRQs {
		return IRQInfo{}, d.errf(op, fmt.Errorf("IRQ index %d: device has indexes 0..%d: %w", index, d.info.NumIRQs-1, ErrOutOfRange))
	}
	ii := irqInfo{Argsz: uint32(sizeofIRQInfo), Index: uint32(index)}
	if _, err := ioctlPtr(d.fd, ioctlDeviceGetIRQInfo, unsafe.Pointer(&ii)); err != nil {
		return IRQInfo{}, d.errf(op, fmt.Errorf("%s: %w", irqName(index), err))
	}
	return IRQInfo{Index: int(ii.Index), Flags: IRQFlags(ii.Flags), Count: int(ii.Count)}, nil
}

// irqSetBuf builds a struct vfio_irq_set followed by its data: one s32
// eventfd per vector for DATA_EVENTFD, nothing otherwise.
func irqSetBuf(flags uint32, index, start, count int, fds []int) []byte {
	n := sizeofIRQSet + 4*len(fds)
	buf := make([]byte, n)
	ne.PutUint32(buf[0:], uint32(n))
	ne.PutUint32(buf[4:], flags)
	ne.PutUint32(buf[8:], uint32(index))
	ne.PutUint32(buf[12:], uint32(start))
	ne.PutUint32(buf[16:], uint32(count))
	for i, fd := range fds {
		ne.PutUint32(buf[sizeofIRQSet+4*i:], uint32(int32(fd)))
	}
	return buf
}

// checkIRQFDs validates an EnableIRQ request against the index's info.
func checkIRQFDs(info IRQInfo, fds []int) error {
	name := irqName(info.Index)
	if len(fds) == 0 {
		return fmt.Errorf("%s: no eventfds given (use DisableIRQ to disable): %w", name, ErrInvalid)
	}
	if info.Count == 0 {
		return fmt.Errorf("%s: device has no %s vectors: %w", name, name, ErrNotSupported)
	}
	if info.Flags&IRQFlagEventfd == 0 {
		return fmt.Errorf("%s: index cannot signal eventfds: %w", name, ErrNotSupported)
	}
	if len(fds) > info.Count {
		return fmt.Errorf("%s: %d eventfds but the device has only %d vectors: %w", name, len(fds), info.Count, ErrOutOfRange)
	}
	for i, fd := range fds {
		if fd < -1 || fd > math.MaxInt32 {
			return fmt.Errorf("%s: vector %d: bad eventfd %d (use -1 to leave a vector unwired): %w", name, i, fd, ErrInvalid)
		}
	}
	return nil
}

// exclusiveIRQ reports whether index is one of INTx/MSI/MSI-X, of which
// vfio-pci enables only one at a time.
func exclusiveIRQ(index int) bool {
	return index == IRQINTx || index == IRQMSI || index == IRQMSIX
}

// EnableIRQ wires vectors 0..len(fds)-1 of IRQ index to the caller's
// eventfds in one VFIO_DEVICE_SET_IRQS call (DATA_EVENTFD|ACTION_TRIGGER);
// -1 leaves a vector unwired. The kernel enables the vectors as one set:
// with IRQFlagNoResize (MSI-X on kernels before 6.5, MSI always) the set
// cannot grow while enabled, so wire every vector you need at once. Calling
// again with at most as many fds rewires them; more fds needs DisableIRQ
// first. Only one of INTx, MSI and MSI-X can be enabled at a time.
func (d *Device) EnableIRQ(index int, fds []int) error {
	const op = "VFIO_DEVICE_SET_IRQS"
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.usableLocked(op); err != nil {
		return err
	}
	// State checks first: they need no ioctl and give clearer errors than
	// the kernel's EINVAL.
	if n, on := d.irqs[index]; on && len(fds) > n {
		return d.errf(op, fmt.Errorf("%s: enabled with %d vectors, cannot grow to %d: disable it first: %w", irqName(index), n, len(fds), ErrInvalid))
	}
	if exclusiveIRQ(index) {
		for other := range d.irqs {
			if other != index && exclusiveIRQ(other) {
				return d.errf(op, fmt.Errorf("%s is enabled: disable it before enabling %s: %w", irqName(other), irqName(index), ErrBusy))
			}
		}
	}
	info, err := d.irqInfoLocked(index)
	if err != nil {
		return err
	}
	if err := checkIRQFDs(info, fds); err != nil {
		return d.errf(op, err)
	}
	buf := irqSetBuf(irqSetDataEventfd|irqSetActionTrigger, index, 0, len(fds), fds)
	if _, err := ioctlBuf(d.fd, ioctlDeviceSetIRQs, buf); err != nil {
		return d.errf(op, fmt.Errorf("enable %s with %d eventfds: %w", irqName(index), len(fds), err))
	}
	if _, on := d.irqs[index]; !on {
		d.irqs[index] = len(fds)
	}
	return nil
}

// DisableIRQ tears down every vector of IRQ index
// (DATA_NONE|ACTION_TRIGGER, count 0). Disabling an index that is not
// enabled does nothing.
func (d *Device) DisableIRQ(index int) error {
	const op = "VFIO_DEVICE_SET_IRQS"
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.usableLocked(op); err != nil {
		return err
	}
	if _, on := d.irqs[index]; !on {
		return nil
	}
	buf := irqSetBuf(irqSetDataNone|irqSetActionTrigger, index, 0, 0, nil)
	if _, err := ioctlBuf(d.fd, ioctlDeviceSetIRQs, buf); err != nil {
		return d.errf(op, fmt.Errorf("disable %s: %w", irqName(index), err))
	}
	delete(d.irqs, index)
	return nil
}

// irqActionLocked applies a DATA_NONE action to one enabled vector.
func (d *Device) irqActionLocked(action uint32, what string, index, vector int) error {
	const op = "VFIO_DEVICE_SET_IRQS"
	if err := d.usableLocked(op); err != nil {
		return err
	}
	n, on := d.irqs[index]
	if !on {
		return d.errf(op, fmt.Errorf("%s %s vector %d: index not enabled: %w", what, irqName(index), vector, ErrInvalid))
	}
	if vector < 0 || vector >= n {
		return d.errf(op, fmt.Errorf("%s %s vector %d: %d vectors enabled: %w", what, irqName(index), vector, n, ErrOutOfRange))
	}
	buf := irqSetBuf(irqSetDataNone|action, index, vector, 1, nil)
	if _, err := ioctlBuf(d.fd, ioctlDeviceSetIRQs, buf); err != nil {
		return d.errf(op, fmt.Errorf("%s %s vector %d: %w", what, irqName(index), vector, err))
	}
	return nil
}

// TriggerIRQ makes the kernel signal vector's eventfd as if the device had
// raised it (DATA_NONE|ACTION_TRIGGER, count 1): a loopback test of the
// eventfd wiring that needs no device activity.
func (d *Device) TriggerIRQ(index, vector int) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.irqActionLocked(irqSetActionTrigger, "trigger", index, vector)
}

// UnmaskIRQ unmasks vector (DATA_NONE|ACTION_UNMASK): INTx is
// IRQFlagAutomasked, so after each interrupt it stays masked until this.
func (d *Device) UnmaskIRQ(index, vector int) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.irqActionLocked(irqSetActionUnmask, "unmask", index, vector)
}

// EnableMSIX wires MSI-X vectors 0..len(fds)-1 to fds in one SET_IRQS call;
// see EnableIRQ. MSI-X reports NORESIZE: wire all vectors needed at once.
func (d *Device) EnableMSIX(fds []int) error { return d.EnableIRQ(IRQMSIX, fds) }

// DisableMSIX tears down all MSI-X vectors.
func (d *Device) DisableMSIX() error { return d.DisableIRQ(IRQMSIX) }

// EnableMSI wires MSI vectors 0..len(fds)-1 to fds; see EnableIRQ.
func (d *Device) EnableMSI(fds []int) error { return d.EnableIRQ(IRQMSI, fds) }

// DisableMSI tears down MSI.
func (d *Device) DisableMSI() error { return d.DisableIRQ(IRQMSI) }

// EnableINTx wires the legacy interrupt to fd. INTx is automasked: call
// UnmaskIRQ(IRQINTx, 0) after handling each interrupt.
func (d *Device) EnableINTx(fd int) error { return d.EnableIRQ(IRQINTx, []int{fd}) }

// DisableINTx tears down INTx.
func (d *Device) DisableINTx() error { return d.DisableIRQ(IRQINTx) }

// registerRequest wires the device-request interrupt (VFIO_PCI_REQ_IRQ_INDEX)
// to an eventfd the device owns. Without it, a kernel unbind of a device
// this process holds blocks ("No device request channel registered,
// blocked until released by user") until the process exits; with it the
// kernel signals the eventfd, every 10 s until the device is closed. A
// device without the index (older kernels) gets no Request eventfd.
func (d *Device) registerRequest() error {
	if d.info.NumIRQs <= IRQReq {
		return nil
	}
	info, err := d.IRQInfo(IRQReq)
	if err != nil {
		return err
	}
	if info.Count == 0 || info.Flags&IRQFlagEventfd == 0 {
		return nil
	}
	e, err := eventfd.New()
	if err != nil {
		return d.errf("VFIO_DEVICE_SET_IRQS", fmt.Errorf("eventfd for the request interrupt: %w", err))
	}
	if err := d.EnableIRQ(IRQReq, []int{e.Fd()}); err != nil {
		e.Close()
		return err
	}
	d.mu.Lock()
	d.req = e
	d.mu.Unlock()
	return nil
}

// Request is the eventfd the kernel signals when it asks for the device
// back: its driver is being unbound (a write to the sysfs unbind file) or
// the device is being removed. The unbind waits until this process closes
// the device, so a driver that sees it firing stops its queues and closes
// the device. Nil when the device has no request interrupt. The device
// owns the eventfd and closes it in Close.
func (d *Device) Request() *eventfd.FD {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.req
}
