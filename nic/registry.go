package nic

import (
	"context"
	"fmt"
	"sort"
	"sync"

	"github.com/vfnic/vfnic/pci"
)

// Driver is a NIC driver as registered with Register.
type Driver struct {
	// Name is the driver's name ("virtio").
	Name string
	// Match reports whether the driver handles the device.
	Match func(d pci.Device) bool
	// Open takes the device (binding it to vfio-pci) and brings it up.
	Open func(ctx context.Context, d pci.Device, cfg Config) (Device, error)
}

var (
	regMu   sync.RWMutex
	drivers []Driver
)

// Register adds a driver; drivers call it from init. A driver without a
// name, Match or Open, or with a name already taken, is refused with an
// error wrapping ErrInvalid.
func Register(d Driver) error {
	if d.Name == "" || d.Match == nil || d.Open == nil {
		return fmt.Errorf("%w: driver %q needs a name, Match and Open", ErrInvalid, d.Name)
	}
	regMu.Lock()
	defer regMu.Unlock()
	for _, o := range drivers {
		if o.Name == d.Name {
			return fmt.Errorf("%w: driver %q registered twice", ErrInvalid, d.Name)
		}
	}
	drivers = append(drivers, d)
	return nil
}

// Drivers lists the registered drivers' names, sorted.
func Drivers() []string {
	regMu.RLock()
	defer regMu.RUnlock()
	names := make([]string, len(drivers))
	for i, d := range drivers {
		names[i] = d.Name
	}
	sort.Strings(names)
	return names
}

// Lookup returns the first registered driver that matches the device.
func Lookup(d pci.Device) (Driver, bool) {
	regMu.RLock()
	defer regMu.RUnlock()
	for _, drv := range drivers {
		if drv.Match(d) {
			return drv, true
		}
	}
	return Driver{}, false
}

// Open finds the PCI device at addr ("0000:00:04.0" or "00:04.0") in sysfs,
// picks the registered driver that handles it and opens it with cfg. The
// driver binds the device to vfio-pci when it is on another driver (after
// the in-use check, see Config.Force) and gives it back to that driver on
// Close or when Open fails, unless Config.KeepBound; Info.PreviousDriver
// and Info.Rebound say what it found.
func Open(ctx context.Context, addr string, cfg Config) (Device, error) {
	if ctx == nil {
		return nil, fmt.Errorf("%w: nil context", ErrInvalid)
	}
	a, err := pci.ParseAddress(addr)
	if err != nil {
		return nil, err
	}
	d, err := pci.Lookup(a)
	if err != nil {
		return nil, err
	}
	drv, ok := Lookup(d)
	if !ok {
		return nil, fmt.Errorf("%w: %s (%04x:%04x) among %v", ErrNoDriver, a, d.VendorID, d.DeviceID, Drivers())
	}
	return drv.Open(ctx, d, cfg)
}
