// Package owner is a driver's hold on a PCI device (nic/internal: for
// the drivers only, off the consumer's page of package nic).
package owner

import (
	"context"
	"errors"
	"fmt"
	"github.com/vfnic/vfnic/nic"
	"time"

	"github.com/vfnic/vfnic/doctor"
	"github.com/vfnic/vfnic/eventfd"
	"github.com/vfnic/vfnic/pci"
)

// Owner is a driver's hold on a PCI device, the part of Open and Close that
// is the same for every driver: the readiness check before the binding
// changes, taking the device for vfio-pci (remembering its driver), giving
// it back, and letting go when the kernel asks through the VFIO
// device-request interrupt. A nil *Owner (a device a test built without
// a PCI device behind it) holds nothing: its methods do nothing.
type Owner struct {
	claim     pci.Claim
	keepBound bool
	watchDone chan struct{} // closed when Watch's goroutine ends
}

// TakeDevice checks that VFIO can work for a (doctor.CheckBind, one message
// naming the real cause, prefixed "driver: open ADDR") and then binds a to
// vfio-pci unless it already is, refusing a device in use unless
// cfg.Force. A device it bound goes back at GiveBack unless cfg.KeepBound.
func TakeDevice(ctx context.Context, driver string, a pci.Address, cfg nic.Config) (*Owner, error) {
	// Explain a machine where VFIO cannot work before touching the binding.
	if err := doctor.CheckBind(doctor.Env{}, a); err != nil {
		return nil, fmt.Errorf("%s: open %s: %w", driver, a, err)
	}
	claim, err := pci.Sysfs{}.Take(ctx, a, pci.TakeOptions{Force: cfg.Force})
	if err != nil {
		return nil, err
	}
	return &Owner{claim: claim, keepBound: cfg.KeepBound}, nil
}

// Record fills nic.Info's PreviousDriver and Rebound.
func (o *Owner) Record(in *nic.Info) {
	if o == nil {
		return
	}
	in.PreviousDriver, in.Rebound = o.claim.Previous, o.claim.Bound
}

// Watch starts a goroutine that waits on the device-request eventfd (nil:
// none) and calls release when the kernel asks for the device back (an
// unbind through sysfs, a hot-unplug). The kernel blocks until this
// process closes the device, so release must close it. The goroutine ends
// when req closes with the device; Wait waits for it.
func (o *Owner) Watch(req *eventfd.FD, release func()) {
	if o == nil || req == nil {
		return
	}
	o.watchDone = make(chan struct{})
	go func() {
		defer close(o.watchDone)
		if _, err := req.Wait(context.Background(), time.Time{}); err != nil {
			return // closed with the device
		}
		release()
	}()
}

// Wait waits for Watch's goroutine, once the device is closed.
func (o *Owner) Wait() {
	if o != nil && o.watchDone != nil {
		<-o.watchDone
	}
}

// GiveBack returns a device that TakeDevice bound to vfio-pci to the driver
// it had, unless nic.Config.KeepBound; the VFIO files must be closed. After a
// removal (why wraps nic.ErrRemoved) it first waits for the kernel's unbind to
// finish, which needs those files closed, so as not to bind into its
// middle.
func (o *Owner) GiveBack(why error) error {
	if o == nil || o.keepBound {
		return nil
	}
	var err error
	if errors.Is(why, nic.ErrRemoved) && o.claim.Bound {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = pci.Sysfs{}.WaitDriverGone(ctx, o.claim.Address, pci.VFIODriver)
		cancel()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return errors.Join(err, o.claim.Release(ctx))
}
