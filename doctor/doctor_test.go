package doctor

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/pci"
	"golang.org/x/sys/unix"
)

// machine is a fixture of sysfs, procfs and /dev for a machine where
// everything works: an IOMMU with groups, vfio-pci loaded, free hugepages,
// a non-root user with a generous memlock limit, and one NIC per driver
// state.
type machine struct {
	t              *testing.T
	sys, proc, dev string
	denied         map[string]bool
	memlock        uint64
	euid           int
}

func newMachine(t *testing.T) *machine {
	root := t.TempDir()
	m := &machine{t: t, sys: filepath.Join(root, "sys"), proc: filepath.Join(root, "proc"), dev: filepath.Join(root, "dev"),
		denied: map[string]bool{}, memlock: unix.RLIM_INFINITY, euid: 1000}
	m.mkdir(m.sys, "class/iommu/dmar0")
	m.mkdir(m.sys, "kernel/iommu_groups/7/devices")
	m.mkdir(m.sys, "kernel/iommu_groups/8/devices")
	m.mkdir(m.sys, "bus/pci/drivers/vfio-pci")
	m.mkdir(m.sys, "bus/pci/drivers/virtio-pci")
	m.mkdir(m.sys, "bus/pci/devices")
	m.write(m.sys, "kernel/mm/hugepages/hugepages-2048kB/nr_hugepages", "64\n")
	m.write(m.sys, "kernel/mm/hugepages/hugepages-2048kB/free_hugepages", "60\n")
	m.write(m.sys, "kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages", "0\n")
	m.write(m.sys, "kernel/mm/hugepages/hugepages-1048576kB/free_hugepages", "0\n")
	m.write(m.proc, "cmdline", "BOOT_IMAGE=/vmlinuz root=/dev/sda1 intel_iommu=on\n")
	m.write(m.proc, "self/status", "Name:\tvfnic\nCapEff:\t0000000000000000\n")
	m.write(m.dev, "vfio/vfio", "")
	m.write(m.dev, "vfio/8", "")
	m.device("0000:00:03.0", 7, "virtio-pci")
	m.device("0000:00:04.0", 8, "vfio-pci")
	m.device("0000:00:05.0", -1, "")
	return m
}

func (m *machine) mkdir(root, rel string) {
	require.NoError(m.t, os.MkdirAll(filepath.Join(root, rel), 0o755))
}

func (m *machine) write(root, rel, s string) {
	m.mkdir(root, filepath.Dir(rel))
	require.NoError(m.t, os.WriteFile(filepath.Join(root, rel), []byte(s), 0o644))
}

func (m *machine) device(addr string, group int, driver string) {
	dir := "bus/pci/devices/" + addr
	m.write(m.sys, dir+"/vendor", "0x1af4\n")
	m.write(m.sys, dir+"/device", "0x1041\n")
	m.write(m.sys, dir+"/class", "0x020000\n")
	if group >= 0 {
		require.NoError(m.t, os.Symlink(filepath.Join(m.sys, "kernel/iommu_groups", strconv.Itoa(group)), filepath.Join(m.sys, dir, "iommu_group")))
	}
	if driver != "" {
		require.NoError(m.t, os.Symlink(filepath.Join(m.sys, "bus/pci/drivers", driver), filepath.Join(m.sys, dir, "driver")))
	}
}

func (m *machine) env() Env {
	return Env{Sys: m.sys, Proc: m.proc, Dev: m.dev,
		Euid:    func() int { return m.euid },
		Memlock: func() (uint64, error) { return m.memlock, nil },
		Access: func(p string) error {
			if m.denied[p] {
				return unix.EACCES
			}
			return nil
		}}
}

func addr(s string) pci.Address {
	a, err := pci.ParseAddress(s)
	if err != nil {
		panic(err)
	}
	return a
}

func TestReadyMachine(t *testing.T) {
	m := newMachine(t)
	r := Run(m.env(), addr("0000:00:03.0"), addr("0000:00:04.0"))
	require.NoError(t, r.Err())
	require.True(t, r.Ready())
	for _, c := range r.Checks {
		require.Equal(t, OK, c.Status, "%s: %s", c.Name, c.Message)
	}
	require.Len(t, r.Checks, 9)
	require.Contains(t, r.Checks[0].Message, "IOMMU present (dmar0), 2 IOMMU groups")
	require.Contains(t, r.Checks[3].Message, "2048kB: 60 of 64 free")

	b, err := json.Marshal(r)
	require.NoError(t, err)
	var back Report
	require.NoError(t, json.Unmarshal(b, &back))
	require.Equal(t, r, back)
}

// TestMessages breaks one thing at a time and checks that the report's
// one message names that cause.
func TestMessages(t *testing.T) {
	cases := []struct {
		name    string
		breakIt func(m *machine)
		dev     string
		check   string
		msg     string
		fix     string
	}{
		{"iommu not on the command line", func(m *machine) {
			m.noIOMMU()
			m.write(m.proc, "cmdline", "BOOT_IMAGE=/vmlinuz root=/dev/sda1 quiet\n")
		}, "", "iommu", "no IOMMU: not enabled on the kernel command line", "intel_iommu=on"},
		{"iommu disabled on the command line", func(m *machine) {
			m.noIOMMU()
			m.write(m.proc, "cmdline", "root=/dev/sda1 intel_iommu=off\n")
		}, "", "iommu", "no IOMMU: disabled on the kernel command line (intel_iommu=off)", "remove intel_iommu=off"},
		{"iommu enabled but none present", func(m *machine) { m.noIOMMU() }, "", "iommu",
			"no IOMMU present although the kernel command line enables it (intel_iommu=on)", "enable VT-d or AMD-Vi in the firmware"},
		{"vfio-pci missing", func(m *machine) {
			require.NoError(t, os.RemoveAll(filepath.Join(m.sys, "bus/pci/drivers/vfio-pci")))
		}, "", "vfio-pci", "vfio-pci module missing", "modprobe vfio-pci"},
		{"container missing", func(m *machine) {
			require.NoError(t, os.Remove(filepath.Join(m.dev, "vfio/vfio")))
		}, "", "vfio-container", "vfio/vfio missing: the vfio module is not loaded", "modprobe vfio-pci"},
		{"container not accessible", func(m *machine) { m.denied[filepath.Join(m.dev, "vfio/vfio")] = true }, "", "vfio-container",
			"vfio/vfio not accessible to uid 1000", "run as root"},
		{"no free hugepages", func(m *machine) {
			m.write(m.sys, "kernel/mm/hugepages/hugepages-2048kB/free_hugepages", "0\n")
		}, "", "hugepages", "no free hugepages (1048576kB: 0 of 0 free, 2048kB: 0 of 64 free)", "echo 64 > /proc/sys/vm/nr_hugepages"},
		{"memlock too low", func(m *machine) { m.memlock = 64 << 10 }, "", "memlock",
			"memlock limit 64 KiB is too low for a non-root user (uid 1000): VFIO pins DMA memory against it, 16 MiB needed", "ulimit -l unlimited"},
		{"no iommu group", nil, "0000:00:05.0", "iommu-group", "0000:00:05.0 has no IOMMU group", "enable the IOMMU"},
		{"group file not accessible", func(m *machine) { m.denied[filepath.Join(m.dev, "vfio/8")] = true }, "0000:00:04.0", "group-file",
			"vfio/8 not accessible to uid 1000", "chown"},
		{"group file missing", func(m *machine) {
			require.NoError(t, os.Remove(filepath.Join(m.dev, "vfio/8")))
		}, "0000:00:04.0", "group-file", "0000:00:04.0 is bound to vfio-pci but " /* path follows */, "check dmesg"},
		{"no such device", nil, "0000:00:09.0", "device", "device not found", "vfnic list"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := newMachine(t)
			if tc.breakIt != nil {
				tc.breakIt(m)
			}
			var as []pci.Address
			if tc.dev != "" {
				as = append(as, addr(tc.dev))
			}
			r := Run(m.env(), as...)
			err := r.Err()
			require.ErrorIs(t, err, ErrNotReady)
			require.Contains(t, err.Error(), tc.msg)
			require.Contains(t, err.Error(), tc.fix)
			var failed []string
			for _, c := range r.Checks {
				if c.Status == Fail {
					failed = append(failed, c.Name)
				}
			}
			require.Equal(t, []string{tc.check}, failed, "exactly the broken check fails")
		})
	}
}

func (m *machine) noIOMMU() {
	require.NoError(m.t, os.RemoveAll(filepath.Join(m.sys, "class/iommu")))
	require.NoError(m.t, os.RemoveAll(filepath.Join(m.sys, "kernel/iommu_groups")))
}

func TestMemlockRootOrCapability(t *testing.T) {
	m := newMachine(t)
	m.memlock = 64 << 10
	m.write(m.proc, "self/status", "Name:\tvfnic\nCapEff:\t000001ffffffffff\n")
	r := Run(m.env())
	require.NoError(t, r.Err())
	require.Equal(t, "CAP_IPC_LOCK: the memlock limit does not apply", r.Checks[4].Message)
}

func TestUnboundDeviceIsNotAFailure(t *testing.T) {
	m := newMachine(t)
	r := Run(m.env(), addr("0000:00:03.0"))
	require.NoError(t, r.Err())
	require.Contains(t, r.Checks[len(r.Checks)-1].Message, "is on virtio-pci")
	require.False(t, errors.Is(r.Err(), ErrNotReady))
}

func TestCheckBind(t *testing.T) {
	m := newMachine(t)
	m.write(m.sys, "kernel/mm/hugepages/hugepages-2048kB/free_hugepages", "0\n")
	m.memlock = 64 << 10
	require.NoError(t, CheckBind(m.env(), addr("0000:00:03.0")), "hugepages and memlock are the driver's business")
	err := CheckBind(m.env(), addr("0000:00:05.0"))
	require.ErrorIs(t, err, ErrNotReady)
	require.Contains(t, err.Error(), "0000:00:05.0 has no IOMMU group")
	require.NoError(t, os.RemoveAll(filepath.Join(m.sys, "bus/pci/drivers/vfio-pci")))
	err = CheckBind(m.env(), addr("0000:00:03.0"))
	require.ErrorIs(t, err, ErrNotReady)
	require.Contains(t, err.Error(), "vfio-pci module missing")
}
