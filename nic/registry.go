package nic

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/vfnic/vfnic/pci"
)

// Driver is a NIC driver as registered with Register. A PCI driver sets
// Match and Open; a driver of devices that are not PCI functions (a host
// interface, a software NIC) sets Scheme and OpenName instead, and its
// devices are opened by names of the form "scheme:rest".
type Driver struct {
	// Name is the driver's name ("virtio").
	Name string
	// Match reports whether the driver handles the device.
	Match func(d pci.Device) bool
	// Open takes the device (binding it to vfio-pci) and brings it up.
	Open func(ctx context.Context, d pci.Device, cfg Config) (Device, error)

	// Scheme is the prefix before the first colon of the names this
	// driver opens ("afxdp" for "afxdp:eth1"). It must contain a letter
	// beyond a-f so that no PCI address ("0000:00:04.0") can be taken
	// for it.
	Scheme string
	// OpenName opens the device named by what follows "Scheme:".
	OpenName func(ctx context.Context, name string, cfg Config) (Device, error)
}

func (d Driver) pciDriver() bool { return d.Match != nil || d.Open != nil }

var (
	regMu   sync.RWMutex
	drivers []Driver
)

// Register adds a driver; drivers call it from init. A driver without a
// name, Match or Open, or with a name already taken, is refused with an
// error wrapping ErrInvalid.
func Register(d Driver) error {
	named := d.Scheme != "" || d.OpenName != nil
	switch {
	case d.Name == "":
		return fmt.Errorf("%w: a driver needs a name", ErrInvalid)
	case named && d.pciDriver():
		return fmt.Errorf("%w: driver %q sets both Match/Open and Scheme/OpenName", ErrInvalid, d.Name)
	case named && (d.OpenName == nil || !validScheme(d.Scheme)):
		return fmt.Errorf("%w: driver %q needs OpenName and a scheme of lower-case letters and digits with a letter beyond a-f, not %q", ErrInvalid, d.Name, d.Scheme)
	case !named && (d.Match == nil || d.Open == nil):
		return fmt.Errorf("%w: driver %q needs Match and Open (or Scheme and OpenName)", ErrInvalid, d.Name)
	}
	regMu.Lock()
	defer regMu.Unlock()
	for _, o := range drivers {
		if o.Name == d.Name {
			return fmt.Errorf("%w: driver %q registered twice", ErrInvalid, d.Name)
		}
		if named && o.Scheme == d.Scheme {
			return fmt.Errorf("%w: scheme %q of driver %q is taken by %q", ErrInvalid, d.Scheme, d.Name, o.Name)
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
		if drv.Match != nil && drv.Match(d) {
			return drv, true
		}
	}
	return Driver{}, false
}

// Schemes lists the name schemes of the registered non-PCI drivers, sorted.
func Schemes() []string {
	regMu.RLock()
	defer regMu.RUnlock()
	var s []string
	for _, d := range drivers {
		if d.Scheme != "" {
			s = append(s, d.Scheme)
		}
	}
	sort.Strings(s)
	return s
}

// validScheme: lower-case letters and digits, starting with a letter, with
// at least one letter that is not a hex digit.
func validScheme(s string) bool {
	if s == "" || s[0] < 'a' || s[0] > 'z' {
		return false
	}
	nonHex := false
	for _, c := range []byte(s) {
		switch {
		case c >= 'g' && c <= 'z':
			nonHex = true
		case c >= 'a' && c <= 'f', c >= '0' && c <= '9':
		default:
			return false
		}
	}
	return nonHex
}

// lookupScheme returns the driver whose scheme prefixes addr and the rest
// of the name, if addr has the form "scheme:rest".
func lookupScheme(addr string) (Driver, string, bool) {
	scheme, rest, ok := strings.Cut(addr, ":")
	if !ok || !validScheme(scheme) {
		return Driver{}, "", false
	}
	regMu.RLock()
	defer regMu.RUnlock()
	for _, d := range drivers {
		if d.Scheme == scheme {
			return d, rest, true
		}
	}
	return Driver{}, rest, false
}

// Open opens a device by name. A name "scheme:rest" whose scheme a
// registered driver claims ("afxdp:eth1") goes to that driver's OpenName.
// Any other name is a PCI address ("0000:00:04.0" or "00:04.0"): Open finds
// the device in sysfs, picks the registered driver that handles it and
// opens it with cfg. The
// driver binds the device to vfio-pci when it is on another driver (after
// the in-use check, see Config.Force) and gives it back to that driver on
// Close or when Open fails, unless Config.KeepBound; Info.PreviousDriver
// and Info.Rebound say what it found.
func Open(ctx context.Context, addr string, cfg Config) (Device, error) {
	if ctx == nil {
		return nil, fmt.Errorf("%w: nil context", ErrInvalid)
	}
	if drv, rest, ok := lookupScheme(addr); ok {
		return drv.OpenName(ctx, rest, cfg)
	} else if scheme, _, _ := strings.Cut(addr, ":"); validScheme(scheme) {
		return nil, fmt.Errorf("%w: %q: no driver for scheme %q among %v", ErrNoDriver, addr, scheme, Schemes())
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
