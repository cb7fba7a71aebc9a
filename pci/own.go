package pci

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// VFIODriver is the kernel driver that lends a device to user space.
const VFIODriver = "vfio-pci"

// Errors of taking and giving back devices.
var (
	// ErrNotVFIO reports a device that an operation meant for vfio-pci
	// devices found on another kernel driver: unbinding it would take it
	// from the kernel (and perhaps the machine's network) instead.
	ErrNotVFIO = errors.New("pci: device not bound to vfio-pci")
	// ErrBusy reports a device whose VFIO group or device file a process
	// holds open: unbinding it would block until that process lets go.
	ErrBusy = errors.New("pci: device held open")
)

// Holder is a process that holds a device's VFIO group or device file open.
type Holder struct {
	PID     int    // process id
	Command string // its command name (/proc/PID/comm), "" when unreadable
	Path    string // the file it holds, e.g. /dev/vfio/7
}

func (h Holder) String() string {
	if h.Command == "" {
		return fmt.Sprintf("pid %d (%s)", h.PID, h.Path)
	}
	return fmt.Sprintf("pid %d %s (%s)", h.PID, h.Command, h.Path)
}

// vfioPaths are the files through which a process holds the device: its
// group node and, on kernels with VFIO device cdevs, its device node.
func (s Sysfs) vfioPaths(d Device) []string {
	var ps []string
	if d.IOMMUGroup >= 0 {
		ps = append(ps, "/dev/vfio/"+strconv.Itoa(d.IOMMUGroup))
	}
	names, _ := readDirNames(filepath.Join(s.devDir(d.Address), "vfio-dev"))
	for _, n := range names {
		ps = append(ps, "/dev/vfio/devices/"+n)
	}
	return ps
}

// Holders lists the processes whose open files (/proc/PID/fd) include the
// device's VFIO group or device node, sorted by PID. Processes whose fds
// cannot be read (another user's, without privilege) are not listed:
// CheckHeld also asks the kernel.
func (s Sysfs) Holders(a Address) ([]Holder, error) {
	d, err := s.Lookup(a)
	if err != nil {
		return nil, err
	}
	return s.holders(d)
}

func (s Sysfs) holders(d Device) ([]Holder, error) {
	want := s.vfioPaths(d)
	if len(want) == 0 {
		return nil, nil
	}
	procs, err := os.ReadDir(s.proc())
	if err != nil {
		return nil, fmt.Errorf("pci: holders of %s: %w", d.Address, err)
	}
	var hs []Holder
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil || pid <= 0 {
			continue
		}
		fdDir := filepath.Join(s.proc(), p.Name(), "fd")
		fds, err := os.ReadDir(fdDir)
		if err != nil {
			continue // exited, or not ours to read
		}
		for _, fd := range fds {
			t, err := os.Readlink(filepath.Join(fdDir, fd.Name()))
			if err != nil {
				continue
			}
			if !contains(want, t) {
				continue
			}
			comm, _ := readAttr(filepath.Join(s.proc(), p.Name(), "comm"))
			hs = append(hs, Holder{PID: pid, Command: comm, Path: t})
			break
		}
	}
	sort.Slice(hs, func(i, j int) bool { return hs[i].PID < hs[j].PID })
	return hs, nil
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// CheckHeld returns an error wrapping ErrBusy when a process holds the
// device's VFIO group or device open, naming the processes /proc shows.
// When /proc shows none (another user's process, another PID namespace)
// it still asks the kernel, for a vfio-pci device, by opening the group
// node: a group is open in one process at a time, so EBUSY means held.
func (s Sysfs) CheckHeld(a Address) error {
	d, err := s.Lookup(a)
	if err != nil {
		return err
	}
	return s.checkHeld(d)
}

func (s Sysfs) checkHeld(d Device) error {
	hs, err := s.holders(d)
	if err != nil {
		return err
	}
	if len(hs) > 0 {
		names := make([]string, len(hs))
		for i, h := range hs {
			names[i] = h.String()
		}
		return fmt.Errorf("%w: %s is in use by %s: stop it first", ErrBusy, d.Address, strings.Join(names, ", "))
	}
	if d.Driver != VFIODriver || d.IOMMUGroup < 0 {
		return nil
	}
	p := filepath.Join(s.dev(), "vfio", strconv.Itoa(d.IOMMUGroup))
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err == nil {
		f.Close()
		return nil
	}
	if errors.Is(err, syscall.EBUSY) {
		return fmt.Errorf("%w: %s: %s is open in a process this user cannot see (EBUSY): stop it first", ErrBusy, d.Address, p)
	}
	return nil // absent or not ours to open: nothing to learn
}

// Claim records what Take changed, so that Release can give the device
// back to the driver it had.
type Claim struct {
	// Address is the device.
	Address Address
	// Previous is the driver the device had before Take, "" for none.
	Previous string
	// Bound is true when Take bound the device to vfio-pci; false when it
	// already was, and then Release leaves it there.
	Bound bool

	sys Sysfs
}

// TakeOptions says how Take checks a device.
type TakeOptions struct {
	// Force skips the in-use check (interfaces up, addresses, routes).
	Force bool
	// Net is where the in-use check reads addresses and routes; nil means
	// Netlink().
	Net NetState
}

// Take binds the device to vfio-pci unless it already is, after checking
// that the kernel's network stack is not using it (CheckInUse) and that no
// process holds it (CheckHeld), and records the driver it had. When the
// bind fails, Bind has given the device back to that driver (or reports
// that it could not), so there is no Claim to release.
func (s Sysfs) Take(ctx context.Context, a Address, opts TakeOptions) (Claim, error) {
	d, err := s.Lookup(a)
	if err != nil {
		return Claim{}, err
	}
	c := Claim{Address: a, Previous: d.Driver, sys: s}
	if d.Driver == VFIODriver {
		return c, nil
	}
	if err := s.CheckInUse(a, opts.Net, opts.Force); err != nil {
		return Claim{}, err
	}
	if err := s.Bind(ctx, a, VFIODriver); err != nil {
		return Claim{}, err
	}
	c.Bound = true
	return c, nil
}

// Release gives the device back to the driver it had before Take, when
// Take bound it; otherwise it does nothing. The caller must have closed
// its VFIO files first. A device that the kernel is taking back (an
// unbind in progress) is waited for; one that meanwhile went to another
// driver than vfio-pci is left there.
func (c Claim) Release(ctx context.Context) error {
	if !c.Bound {
		return nil
	}
	_, err := c.sys.GiveBack(ctx, c.Address, GiveBackOptions{Driver: c.Previous, KeepUnbound: c.Previous == ""})
	if errors.Is(err, ErrNotVFIO) {
		return nil
	}
	return err
}

// GiveBackOptions says how GiveBack returns a device to the kernel.
type GiveBackOptions struct {
	// Driver is the driver to give the device to; "" means whichever the
	// kernel picks once driver_override is cleared.
	Driver string
	// KeepUnbound leaves the device without a driver after the unbind.
	KeepUnbound bool
	// Force unbinds a device even from a driver other than vfio-pci.
	// Without it such a device is refused with ErrNotVFIO: taking it from
	// its kernel driver is Bind's job, with its checks.
	Force bool
	// Net is where the in-use check reads addresses and routes (only a
	// device on a kernel network driver is checked); nil means Netlink().
	Net NetState
}

// GiveBack unbinds a vfio-pci device, clears its driver_override and lets
// the kernel (or opts.Driver) take it; it returns the driver the device
// ends on ("" for none). It refuses, without changing anything, a device
// on another driver (ErrNotVFIO, unless opts.Force, and then the in-use
// check applies) and a device a process holds open (ErrBusy, naming the
// process): the kernel's unbind would block until that process let go.
// An unbind already in progress (the driver link leaving) is waited for.
func (s Sysfs) GiveBack(ctx context.Context, a Address, opts GiveBackOptions) (string, error) {
	d, err := s.Lookup(a)
	if err != nil {
		return "", err
	}
	if d.Driver != "" && d.Driver != VFIODriver {
		if !opts.Force {
			return d.Driver, fmt.Errorf("%w: %s is bound to %s: it already belongs to the kernel (-force unbinds it anyway)", ErrNotVFIO, a, d.Driver)
		}
		if err := s.CheckInUse(a, opts.Net, false); err != nil {
			return d.Driver, err
		}
	}
	if d.Driver != "" {
		if err := s.checkHeld(d); err != nil {
			return d.Driver, err
		}
		if err := s.unbind(ctx, a, d.Driver); err != nil {
			// The kernel may be unbinding it already (a device request):
			// then the link goes away by itself.
			if cur, _ := linkBase(filepath.Join(s.devDir(a), "driver")); cur != "" {
				return cur, err
			}
		}
	}
	if d.DriverOverride != "" {
		if err := s.ClearOverride(a); err != nil {
			return "", err
		}
	}
	if opts.KeepUnbound {
		return "", nil
	}
	if err := s.Reprobe(a); err != nil {
		return "", err
	}
	link := filepath.Join(s.devDir(a), "driver")
	// Most drivers probe synchronously; allow asynchronous ones a moment.
	wctx, cancel := context.WithTimeout(ctx, time.Second)
	var cur string
	_ = waitFor(wctx, func() (bool, error) {
		var err error
		cur, err = linkBase(link)
		return cur != "" && (opts.Driver == "" || cur == opts.Driver), err
	})
	cancel()
	if opts.Driver != "" && cur == "" {
		// The driver does not claim it by ID (a dynamic id, a driver
		// matched by override before): bind it explicitly, then let the
		// override go so that the next probe picks by ID again.
		if err := s.Bind(ctx, a, opts.Driver); err != nil {
			return "", err
		}
		if err := s.ClearOverride(a); err != nil {
			return opts.Driver, err
		}
		cur = opts.Driver
	}
	return cur, nil
}

// WaitDriverGone waits until the device is no longer bound to driver (an
// unbind that another writer of the sysfs unbind file started), up to
// ctx's deadline or 5 s without one.
func (s Sysfs) WaitDriverGone(ctx context.Context, a Address, driver string) error {
	link := filepath.Join(s.devDir(a), "driver")
	err := waitFor(ctx, func() (bool, error) {
		cur, err := linkBase(link)
		return cur != driver, err
	})
	if err != nil {
		return fmt.Errorf("pci: %s still bound to %s: %w", a, driver, err)
	}
	return nil
}
