// Package doctor checks whether a machine can run vfnic's VFIO drivers,
// and says in one message what stops it: no IOMMU (not enabled on the
// kernel command line, or none present), the vfio-pci driver not loaded,
// a device without an IOMMU group, no free hugepages, a memlock limit too
// low for a non-root user, /dev/vfio files that are missing or not
// accessible. It is the library behind `vfnic doctor`, and what a program
// calls before binding a device to explain a failure in advance, the way
// dpdk-devbind's status does.
//
// Everything is read from sysfs, procfs and /dev under roots that tests
// point at fixtures; nothing is changed.
package doctor

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/vfnic/vfnic/pci"
	"golang.org/x/sys/unix"
)

// ErrNotReady is wrapped by Report.Err when a check failed.
var ErrNotReady = errors.New("doctor: VFIO cannot work here")

// DefaultMinMemlock is the memlock limit a process without CAP_IPC_LOCK
// needs: VFIO pins every DMA mapping against it, and one NIC with the
// default queues maps a few MiB of hugepages.
const DefaultMinMemlock = 16 << 20

// capIPCLock is CAP_IPC_LOCK's bit in /proc/self/status CapEff.
const capIPCLock = 14

// Status is a check's outcome.
type Status string

// Outcomes.
const (
	OK   Status = "ok"
	Warn Status = "warn" // works, but something is worth knowing
	Fail Status = "fail" // VFIO cannot work until fixed
)

// Check is one finding.
type Check struct {
	// Name is a short stable key: iommu, vfio-pci, vfio-container,
	// hugepages, memlock, or for a device iommu-group and group-file.
	Name string `json:"name"`
	// Device is the PCI address the check is about; "" for the machine.
	Device string `json:"device,omitempty"`
	Status Status `json:"status"`
	// Message says what was found, in one sentence.
	Message string `json:"message"`
	// Fix says what to do about a warning or failure.
	Fix string `json:"fix,omitempty"`
}

func (c Check) String() string {
	s := c.Message
	if c.Fix != "" {
		s += " (" + c.Fix + ")"
	}
	return s
}

// Report is the outcome of every check.
type Report struct {
	Checks []Check `json:"checks"`
}

// Ready reports whether no check failed.
func (r Report) Ready() bool { return r.Err() == nil }

// Err returns nil when no check failed, otherwise an error wrapping
// ErrNotReady whose message is the first failure's: the real cause, in
// one message.
func (r Report) Err() error {
	for _, c := range r.Checks {
		if c.Status == Fail {
			return fmt.Errorf("%w: %s", ErrNotReady, c)
		}
	}
	return nil
}

// Env is where the checks look. The zero Env reads the running machine.
type Env struct {
	// Sys, Proc and Dev are the sysfs, procfs and /dev roots; "" means
	// /sys, /proc and /dev.
	Sys, Proc, Dev string
	// Euid is the effective user id to report; nil means os.Geteuid.
	Euid func() int
	// Memlock returns RLIMIT_MEMLOCK's soft limit (unix.RLIM_INFINITY
	// for none); nil means getrlimit.
	Memlock func() (uint64, error)
	// Access reports whether this process may open path for reading and
	// writing; nil means access(2) with R_OK|W_OK.
	Access func(path string) error
	// MinMemlock is the limit below which memlock fails; 0 means
	// DefaultMinMemlock.
	MinMemlock uint64
}

func (e Env) sys(p ...string) string  { return join(e.Sys, "/sys", p) }
func (e Env) proc(p ...string) string { return join(e.Proc, "/proc", p) }
func (e Env) dev(p ...string) string  { return join(e.Dev, "/dev", p) }

func join(root, def string, p []string) string {
	if root == "" {
		root = def
	}
	return filepath.Join(append([]string{root}, p...)...)
}

func (e Env) euid() int {
	if e.Euid != nil {
		return e.Euid()
	}
	return os.Geteuid()
}

func (e Env) memlock() (uint64, error) {
	if e.Memlock != nil {
		return e.Memlock()
	}
	var r unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &r); err != nil {
		return 0, err
	}
	return r.Cur, nil
}

func (e Env) access(p string) error {
	if e.Access != nil {
		return e.Access(p)
	}
	return unix.Access(p, unix.R_OK|unix.W_OK)
}

// Run checks the machine and then each device in addrs (none: the
// machine only).
func Run(env Env, addrs ...pci.Address) Report {
	var r Report
	r.Checks = append(r.Checks, env.checkIOMMU(), env.checkVFIOPCI(), env.checkContainer(), env.checkHugepages(), env.checkMemlock())
	for _, a := range addrs {
		r.Checks = append(r.Checks, env.checkDevice(a)...)
	}
	return r
}

func (e Env) checkIOMMU() Check {
	c := Check{Name: "iommu"}
	units, _ := readDirNames(e.sys("class", "iommu"))
	groups, _ := readDirNames(e.sys("kernel", "iommu_groups"))
	if len(units) > 0 || len(groups) > 0 {
		c.Status = OK
		c.Message = fmt.Sprintf("IOMMU present (%s), %d IOMMU groups", strings.Join(units, ", "), len(groups))
		if len(units) == 0 {
			c.Message = fmt.Sprintf("IOMMU present, %d IOMMU groups", len(groups))
		}
		return c
	}
	c.Status = Fail
	b, err := os.ReadFile(e.proc("cmdline"))
	cmdline := strings.Fields(string(b))
	for _, w := range cmdline {
		if w == "intel_iommu=off" || w == "amd_iommu=off" || w == "iommu=off" {
			c.Message = fmt.Sprintf("no IOMMU: disabled on the kernel command line (%s)", w)
			c.Fix = "remove " + w + " from the kernel command line and reboot"
			return c
		}
	}
	for _, w := range cmdline {
		if w == "intel_iommu=on" || w == "amd_iommu=on" || w == "amd_iommu=force_enable" {
			c.Message = fmt.Sprintf("no IOMMU present although the kernel command line enables it (%s)", w)
			c.Fix = "enable VT-d or AMD-Vi in the firmware setup; in a VM, give the guest a vIOMMU (QEMU: -device intel-iommu)"
			return c
		}
	}
	if err != nil {
		c.Message = "no IOMMU present, and the kernel command line is unreadable: " + err.Error()
	} else {
		c.Message = "no IOMMU: not enabled on the kernel command line"
	}
	c.Fix = "add intel_iommu=on (Intel; AMD enables its IOMMU by default) to the kernel command line, reboot, and enable VT-d/AMD-Vi in the firmware"
	return c
}

func (e Env) checkVFIOPCI() Check {
	c := Check{Name: "vfio-pci"}
	if _, err := os.Stat(e.sys("bus", "pci", "drivers", pci.VFIODriver)); err == nil {
		c.Status, c.Message = OK, "vfio-pci driver loaded"
		return c
	}
	c.Status = Fail
	c.Message = "vfio-pci module missing: no driver " + e.sys("bus", "pci", "drivers", pci.VFIODriver)
	c.Fix = "modprobe vfio-pci"
	return c
}

func (e Env) checkContainer() Check {
	c := Check{Name: "vfio-container"}
	p := e.dev("vfio", "vfio")
	if _, err := os.Stat(p); err != nil {
		c.Status = Fail
		c.Message = p + " missing: the vfio module is not loaded"
		c.Fix = "modprobe vfio-pci"
		return c
	}
	if err := e.access(p); err != nil {
		c.Status = Fail
		c.Message = fmt.Sprintf("%s not accessible to uid %d: %v", p, e.euid(), err)
		c.Fix = "run as root, or make it readable and writable for this user (it usually is: mode 0666)"
		return c
	}
	c.Status, c.Message = OK, p+" accessible"
	return c
}

func (e Env) checkHugepages() Check {
	c := Check{Name: "hugepages"}
	dir := e.sys("kernel", "mm", "hugepages")
	sizes, err := readDirNames(dir)
	if err != nil || len(sizes) == 0 {
		c.Status = Fail
		c.Message = "no hugepage support: " + dir + " is empty or missing"
		c.Fix = "use a kernel with CONFIG_HUGETLBFS"
		return c
	}
	var free uint64
	var parts []string
	for _, s := range sizes {
		f, ferr := readUint(filepath.Join(dir, s, "free_hugepages"))
		n, nerr := readUint(filepath.Join(dir, s, "nr_hugepages"))
		if ferr != nil || nerr != nil {
			continue
		}
		free += f
		parts = append(parts, fmt.Sprintf("%s: %d of %d free", strings.TrimPrefix(s, "hugepages-"), f, n))
	}
	detail := strings.Join(parts, ", ")
	if free == 0 {
		c.Status = Fail
		c.Message = "no free hugepages (" + detail + ")"
		c.Fix = "echo 64 > /proc/sys/vm/nr_hugepages"
		return c
	}
	c.Status, c.Message = OK, "hugepages "+detail
	return c
}

func (e Env) checkMemlock() Check {
	c := Check{Name: "memlock"}
	if e.hasIPCLock() {
		c.Status = OK
		c.Message = "CAP_IPC_LOCK: the memlock limit does not apply"
		return c
	}
	lim, err := e.memlock()
	if err != nil {
		c.Status, c.Message = Warn, "memlock limit unreadable: "+err.Error()
		return c
	}
	min := e.MinMemlock
	if min == 0 {
		min = DefaultMinMemlock
	}
	if lim == unix.RLIM_INFINITY {
		c.Status, c.Message = OK, "memlock limit unlimited"
		return c
	}
	if lim < min {
		c.Status = Fail
		c.Message = fmt.Sprintf("memlock limit %s is too low for a non-root user (uid %d): VFIO pins DMA memory against it, %s needed",
			size(lim), e.euid(), size(min))
		c.Fix = "ulimit -l unlimited (LimitMEMLOCK=infinity in a systemd unit, memlock in /etc/security/limits.conf), or run as root"
		return c
	}
	c.Status, c.Message = OK, "memlock limit "+size(lim)
	return c
}

// hasIPCLock reads CapEff from <proc>/self/status.
func (e Env) hasIPCLock() bool {
	b, err := os.ReadFile(e.proc("self", "status"))
	if err != nil {
		return e.euid() == 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && caps&(1<<capIPCLock) != 0
		}
	}
	return e.euid() == 0
}

func (e Env) checkDevice(a pci.Address) []Check {
	name := a.String()
	d, err := pci.Sysfs{Root: e.Sys}.Lookup(a)
	if err != nil {
		return []Check{{Name: "device", Device: name, Status: Fail, Message: err.Error(), Fix: "see 'vfnic list' for the NICs present"}}
	}
	if d.IOMMUGroup < 0 {
		return []Check{{Name: "iommu-group", Device: name, Status: Fail,
			Message: name + " has no IOMMU group: the IOMMU is off, so VFIO cannot isolate it",
			Fix:     "enable the IOMMU (see the iommu check)"}}
	}
	out := []Check{{Name: "iommu-group", Device: name, Status: OK, Message: fmt.Sprintf("%s is in IOMMU group %d", name, d.IOMMUGroup)}}
	p := e.dev("vfio", strconv.Itoa(d.IOMMUGroup))
	gf := Check{Name: "group-file", Device: name}
	switch {
	case d.Driver != pci.VFIODriver:
		drv := d.Driver
		if drv == "" {
			drv = "no driver"
		}
		gf.Status = OK
		gf.Message = fmt.Sprintf("%s is on %s: %s appears once it is bound to vfio-pci", name, drv, p)
	default:
		if _, err := os.Stat(p); err != nil {
			gf.Status = Fail
			gf.Message = fmt.Sprintf("%s is bound to vfio-pci but %s is missing", name, p)
			gf.Fix = "check dmesg for vfio errors; rebind with 'vfnic unbind' and 'vfnic bind'"
		} else if err := e.access(p); err != nil {
			gf.Status = Fail
			gf.Message = fmt.Sprintf("%s not accessible to uid %d: %v", p, e.euid(), err)
			gf.Fix = fmt.Sprintf("run as root, or chown the user %s (a udev rule makes it last)", p)
		} else {
			gf.Status, gf.Message = OK, p+" accessible"
		}
	}
	return append(out, gf)
}

func readDirNames(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(ents))
	for i, e := range ents {
		names[i] = e.Name()
	}
	sort.Strings(names)
	return names, nil
}

func readUint(p string) (uint64, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
}

// size formats a byte count in KiB, MiB or GiB.
func size(n uint64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20:
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d KiB", n>>10)
}

// bindChecks are the checks whose failure makes binding a device to
// vfio-pci pointless: without them no process could open it.
var bindChecks = map[string]bool{"device": true, "iommu": true, "vfio-pci": true, "vfio-container": true, "iommu-group": true}

// CheckBind returns nil when device a can be bound to vfio-pci and
// opened, otherwise an error wrapping ErrNotReady that names the first
// reason. Hugepages and the memlock limit are left to the driver, whose
// configuration decides how much it needs.
func CheckBind(env Env, a pci.Address) error {
	r := Run(env, a)
	for _, c := range r.Checks {
		if bindChecks[c.Name] && c.Status == Fail {
			return fmt.Errorf("%w: %s", ErrNotReady, c)
		}
	}
	return nil
}
