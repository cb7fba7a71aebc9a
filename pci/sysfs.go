package pci

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// ErrNotFound reports a PCI address with no device under the sysfs root.
// It also matches fs.ErrNotExist (os.ErrNotExist), so that callers that
// know only the os package's errors see a missing device as missing.
var ErrNotFound error = &notFoundError{"pci: device not found"}

// notFoundError is ErrNotFound's type; errors.Is compares the pointer (of
// a type that is not zero-sized, so no other pointer equals it).
type notFoundError struct{ msg string }

func (e *notFoundError) Error() string { return e.msg }
func (e *notFoundError) Unwrap() error { return fs.ErrNotExist }

// ErrUnreadable reports a device whose sysfs attributes List could not
// read or parse; the other devices are still listed.
var ErrUnreadable = errors.New("pci: device unreadable")

// DefaultRoot is where sysfs is mounted on a normal system.
const DefaultRoot = "/sys"

// ClassNetwork is the PCI base class of network controllers.
const ClassNetwork = 0x02

// Sysfs reads and changes PCI state under a sysfs mount. The zero value uses
// DefaultRoot; tests point Root at a fake tree.
type Sysfs struct {
	// Root is the sysfs mount point; "" means DefaultRoot.
	Root string
	// Proc is the procfs mount point the holder check reads; "" means
	// /proc.
	Proc string
	// Dev is the device directory that holds vfio/<group>; "" means /dev.
	Dev string
}

func (s Sysfs) proc() string {
	if s.Proc == "" {
		return "/proc"
	}
	return s.Proc
}

func (s Sysfs) dev() string {
	if s.Dev == "" {
		return "/dev"
	}
	return s.Dev
}

func (s Sysfs) root() string {
	if s.Root == "" {
		return DefaultRoot
	}
	return s.Root
}

// path joins elements below the sysfs root.
func (s Sysfs) path(elem ...string) string {
	return filepath.Join(append([]string{s.root()}, elem...)...)
}

// devDir is the device's directory, <root>/bus/pci/devices/<addr>.
func (s Sysfs) devDir(a Address) string {
	return s.path("bus", "pci", "devices", a.String())
}

// Device is the identity and kernel state of one PCI function, as sysfs
// reported it when it was read.
type Device struct {
	Address           Address
	VendorID          uint16
	DeviceID          uint16
	SubsystemVendorID uint16
	SubsystemID       uint16
	// Class is the 24-bit class code: base class, subclass, programming interface.
	Class    uint32
	Revision uint8
	// IOMMUGroup is the device's IOMMU group number, or -1 when it has none
	// (no IOMMU, or IOMMU disabled).
	IOMMUGroup int
	// Driver is the name of the bound kernel driver, "" when unbound.
	Driver string
	// DriverOverride is the driver_override value, "" when unset.
	DriverOverride string
	// NetInterfaces are the kernel network interfaces the device carries,
	// sorted; they sit in <dev>/net or, for virtio, in <dev>/virtioN/net.
	NetInterfaces []string
	// NUMANode is the device's NUMA node, -1 when unknown.
	NUMANode int
}

// IsNetwork reports whether the device is a network controller (class 0x02).
func (d Device) IsNetwork() bool { return d.Class>>16 == ClassNetwork }

// ListOptions filters List. Zero fields match everything.
type ListOptions struct {
	VendorID    uint16 // 0 matches any vendor
	DeviceID    uint16 // 0 matches any device
	NetworkOnly bool   // only class 0x02 devices
	Driver      string // only devices bound to this driver
}

func (o ListOptions) match(d Device) bool {
	return (o.VendorID == 0 || o.VendorID == d.VendorID) &&
		(o.DeviceID == 0 || o.DeviceID == d.DeviceID) &&
		(!o.NetworkOnly || d.IsNetwork()) &&
		(o.Driver == "" || o.Driver == d.Driver)
}

// List returns the devices under <root>/bus/pci/devices that match opts,
// sorted by address. Entries whose names are not PCI addresses this package
// can represent (for example VMD domains above 0xffff) are skipped.
//
// One unreadable device does not hide the others: List returns every
// device it could read and, when some could not be read, an error joining
// one error per such device, each wrapping ErrUnreadable and naming the
// address. Callers that only need the readable devices may use the slice
// and report the error as a warning.
func (s Sysfs) List(opts ListOptions) ([]Device, error) {
	dir := s.path("bus", "pci", "devices")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("pci: list devices: %w", err)
	}
	var out []Device
	var bad []error
	for _, e := range ents {
		a, err := ParseAddress(e.Name())
		if err != nil {
			continue
		}
		d, err := s.readDevice(a)
		if errors.Is(err, ErrNotFound) {
			continue // hot-unplugged while we listed
		}
		if err != nil {
			bad = append(bad, fmt.Errorf("%w: %s: %w", ErrUnreadable, a, err))
			continue
		}
		if opts.match(d) {
			out = append(out, d)
		}
	}
	sort.Slice(out, func(i, j int) bool { return less(out[i].Address, out[j].Address) })
	return out, errors.Join(bad...)
}

func less(a, b Address) bool {
	if a.Domain != b.Domain {
		return a.Domain < b.Domain
	}
	if a.Bus != b.Bus {
		return a.Bus < b.Bus
	}
	if a.Device != b.Device {
		return a.Device < b.Device
	}
	return a.Function < b.Function
}

// Lookup reads the device at a. A missing device gives an error wrapping
// ErrNotFound.
func (s Sysfs) Lookup(a Address) (Device, error) {
	return s.readDevice(a)
}

// List lists devices under DefaultRoot; see Sysfs.List.
func List(opts ListOptions) ([]Device, error) { return Sysfs{}.List(opts) }

// Lookup reads one device under DefaultRoot; see Sysfs.Lookup.
func Lookup(a Address) (Device, error) { return Sysfs{}.Lookup(a) }

func (s Sysfs) readDevice(a Address) (Device, error) {
	dir := s.devDir(a)
	if _, err := os.Stat(dir); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return Device{}, fmt.Errorf("%w: %s (no %s)", ErrNotFound, a, dir)
		}
		return Device{}, fmt.Errorf("pci: lookup %s: %w", a, err)
	}
	d := Device{Address: a, IOMMUGroup: -1, NUMANode: -1}
	// vendor, device and class are always present on a real device; the
	// others are optional so that older kernels and minimal trees still work.
	ids := []struct {
		name     string
		bits     int
		required bool
		set      func(uint64)
	}{
		{"vendor", 16, true, func(v uint64) { d.VendorID = uint16(v) }},
		{"device", 16, true, func(v uint64) { d.DeviceID = uint16(v) }},
		{"class", 24, true, func(v uint64) { d.Class = uint32(v) }},
		{"subsystem_vendor", 16, false, func(v uint64) { d.SubsystemVendorID = uint16(v) }},
		{"subsystem_device", 16, false, func(v uint64) { d.SubsystemID = uint16(v) }},
		{"revision", 8, false, func(v uint64) { d.Revision = uint8(v) }},
	}
	for _, id := range ids {
		txt, err := readAttr(filepath.Join(dir, id.name))
		if errors.Is(err, fs.ErrNotExist) && !id.required {
			continue
		}
		if err != nil {
			return Device{}, fmt.Errorf("pci: read %s of %s: %w", id.name, a, err)
		}
		v, err := strconv.ParseUint(txt, 0, id.bits)
		if err != nil {
			return Device{}, fmt.Errorf("pci: parse %s of %s: %w", id.name, a, err)
		}
		id.set(v)
	}

	if txt, err := readAttr(filepath.Join(dir, "numa_node")); err == nil {
		n, err := strconv.Atoi(txt)
		if err != nil {
			return Device{}, fmt.Errorf("pci: parse numa_node of %s: %w", a, err)
		}
		d.NUMANode = n
	} else if !errors.Is(err, fs.ErrNotExist) {
		return Device{}, fmt.Errorf("pci: read numa_node of %s: %w", a, err)
	}

	if g, err := linkBase(filepath.Join(dir, "iommu_group")); err != nil {
		return Device{}, fmt.Errorf("pci: read iommu_group of %s: %w", a, err)
	} else if g != "" {
		n, err := strconv.Atoi(g)
		if err != nil || n < 0 {
			return Device{}, fmt.Errorf("pci: iommu_group of %s names %q, not a group number", a, g)
		}
		d.IOMMUGroup = n
	}

	drv, err := linkBase(filepath.Join(dir, "driver"))
	if err != nil {
		return Device{}, fmt.Errorf("pci: read driver of %s: %w", a, err)
	}
	d.Driver = drv

	if o, err := readAttr(filepath.Join(dir, "driver_override")); err == nil {
		if o != "(null)" { // the kernel prints "(null)" when no override is set
			d.DriverOverride = o
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return Device{}, fmt.Errorf("pci: read driver_override of %s: %w", a, err)
	}

	if d.NetInterfaces, err = netInterfaces(dir); err != nil {
		return Device{}, fmt.Errorf("pci: read net interfaces of %s: %w", a, err)
	}
	return d, nil
}

// netInterfaces lists <dir>/net/* and <dir>/<child>/net/*: virtio-net hangs
// its interface off a virtioN child device rather than the PCI function.
func netInterfaces(dir string) ([]string, error) {
	names, err := readDirNames(filepath.Join(dir, "net"))
	if err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		// Only real subdirectories: symlinks such as driver, subsystem or
		// iommu_group lead elsewhere in sysfs.
		if !e.IsDir() || e.Name() == "net" {
			continue
		}
		more, err := readDirNames(filepath.Join(dir, e.Name(), "net"))
		if err != nil {
			return nil, err
		}
		names = append(names, more...)
	}
	sort.Strings(names)
	return names, nil
}

// readDirNames returns the entry names of dir, none when it does not exist.
func readDirNames(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	names := make([]string, len(ents))
	for i, e := range ents {
		names[i] = e.Name()
	}
	return names, nil
}

// readAttr reads a sysfs attribute without its trailing newline.
func readAttr(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// linkBase returns the last element of the symlink at path, "" when the link
// does not exist.
func linkBase(path string) (string, error) {
	t, err := os.Readlink(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return filepath.Base(t), nil
}

// Config reads the device's configuration space from <dev>/config and
// decodes it. Without root, the kernel exposes only the first 64 bytes, which
// is not enough to walk capabilities.
func (s Sysfs) Config(a Address) (*Config, error) {
	p := filepath.Join(s.devDir(a), "config")
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		if _, serr := os.Stat(s.devDir(a)); errors.Is(serr, fs.ErrNotExist) {
			return nil, fmt.Errorf("%w: %s", ErrNotFound, a)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("pci: open config of %s: %w", a, err)
	}
	defer f.Close()
	c, err := ReadConfig(f)
	if err != nil {
		return nil, fmt.Errorf("pci: config of %s: %w", a, err)
	}
	return c, nil
}
