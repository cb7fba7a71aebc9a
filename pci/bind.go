package pci

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Errors of driver binding.
var (
	// ErrDriverNotLoaded reports a driver with no <sysfs>/bus/pci/drivers/<name>
	// directory: its module is not loaded (modprobe it first).
	ErrDriverNotLoaded = errors.New("pci: driver not loaded")
	// ErrBindFailed reports a probe after which the device is not bound to
	// the requested driver.
	ErrBindFailed = errors.New("pci: bind failed")
	// ErrUnbindFailed reports a device still bound after an unbind.
	ErrUnbindFailed = errors.New("pci: unbind failed")
)

// settleTimeout bounds the wait for the driver link to change when the
// caller's context has no deadline. The kernel normally binds and unbinds
// synchronously; drivers with asynchronous probing need a moment longer.
const settleTimeout = 5 * time.Second

// pollInterval is how often the driver link is re-read while waiting.
const pollInterval = 2 * time.Millisecond

// restoreTimeout bounds the return of a device to its old driver after a
// failed Bind. It is a time of its own: the caller's context may be what
// ended the bind. A variable so that tests can shorten it.
var restoreTimeout = settleTimeout

// Unbind detaches the device from its kernel driver by writing its address
// to <dev>/driver/unbind, and waits until the driver link is gone. A device
// without a driver is left as it is. Unbind does not check whether the
// device is in use, nor which driver it takes the device from, nor whether
// a process holds it open (the kernel's unbind then waits for that
// process): GiveBack does all three.
func (s Sysfs) Unbind(ctx context.Context, a Address) error {
	if ctx == nil {
		return fmt.Errorf("pci: unbind %s: nil context: %w", a, fs.ErrInvalid)
	}
	d, err := s.Lookup(a)
	if err != nil {
		return err
	}
	if d.Driver == "" {
		return nil
	}
	return s.unbind(ctx, a, d.Driver)
}

func (s Sysfs) unbind(ctx context.Context, a Address, drv string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("pci: unbind %s from %s: %w", a, drv, err)
	}
	p := filepath.Join(s.devDir(a), "driver", "unbind")
	if err := writeAttr(p, a.String()); err != nil {
		return fmt.Errorf("pci: unbind %s from %s: %w", a, drv, err)
	}
	link := filepath.Join(s.devDir(a), "driver")
	err := waitFor(ctx, func() (bool, error) {
		cur, err := linkBase(link)
		return cur == "", err
	})
	if err != nil {
		return fmt.Errorf("%w: %s still bound to %s: %w", ErrUnbindFailed, a, drv, err)
	}
	return nil
}

// Bind binds the device to driver: it writes driver to <dev>/driver_override,
// unbinds the current driver if there is another one, writes the address to
// <sysfs>/bus/pci/drivers_probe and waits until the driver link names driver.
// The wait ends with ctx, or after 5 s when ctx has no deadline; drivers
// that probe asynchronously and load firmware may need a longer deadline.
// A device already bound to driver is left as it is. Bind does not check
// whether the device is in use: call CheckInUse first.
//
// When binding fails, also because ctx ended, the override is cleared and
// a device that Bind unbound goes back to the driver it had (waiting up to
// 5 s more, whatever ctx says): a NIC left without a driver would lose its
// kernel interface. If that fails too, the error reports both failures and
// the device may be left without a driver.
//
// The override stays set after success, so the device goes back to driver
// rather than its usual one if it is ever re-probed; ClearOverride undoes it.
func (s Sysfs) Bind(ctx context.Context, a Address, driver string) error {
	if ctx == nil {
		return fmt.Errorf("pci: bind %s: nil context: %w", a, fs.ErrInvalid)
	}
	if err := checkDriverName(driver); err != nil {
		return fmt.Errorf("pci: bind %s: %w", a, err)
	}
	d, err := s.Lookup(a)
	if err != nil {
		return err
	}
	if d.Driver == driver {
		return nil
	}
	drvDir := s.path("bus", "pci", "drivers", driver)
	if _, err := os.Stat(drvDir); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%w: bind %s to %s: no %s (is the module loaded?)", ErrDriverNotLoaded, a, driver, drvDir)
		}
		return fmt.Errorf("pci: bind %s to %s: %w", a, driver, err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("pci: bind %s to %s: %w", a, driver, err)
	}
	if err := s.setOverride(a, driver); err != nil {
		return err
	}
	if err := s.bind(ctx, a, d.Driver, driver); err != nil {
		if rerr := s.undoBind(ctx, a, d.Driver, driver); rerr != nil {
			return fmt.Errorf("%w; and giving %s back to %s failed: %w", err, a, driverName(d.Driver), rerr)
		}
		return err
	}
	return nil
}

// undoBind puts the device back after a failed bind from old to driver:
// driver off it if its probe succeeded too late, old on it again, the
// override cleared (a stale one would keep the usual driver away). A
// device that another driver took meanwhile is left with it.
func (s Sysfs) undoBind(ctx context.Context, a Address, old, driver string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), restoreTimeout)
	defer cancel()
	cur, err := linkBase(filepath.Join(s.devDir(a), "driver"))
	if err == nil && cur == driver {
		if err = s.unbind(ctx, a, driver); err == nil {
			cur = ""
		}
	}
	if err == nil && cur == "" && old != "" {
		// Through the override: old may match the device only by one (a
		// dynamic ID, an earlier override), not by the ID table.
		if err = s.setOverride(a, old); err == nil {
			err = s.bind(ctx, a, "", old)
		}
	}
	// Cleared even when the above failed: a later probe by ID may still
	// find the usual driver.
	return errors.Join(err, s.ClearOverride(a))
}

// driverName names a driver in messages; "" is no driver.
func driverName(d string) string {
	if d == "" {
		return "no driver"
	}
	return d
}

func (s Sysfs) bind(ctx context.Context, a Address, old, driver string) error {
	if old != "" {
		if err := s.unbind(ctx, a, old); err != nil {
			return err
		}
	}
	probe := s.path("bus", "pci", "drivers_probe")
	if err := writeAttr(probe, a.String()); err != nil {
		return fmt.Errorf("%w: %s to %s: write %s: %w", ErrBindFailed, a, driver, probe, err)
	}
	link := filepath.Join(s.devDir(a), "driver")
	var cur string
	err := waitFor(ctx, func() (bool, error) {
		var err error
		cur, err = linkBase(link)
		return cur == driver, err
	})
	if err != nil {
		got := "no driver"
		if cur != "" {
			got = "driver " + cur
		}
		return fmt.Errorf("%w: %s to %s: device has %s after probe (check dmesg): %w", ErrBindFailed, a, driver, got, err)
	}
	return nil
}

// ClearOverride clears <dev>/driver_override, so that the next probe picks
// the driver by device ID again. It does not rebind the device: call Reprobe.
func (s Sysfs) ClearOverride(a Address) error {
	// The kernel clears the override on an empty write; "\n" is what
	// `echo > driver_override` sends and is accepted everywhere.
	return s.setOverride(a, "\n")
}

// Reprobe asks the kernel to bind the device to a matching driver by writing
// its address to <sysfs>/bus/pci/drivers_probe. It does nothing to a device
// that has a driver. Use it after Unbind and ClearOverride to give a device
// back to its usual driver.
func (s Sysfs) Reprobe(a Address) error {
	if _, err := s.Lookup(a); err != nil {
		return err
	}
	probe := s.path("bus", "pci", "drivers_probe")
	if err := writeAttr(probe, a.String()); err != nil {
		return fmt.Errorf("pci: reprobe %s: write %s: %w", a, probe, err)
	}
	return nil
}

func (s Sysfs) setOverride(a Address, v string) error {
	p := filepath.Join(s.devDir(a), "driver_override")
	if err := writeAttr(p, v); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			if _, serr := os.Stat(s.devDir(a)); errors.Is(serr, fs.ErrNotExist) {
				return fmt.Errorf("%w: %s", ErrNotFound, a)
			}
		}
		return fmt.Errorf("pci: set driver_override of %s: %w", a, err)
	}
	return nil
}

// checkDriverName rejects names that could escape the drivers directory.
func checkDriverName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/ \t\n\x00") {
		return fmt.Errorf("invalid driver name %q: %w", name, fs.ErrInvalid)
	}
	return nil
}

// writeAttr writes v to an existing sysfs attribute in a single write, as
// sysfs stores expect (O_TRUNC, like a shell redirect). It never creates
// the file.
func writeAttr(path, v string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	_, werr := f.WriteString(v)
	cerr := f.Close()
	if werr != nil {
		return werr
	}
	return cerr
}

// waitFor calls cond until it reports true, fails, or ctx ends; without a
// deadline in ctx it gives up after settleTimeout.
func waitFor(ctx context.Context, cond func() (bool, error)) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, settleTimeout)
		defer cancel()
	}
	t := time.NewTicker(pollInterval)
	defer t.Stop()
	for {
		ok, err := cond()
		if err != nil || ok {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
