package main

import (
	"bytes"
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/doctor"
	"github.com/vfnic/vfnic/pci"
)

// fakeMachine is a machine on fake sysfs, /proc and /dev trees where VFIO
// can work: an IOMMU, vfio-pci and virtio-pci loaded, the container file.
// Its drivers_probe and unbind attributes are plain files: nothing binds,
// and a write to them shows.
type fakeMachine struct {
	t              *testing.T
	sys, proc, dev string
}

func newFakeMachine(t *testing.T) *fakeMachine {
	root := t.TempDir()
	f := &fakeMachine{t: t, sys: filepath.Join(root, "sys"), proc: filepath.Join(root, "proc"), dev: filepath.Join(root, "dev")}
	f.mkdir(f.sys, "class/iommu/dmar0")
	f.mkdir(f.sys, "class/net")
	f.mkdir(f.sys, "bus/pci/devices")
	f.write(f.sys, "bus/pci/drivers_probe", "")
	for _, d := range []string{pci.VFIODriver, "virtio-pci"} {
		f.write(f.sys, "bus/pci/drivers/"+d+"/bind", "")
		f.write(f.sys, "bus/pci/drivers/"+d+"/unbind", "")
	}
	f.write(f.dev, "vfio/vfio", "")
	f.mkdir(f.proc, "self")
	return f
}

func (f *fakeMachine) mkdir(root, rel string) {
	require.NoError(f.t, os.MkdirAll(filepath.Join(root, rel), 0o755))
}

func (f *fakeMachine) write(root, rel, s string) {
	f.mkdir(root, filepath.Dir(rel))
	require.NoError(f.t, os.WriteFile(filepath.Join(root, rel), []byte(s), 0o644))
}

func (f *fakeMachine) read(root, rel string) string {
	b, err := os.ReadFile(filepath.Join(root, rel))
	require.NoError(f.t, err)
	return string(b)
}

// device adds a virtio-net NIC at addr in IOMMU group (-1: none) on
// driver ("": none); with nets, its interfaces, up.
func (f *fakeMachine) device(addr string, group int, driver string, nets ...string) {
	dir := "devices/pci0000:7f/" + addr
	f.write(f.sys, dir+"/vendor", "0x1af4\n")
	f.write(f.sys, dir+"/device", "0x1041\n")
	f.write(f.sys, dir+"/class", "0x020000\n")
	f.write(f.sys, dir+"/driver_override", "(null)\n")
	require.NoError(f.t, os.Symlink(filepath.Join(f.sys, dir), filepath.Join(f.sys, "bus/pci/devices", addr)))
	if group >= 0 {
		g := "kernel/iommu_groups/" + strconv.Itoa(group)
		f.mkdir(f.sys, g+"/devices")
		require.NoError(f.t, os.Symlink(filepath.Join(f.sys, g), filepath.Join(f.sys, dir, "iommu_group")))
		if driver == pci.VFIODriver {
			f.write(f.dev, "vfio/"+strconv.Itoa(group), "")
		}
	}
	if driver != "" {
		require.NoError(f.t, os.Symlink(filepath.Join(f.sys, "bus/pci/drivers", driver), filepath.Join(f.sys, dir, "driver")))
	}
	for i, n := range nets {
		nd := dir + "/net/" + n
		f.write(f.sys, nd+"/flags", "0x1003\n")
		f.write(f.sys, nd+"/operstate", "up\n")
		f.write(f.sys, nd+"/ifindex", strconv.Itoa(10+i)+"\n")
		require.NoError(f.t, os.Symlink(filepath.Join(f.sys, nd), filepath.Join(f.sys, "class/net", n)))
	}
}

// untouched checks that nothing was asked of the kernel for addr: its
// driver and override are as device made them, and no probe or unbind
// was written.
func (f *fakeMachine) untouched(addr, driver string) {
	f.t.Helper()
	d, err := f.machine().sys.Lookup(addrs(f.t, addr)[0])
	require.NoError(f.t, err)
	require.Equal(f.t, driver, d.Driver, "%s changed driver", addr)
	require.Empty(f.t, d.DriverOverride, "%s got an override", addr)
	require.Empty(f.t, f.read(f.sys, "bus/pci/drivers_probe"), "a probe was written")
	for _, drv := range []string{pci.VFIODriver, "virtio-pci"} {
		require.Empty(f.t, f.read(f.sys, "bus/pci/drivers/"+drv+"/unbind"), "an unbind from %s was written", drv)
	}
}

func (f *fakeMachine) machine() machine {
	return machine{
		sys:    pci.Sysfs{Root: f.sys, Proc: f.proc, Dev: f.dev},
		doctor: doctor.Env{Sys: f.sys, Proc: f.proc, Dev: f.dev, Access: func(string) error { return nil }},
		net:    noRoutes{},
	}
}

// noRoutes is a kernel network stack without addresses or routes.
type noRoutes struct{}

func (noRoutes) Addrs() ([]pci.IfAddr, error) { return nil, nil }
func (noRoutes) Routes() ([]pci.Route, error) { return nil, nil }

func addrs(t *testing.T, ss ...string) []pci.Address {
	as, err := parseAddrs(ss)
	require.NoError(t, err)
	return as
}

// TestBindChecksEveryAddressFirst: 'vfnic bind A B' with a B that cannot
// be bound (missing, without an IOMMU group, in use) binds nothing: A is
// not taken from its driver first.
func TestBindChecksEveryAddressFirst(t *testing.T) {
	for _, tc := range []struct {
		name  string
		b     func(f *fakeMachine)
		force bool
		want  []string
	}{
		{"missing", func(*fakeMachine) {}, false, []string{"0000:7f:1f.1", "not found"}},
		{"no IOMMU group", func(f *fakeMachine) { f.device("0000:7f:1f.1", -1, "virtio-pci") }, false,
			[]string{"cannot bind 0000:7f:1f.1", "no IOMMU group"}},
		{"in use", func(f *fakeMachine) { f.device("0000:7f:1f.1", 8, "virtio-pci", "eth9") }, false,
			[]string{"0000:7f:1f.1", "eth9 is up", "use -force"}},
		{"in use, forced, no IOMMU group", func(f *fakeMachine) { f.device("0000:7f:1f.1", -1, "virtio-pci", "eth9") }, true,
			[]string{"no IOMMU group"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeMachine(t)
			f.device("0000:7f:1f.0", 7, "virtio-pci")
			tc.b(f)
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
			defer cancel()
			var out bytes.Buffer
			err := f.machine().bind(ctx, addrs(t, "0000:7f:1f.0", "0000:7f:1f.1"), tc.force, &out)
			require.Error(t, err)
			for _, w := range tc.want {
				require.Contains(t, err.Error(), w)
			}
			require.Empty(t, out.String())
			f.untouched("0000:7f:1f.0", "virtio-pci")
		})
	}
}

// TestBindAlreadyBound: devices on vfio-pci already are reported, once
// each, and left there.
func TestBindAlreadyBound(t *testing.T) {
	f := newFakeMachine(t)
	f.device("0000:7f:1f.0", 7, pci.VFIODriver)
	f.device("0000:7f:1f.1", 8, pci.VFIODriver)
	var out bytes.Buffer
	err := f.machine().bind(t.Context(), addrs(t, "0000:7f:1f.0", "0000:7f:1f.1", "0000:7f:1f.0"), false, &out)
	require.NoError(t, err)
	require.Equal(t, "0000:7f:1f.0: already bound to vfio-pci, IOMMU group 7 (/dev/vfio/7)\n"+
		"0000:7f:1f.1: already bound to vfio-pci, IOMMU group 8 (/dev/vfio/8)\n", out.String())
	f.untouched("0000:7f:1f.0", pci.VFIODriver)
	f.untouched("0000:7f:1f.1", pci.VFIODriver)
}

// upAndAddressed is a kernel network stack where eth1 has an address.
type upAndAddressed struct{}

func (upAndAddressed) Addrs() ([]pci.IfAddr, error) {
	return []pci.IfAddr{{Index: 10, Prefix: netip.MustParsePrefix("10.0.0.2/24")}}, nil // eth1 (fakeMachine.device)
}
func (upAndAddressed) Routes() ([]pci.Route, error) { return nil, nil }

// TestForceWarning: -force on a NIC the kernel uses warns what the kernel
// loses; on a free one it says nothing.
func TestForceWarning(t *testing.T) {
	f := newFakeMachine(t)
	f.device("0000:7f:01.0", 3, "virtio-pci", "eth1")
	f.device("0000:7f:02.0", 4, pci.VFIODriver)
	sys := f.machine().sys
	w := forceWarning(sys, upAndAddressed{}, addrs(t, "0000:7f:01.0")[0])
	require.Contains(t, w, "warning: -force takes 0000:7f:01.0 from virtio-pci although interface eth1 is up")
	require.Contains(t, w, "has address 10.0.0.2/24")
	require.Contains(t, w, "come back on exit, where vfnic gives them back their state, addresses and routes")
	require.Empty(t, forceWarning(sys, upAndAddressed{}, addrs(t, "0000:7f:02.0")[0]))
	require.Empty(t, forceWarning(sys, noRoutes{}, addrs(t, "0000:7f:09.0")[0]), "no such device: nothing to say")
}
