package pci

import (
	"errors"
	"io/fs"
	"os"
	"reflect"
	"strings"
	"testing"
)

// standardTree has a virtio-net NIC on virtio-pci (interface under
// virtio0/net), an e1000e NIC bound to vfio-pci, an unbound igb NIC with
// its interface gone, and a host bridge without IOMMU group or driver.
func standardTree(t *testing.T) *fakeSys {
	f := newFakeSys(t)
	for _, d := range []string{"virtio-pci", "vfio-pci", "e1000e", "igb"} {
		f.addDriver(d)
	}
	f.addDevice(fakeDev{addr: "0000:00:00.0", vendor: 0x8086, device: 0x29c0, class: 0x060000, group: -1})
	f.addDevice(fakeDev{addr: "0000:00:03.0", vendor: 0x1af4, device: 0x1041, subVendor: 0x1af4, subDevice: 0x1100,
		class: 0x020000, rev: 1, group: 7, driver: "virtio-pci", nets: []string{"eth0"}, virtioNet: true, numa: "0"})
	f.addDevice(fakeDev{addr: "0000:00:04.0", vendor: 0x8086, device: 0x10d3, subVendor: 0x8086, subDevice: 0x0000,
		class: 0x020000, group: 8, driver: "vfio-pci", override: "vfio-pci", numa: "-1"})
	f.addDevice(fakeDev{addr: "0001:02:00.1", vendor: 0x8086, device: 0x10c9, class: 0x020000, rev: 2, group: 12,
		nets: []string{"enp2s0f1", "enp2s0f1d1"}})
	return f
}

func TestLookup(t *testing.T) {
	f := standardTree(t)
	s := f.sys()

	got, err := s.Lookup(Address{Bus: 0, Device: 3})
	if err != nil {
		t.Fatal(err)
	}
	want := Device{
		Address: Address{Device: 3}, VendorID: 0x1af4, DeviceID: 0x1041, SubsystemVendorID: 0x1af4, SubsystemID: 0x1100,
		Class: 0x020000, Revision: 1, IOMMUGroup: 7, Driver: "virtio-pci", NetInterfaces: []string{"eth0"}, NUMANode: 0,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Lookup 00:03.0 =\n %+v\nwant\n %+v", got, want)
	}
	if !got.IsNetwork() {
		t.Error("virtio-net should be a network device")
	}

	got, err = s.Lookup(Address{Device: 4})
	if err != nil {
		t.Fatal(err)
	}
	if got.Driver != "vfio-pci" || got.DriverOverride != "vfio-pci" || got.IOMMUGroup != 8 || got.NUMANode != -1 || got.NetInterfaces != nil {
		t.Errorf("Lookup 00:04.0 = %+v", got)
	}

	got, err = s.Lookup(Address{Domain: 1, Bus: 2, Function: 1})
	if err != nil {
		t.Fatal(err)
	}
	if got.Driver != "" || got.DriverOverride != "" || got.NUMANode != -1 || got.Revision != 2 ||
		!reflect.DeepEqual(got.NetInterfaces, []string{"enp2s0f1", "enp2s0f1d1"}) {
		t.Errorf("Lookup 0001:02:00.1 = %+v", got)
	}

	got, err = s.Lookup(Address{})
	if err != nil {
		t.Fatal(err)
	}
	if got.IOMMUGroup != -1 || got.Driver != "" || got.IsNetwork() {
		t.Errorf("host bridge = %+v", got)
	}
}

func TestLookupMissing(t *testing.T) {
	s := standardTree(t).sys()
	_, err := s.Lookup(Address{Bus: 5, Device: 1})
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "0000:05:01.0") {
		t.Fatalf("Lookup of a missing device: %v, want ErrNotFound naming 0000:05:01.0", err)
	}
}

// TestNotFoundIsNotExist: a missing device is a missing file to callers
// that only know the os package's errors, and still ErrNotFound.
func TestNotFoundIsNotExist(t *testing.T) {
	if !errors.Is(ErrNotFound, fs.ErrNotExist) || !errors.Is(ErrNotFound, ErrNotFound) {
		t.Fatal("ErrNotFound does not match fs.ErrNotExist and itself")
	}
	//lint:ignore SA1032 the reversed call is the point: a plain missing file is not ErrNotFound
	if errors.Is(ErrNotFound, fs.ErrPermission) || errors.Is(fs.ErrNotExist, ErrNotFound) {
		t.Error("ErrNotFound matches too much, or a plain missing file is ErrNotFound")
	}
	s := standardTree(t).sys()
	a := Address{Bus: 5, Device: 1}
	_, lerr := s.Lookup(a)
	_, cerr := s.Config(a)
	_, rerr := s.Resources(a)
	for _, err := range []error{lerr, cerr, rerr, s.ClearOverride(a)} {
		if !errors.Is(err, ErrNotFound) || !errors.Is(err, os.ErrNotExist) {
			t.Errorf("missing device: %v, want both ErrNotFound and os.ErrNotExist", err)
		}
	}
}

func TestLookupMalformed(t *testing.T) {
	f := standardTree(t)
	f.write(f.devRel("0000:00:03.0")+"/vendor", "garbage\n")
	_, err := f.sys().Lookup(Address{Device: 3})
	if err == nil || !strings.Contains(err.Error(), "vendor") || !strings.Contains(err.Error(), "0000:00:03.0") {
		t.Errorf("malformed vendor: %v", err)
	}
	if err := os.Remove(f.path(f.devRel("0000:00:04.0") + "/class")); err != nil {
		t.Fatal(err)
	}
	if _, err := f.sys().Lookup(Address{Device: 4}); err == nil || !strings.Contains(err.Error(), "class") {
		t.Errorf("missing class: %v", err)
	}
	// The host bridge has no group; give it a link that names no number.
	f.symlink("../../../kernel/iommu_groups/x", f.devRel("0000:00:00.0")+"/iommu_group")
	if _, err := f.sys().Lookup(Address{}); err == nil || !strings.Contains(err.Error(), "iommu_group") {
		t.Errorf("bad iommu_group: %v", err)
	}
}

func TestList(t *testing.T) {
	f := standardTree(t)
	// Names that are not addresses this package represents are skipped.
	f.mkdir("bus/pci/devices/10000:00:00.0")
	s := f.sys()

	addrs := func(ds []Device) []string {
		var out []string
		for _, d := range ds {
			out = append(out, d.Address.String())
		}
		return out
	}
	cases := []struct {
		opts ListOptions
		want []string
	}{
		{ListOptions{}, []string{"0000:00:00.0", "0000:00:03.0", "0000:00:04.0", "0001:02:00.1"}},
		{ListOptions{NetworkOnly: true}, []string{"0000:00:03.0", "0000:00:04.0", "0001:02:00.1"}},
		{ListOptions{VendorID: 0x8086}, []string{"0000:00:00.0", "0000:00:04.0", "0001:02:00.1"}},
		{ListOptions{VendorID: 0x8086, DeviceID: 0x10d3}, []string{"0000:00:04.0"}},
		{ListOptions{Driver: "vfio-pci"}, []string{"0000:00:04.0"}},
		{ListOptions{Driver: "mlx5_core"}, nil},
	}
	for _, tc := range cases {
		ds, err := s.List(tc.opts)
		if err != nil {
			t.Fatalf("List(%+v): %v", tc.opts, err)
		}
		if got := addrs(ds); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("List(%+v) = %v, want %v", tc.opts, got, tc.want)
		}
	}
}

func TestListNoSysfs(t *testing.T) {
	_, err := Sysfs{Root: t.TempDir()}.List(ListOptions{})
	if err == nil || !strings.Contains(err.Error(), "list devices") {
		t.Errorf("List on an empty root: %v", err)
	}
}

// TestRealSysfs reads this machine's PCI devices; it checks consistency,
// not particular devices.
func TestRealSysfs(t *testing.T) {
	if _, err := os.Stat("/sys/bus/pci/devices"); err != nil {
		t.Skip("no /sys/bus/pci/devices")
	}
	ds, err := List(ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) == 0 {
		t.Skip("no PCI devices")
	}
	for _, d := range ds {
		again, err := Lookup(d.Address)
		if err != nil {
			t.Errorf("Lookup(%s): %v", d.Address, err)
			continue
		}
		if again.VendorID != d.VendorID || again.DeviceID != d.DeviceID || again.Class != d.Class {
			t.Errorf("%s: List says %+v, Lookup says %+v", d.Address, d, again)
		}
		if d.VendorID == 0 || d.VendorID == 0xffff {
			t.Errorf("%s: vendor 0x%04x", d.Address, d.VendorID)
		}
		t.Logf("%s %04x:%04x class %06x group %d driver %q nets %v", d.Address, d.VendorID, d.DeviceID, d.Class, d.IOMMUGroup, d.Driver, d.NetInterfaces)
	}
}
