package virtio

import (
	"context"
	"fmt"
	"time"

	"github.com/vfnic/vfnic/doorbell"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/pci"
)

// transport is the virtio PCI modern interface: the common configuration,
// notification and device configuration structures that the vendor
// capabilities place in the BARs. It works on any register windows, so
// that tests can hand it ordinary memory.
type transport struct {
	name      string // device name for errors
	common    doorbell.Window
	notify    doorbell.Window
	notifyMul uint32
	device    doorbell.Window // device configuration; may be empty
}

// barMapper maps a BAR and returns the bytes of [off, off+n) in it.
type barMapper func(bar uint8, off, n uint64) ([]byte, error)

// newTransport maps the first usable capability of each structure type
// (pci.VirtioStructures applies the specification's rule).
func newTransport(name string, caps []pci.VirtioCap, mapBAR barMapper) (*transport, error) {
	t := &transport{name: name}
	found := pci.VirtioStructures(caps)
	window := func(typ uint8, minLen uint64) (doorbell.Window, pci.VirtioCap, error) {
		c, ok := found[typ]
		if !ok {
			return doorbell.Window{}, c, fmt.Errorf("%w: %s: no virtio capability of type %d (not a modern virtio device?)", nic.ErrNotSupported, name, typ)
		}
		if c.Length < minLen {
			return doorbell.Window{}, c, fmt.Errorf("%w: %s: virtio structure type %d is %d bytes, need %d", nic.ErrNotSupported, name, typ, c.Length, minLen)
		}
		b, err := mapBAR(c.Bar, c.Offset, c.Length)
		if err != nil {
			return doorbell.Window{}, c, fmt.Errorf("virtio: map structure type %d (BAR %d offset %#x length %#x) of %s: %w", typ, c.Bar, c.Offset, c.Length, name, err)
		}
		return doorbell.NewWindow(b), c, nil
	}
	var err error
	if t.common, _, err = window(pci.VirtioCommonCfg, commonCfgMinLen); err != nil {
		return nil, err
	}
	var nc pci.VirtioCap
	if t.notify, nc, err = window(pci.VirtioNotifyCfg, 2); err != nil {
		return nil, err
	}
	t.notifyMul = nc.NotifyOffMultiplier
	if _, ok := found[pci.VirtioDeviceCfg]; ok {
		if t.device, _, err = window(pci.VirtioDeviceCfg, 1); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// Register accessors. Every offset is a constant inside the common
// structure, whose length newTransport checked, so the window's range
// errors cannot occur.
func (t *transport) r8(off uintptr) uint8    { v, _ := t.common.Read8(off); return v }
func (t *transport) r16(off uintptr) uint16  { v, _ := t.common.Read16(off); return v }
func (t *transport) r32(off uintptr) uint32  { v, _ := t.common.Read32(off); return v }
func (t *transport) w8(off uintptr, v uint8) { _ = t.common.Write8(off, v) }
func (t *transport) w16(off uintptr, v uint16) {
	_ = t.common.Write16(off, v)
}
func (t *transport) w32(off uintptr, v uint32) { _ = t.common.Write32(off, v) }

// w64 writes a 64-bit queue address as two 32-bit halves, low first, the
// access width the specification allows for these fields.
func (t *transport) w64(off uintptr, v uint64) {
	t.w32(off, uint32(v))
	t.w32(off+4, uint32(v>>32))
}

func (t *transport) status() uint8 { return t.r8(regDeviceStatus) }

func (t *transport) setStatus(s uint8) { t.w8(regDeviceStatus, s) }

// reset writes status 0 and waits until the device reads back 0: the
// device has then stopped using every queue and forgotten their memory.
// The device has no other reset through VFIO.
func (t *transport) reset(ctx context.Context, timeout time.Duration) error {
	t.setStatus(0)
	deadline := time.Now().Add(timeout)
	for t.status() != 0 {
		if !time.Now().Before(deadline) {
			return fmt.Errorf("%w: %s: status still %#x %v after reset", nic.ErrDeviceFailed, t.name, t.status(), timeout)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		time.Sleep(50 * time.Microsecond)
	}
	return nil
}

// deviceFeatures reads the 64 offered feature bits.
func (t *transport) deviceFeatures() Features {
	t.w32(regDeviceFeatureSelect, 0)
	lo := t.r32(regDeviceFeature)
	t.w32(regDeviceFeatureSelect, 1)
	hi := t.r32(regDeviceFeature)
	return Features(uint64(hi)<<32 | uint64(lo))
}

// setDriverFeatures writes the 64 accepted feature bits.
func (t *transport) setDriverFeatures(f Features) {
	t.w32(regDriverFeatureSelect, 0)
	t.w32(regDriverFeature, uint32(f))
	t.w32(regDriverFeatureSelect, 1)
	t.w32(regDriverFeature, uint32(f>>32))
}

// notifyReg returns the doorbell of a queue whose queue_notify_off is off.
func (t *transport) notifyReg(off uint16) (doorbell.Reg16, error) {
	r, err := t.notify.Reg16(uintptr(off) * uintptr(t.notifyMul))
	if err != nil {
		return r, fmt.Errorf("%w: %s: queue notify offset %d x %d outside the notify structure (%d bytes): %v",
			nic.ErrNotSupported, t.name, off, t.notifyMul, t.notify.Size(), err)
	}
	return r, nil
}

// readConfig reads device configuration fields through fn, retrying while
// the configuration generation changes under it (a multi-field read must
// see one consistent snapshot).
func (t *transport) readConfig(fn func(w doorbell.Window) error) error {
	for range 16 {
		before := t.r8(regConfigGeneration)
		if err := fn(t.device); err != nil {
			return fmt.Errorf("%w: %s: device configuration: %v", nic.ErrNotSupported, t.name, err)
		}
		if t.r8(regConfigGeneration) == before {
			return nil
		}
	}
	return fmt.Errorf("%w: %s: device configuration kept changing while read", nic.ErrDeviceFailed, t.name)
}
