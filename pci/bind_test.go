package pci

import (
	"context"
	"errors"
	"io/fs"
	"reflect"
	"strings"
	"testing"
	"time"
)

func bindTree(t *testing.T) (*fakeSys, *fakeKernel) {
	f := standardTree(t)
	k := newFakeKernel(f, map[string]string{
		"0000:00:03.0": "virtio-pci",
		"0000:00:04.0": "e1000e",
		"0001:02:00.1": "igb",
	}, "virtio-pci", "vfio-pci", "e1000e", "igb")
	return f, k
}

func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestBindFromOtherDriver(t *testing.T) {
	f, k := bindTree(t)
	s := f.sys()
	a := Address{Device: 3}
	if err := s.Bind(testCtx(t, 5*time.Second), a, "vfio-pci"); err != nil {
		t.Fatal(err)
	}
	d, err := s.Lookup(a)
	if err != nil {
		t.Fatal(err)
	}
	if d.Driver != "vfio-pci" || d.DriverOverride != "vfio-pci" {
		t.Errorf("after Bind: driver %q override %q, want vfio-pci for both", d.Driver, d.DriverOverride)
	}
	want := []string{"unbind virtio-pci 0000:00:03.0", "probe 0000:00:03.0"}
	if got := k.events(); !reflect.DeepEqual(got, want) {
		t.Errorf("kernel saw %q, want %q", got, want)
	}

	// Idempotent: already bound, nothing is written.
	if err := s.Bind(testCtx(t, time.Second), a, "vfio-pci"); err != nil {
		t.Fatal(err)
	}
	if got := k.events(); len(got) != 2 {
		t.Errorf("second Bind wrote to the kernel: %q", got)
	}
}

func TestBindUnboundDevice(t *testing.T) {
	f, k := bindTree(t)
	a := Address{Domain: 1, Bus: 2, Function: 1}
	if err := f.sys().Bind(testCtx(t, 5*time.Second), a, "vfio-pci"); err != nil {
		t.Fatal(err)
	}
	if got, want := k.events(), []string{"probe 0001:02:00.1"}; !reflect.DeepEqual(got, want) {
		t.Errorf("kernel saw %q, want %q", got, want)
	}
}

func TestBindDriverNotLoaded(t *testing.T) {
	f, k := bindTree(t)
	a := Address{Device: 3}
	err := f.sys().Bind(testCtx(t, time.Second), a, "uio_pci_generic")
	if !errors.Is(err, ErrDriverNotLoaded) || !strings.Contains(err.Error(), "uio_pci_generic") || !strings.Contains(err.Error(), "0000:00:03.0") {
		t.Fatalf("Bind to an absent driver: %v, want ErrDriverNotLoaded naming driver and device", err)
	}
	// Nothing was touched: the device keeps its driver and has no override.
	d, _ := f.sys().Lookup(a)
	if d.Driver != "virtio-pci" || d.DriverOverride != "" || len(k.events()) != 0 {
		t.Errorf("failed Bind changed state: %+v, kernel saw %q", d, k.events())
	}
}

func TestBindProbeFails(t *testing.T) {
	f, k := bindTree(t)
	k.set(func() { k.failProbe["vfio-pci"] = true })
	a := Address{Device: 3}
	err := f.sys().Bind(testCtx(t, 200*time.Millisecond), a, "vfio-pci")
	if !errors.Is(err, ErrBindFailed) || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "no driver") {
		t.Fatalf("Bind with failing probe: %v, want ErrBindFailed (no driver, deadline)", err)
	}
	// The device is back on the driver Bind took it from, although the
	// deadline has passed, and the override is cleared.
	d, err := f.sys().Lookup(a)
	if err != nil {
		t.Fatal(err)
	}
	if d.Driver != "virtio-pci" || d.DriverOverride != "" {
		t.Errorf("after failed Bind: driver %q override %q, want virtio-pci and no override", d.Driver, d.DriverOverride)
	}
}

// TestBindProbeFailsRestoreFails: when the old driver does not take the
// device back either, the error says so as well as why the bind failed.
func TestBindProbeFailsRestoreFails(t *testing.T) {
	f, k := bindTree(t)
	k.set(func() { k.failProbe["vfio-pci"], k.failProbe["virtio-pci"] = true, true })
	defer func(d time.Duration) { restoreTimeout = d }(restoreTimeout)
	restoreTimeout = 200 * time.Millisecond
	a := Address{Device: 3}
	err := f.sys().Bind(testCtx(t, 200*time.Millisecond), a, "vfio-pci")
	if !errors.Is(err, ErrBindFailed) || !errors.Is(err, context.DeadlineExceeded) ||
		!strings.Contains(err.Error(), "to vfio-pci") || !strings.Contains(err.Error(), "giving 0000:00:03.0 back to virtio-pci failed") {
		t.Fatalf("Bind and its undo failing: %v, want both failures", err)
	}
	d, _ := f.sys().Lookup(a)
	if d.Driver != "" || d.DriverOverride != "" {
		t.Errorf("after failed Bind and undo: driver %q override %q, want no driver and no override", d.Driver, d.DriverOverride)
	}
}

// TestBindFromNoDriverProbeFails: a device that had no driver is left
// without one, and without the override.
func TestBindFromNoDriverProbeFails(t *testing.T) {
	f, k := bindTree(t)
	k.set(func() { k.failProbe["vfio-pci"] = true })
	a := Address{Domain: 1, Bus: 2, Function: 1}
	err := f.sys().Bind(testCtx(t, 100*time.Millisecond), a, "vfio-pci")
	if !errors.Is(err, ErrBindFailed) {
		t.Fatalf("Bind with a failing probe: %v", err)
	}
	d, _ := f.sys().Lookup(a)
	if d.Driver != "" || d.DriverOverride != "" {
		t.Errorf("after failed Bind: driver %q override %q, want both empty", d.Driver, d.DriverOverride)
	}
	if got, want := k.events(), []string{"probe 0001:02:00.1"}; !reflect.DeepEqual(got, want) {
		t.Errorf("kernel saw %q, want %q", got, want)
	}
}

func TestBindOtherDriverWins(t *testing.T) {
	// A kernel that ignores the override (as before driver_override
	// existed) gives the device back to its usual driver: Bind must say so.
	f, k := bindTree(t)
	k.set(func() { k.ignoreOverride = true })
	a := Address{Device: 3}
	err := f.sys().Bind(testCtx(t, 200*time.Millisecond), a, "vfio-pci")
	if !errors.Is(err, ErrBindFailed) || !strings.Contains(err.Error(), "driver virtio-pci after probe") {
		t.Fatalf("Bind won by another driver: %v, want ErrBindFailed naming virtio-pci", err)
	}
}

func TestBindBadName(t *testing.T) {
	f, _ := bindTree(t)
	for _, name := range []string{"", ".", "..", "../x", "vfio pci"} {
		err := f.sys().Bind(context.Background(), Address{Device: 3}, name)
		if !errors.Is(err, fs.ErrInvalid) {
			t.Errorf("Bind(%q): %v, want fs.ErrInvalid", name, err)
		}
	}
}

func TestBindMissingDevice(t *testing.T) {
	f, _ := bindTree(t)
	if err := f.sys().Bind(context.Background(), Address{Bus: 9}, "vfio-pci"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Bind of a missing device: %v, want ErrNotFound", err)
	}
	if err := f.sys().Unbind(context.Background(), Address{Bus: 9}); !errors.Is(err, ErrNotFound) {
		t.Errorf("Unbind of a missing device: %v, want ErrNotFound", err)
	}
	if err := f.sys().ClearOverride(Address{Bus: 9}); !errors.Is(err, ErrNotFound) {
		t.Errorf("ClearOverride of a missing device: %v, want ErrNotFound", err)
	}
}

func TestBindCanceledContext(t *testing.T) {
	f, k := bindTree(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := f.sys().Bind(ctx, Address{Device: 3}, "vfio-pci")
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Bind with a canceled context: %v", err)
	}
	if len(k.events()) != 0 {
		t.Errorf("canceled Bind wrote to the kernel: %q", k.events())
	}
}

func TestUnbindAndGiveBack(t *testing.T) {
	f, k := bindTree(t)
	s := f.sys()
	a := Address{Device: 4} // bound to vfio-pci with override set
	ctx := testCtx(t, 5*time.Second)
	if err := s.Unbind(ctx, a); err != nil {
		t.Fatal(err)
	}
	if d, _ := s.Lookup(a); d.Driver != "" {
		t.Fatalf("after Unbind: driver %q", d.Driver)
	}
	// Unbinding an unbound device does nothing.
	if err := s.Unbind(ctx, a); err != nil {
		t.Fatal(err)
	}
	if err := s.ClearOverride(a); err != nil {
		t.Fatal(err)
	}
	if d, _ := s.Lookup(a); d.DriverOverride != "" {
		t.Fatalf("after ClearOverride: override %q", d.DriverOverride)
	}
	if err := s.Reprobe(a); err != nil {
		t.Fatal(err)
	}
	// Reprobe does not wait; the fake kernel binds a moment later.
	err := waitFor(ctx, func() (bool, error) {
		d, err := s.Lookup(a)
		return d.Driver == "e1000e", err
	})
	if err != nil {
		t.Fatalf("device not returned to e1000e: %v", err)
	}
	want := []string{"unbind vfio-pci 0000:00:04.0", "probe 0000:00:04.0"}
	if got := k.events(); !reflect.DeepEqual(got, want) {
		t.Errorf("kernel saw %q, want %q", got, want)
	}
}

func TestUnbindStuck(t *testing.T) {
	// A driver whose unbind attribute is an ordinary file never lets go.
	f := standardTree(t)
	err := f.sys().Unbind(testCtx(t, 100*time.Millisecond), Address{Device: 3})
	if !errors.Is(err, ErrUnbindFailed) || !strings.Contains(err.Error(), "virtio-pci") {
		t.Errorf("stuck unbind: %v, want ErrUnbindFailed naming the driver", err)
	}
	if got := f.read("bus/pci/drivers/virtio-pci/unbind"); got != "0000:00:03.0" {
		t.Errorf("unbind attribute got %q", got)
	}
}
