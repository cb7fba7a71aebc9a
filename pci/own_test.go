package pci

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

// ownTree is standardTree with a fake kernel and empty /proc and /dev.
func ownTree(t *testing.T) (*fakeSys, *fakeKernel, Sysfs) {
	f, k := bindTree(t)
	s := f.sys()
	s.Proc = filepath.Join(t.TempDir(), "proc")
	s.Dev = filepath.Join(t.TempDir(), "dev")
	for _, d := range []string{s.Proc, filepath.Join(s.Dev, "vfio")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return f, k, s
}

// addProc makes /proc/PID with comm and fds pointing at targets.
func addProc(t *testing.T, s Sysfs, pid int, comm string, targets ...string) {
	t.Helper()
	dir := filepath.Join(s.Proc, strconv.Itoa(pid))
	if err := os.MkdirAll(filepath.Join(dir, "fd"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "comm"), []byte(comm+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for i, tg := range targets {
		if err := os.Symlink(tg, filepath.Join(dir, "fd", strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
}

func TestGiveBackRefusesKernelDriver(t *testing.T) {
	_, k, s := ownTree(t)
	a := Address{Device: 3} // on virtio-pci, carrying eth0
	drv, err := s.GiveBack(testCtx(t, time.Second), a, GiveBackOptions{})
	if !errors.Is(err, ErrNotVFIO) || !strings.Contains(err.Error(), "virtio-pci") || !strings.Contains(err.Error(), "0000:00:03.0") {
		t.Fatalf("GiveBack of a virtio-pci device: %v, want ErrNotVFIO naming the driver and device", err)
	}
	if drv != "virtio-pci" || len(k.events()) != 0 {
		t.Errorf("refused GiveBack: driver %q, kernel saw %q; want nothing changed", drv, k.events())
	}
}

func TestGiveBackForceStillChecksInUse(t *testing.T) {
	f, k, s := ownTree(t)
	f.setLink("eth0", "0x1003", "up")
	a := Address{Device: 3}
	_, err := s.GiveBack(testCtx(t, time.Second), a, GiveBackOptions{Force: true, Net: &fixedNet{}})
	if !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), "eth0 is up") {
		t.Fatalf("forced GiveBack of an up interface: %v, want ErrInUse", err)
	}
	if len(k.events()) != 0 {
		t.Errorf("kernel saw %q", k.events())
	}
	f.setLink("eth0", "0x1002", "down")
	drv, err := s.GiveBack(testCtx(t, 5*time.Second), a, GiveBackOptions{Force: true, Net: &fixedNet{}})
	if err != nil {
		t.Fatal(err)
	}
	if drv != "virtio-pci" {
		t.Errorf("forced GiveBack ended on %q, want the kernel's reprobe to pick virtio-pci again", drv)
	}
}

func TestGiveBackRefusesHeldDevice(t *testing.T) {
	_, k, s := ownTree(t)
	addProc(t, s, 1, "init", "/dev/null", "/dev/console")
	addProc(t, s, 4242, "vfnic", "/dev/null", "/dev/vfio/vfio", "/dev/vfio/8")
	addProc(t, s, 77, "other", "/dev/vfio/9") // another group
	if err := os.MkdirAll(filepath.Join(s.Proc, "self"), 0o755); err != nil {
		t.Fatal(err)
	}
	a := Address{Device: 4} // vfio-pci, group 8
	hs, err := s.Holders(a)
	if err != nil {
		t.Fatal(err)
	}
	if want := []Holder{{PID: 4242, Command: "vfnic", Path: "/dev/vfio/8"}}; !reflect.DeepEqual(hs, want) {
		t.Errorf("Holders = %+v, want %+v", hs, want)
	}
	start := time.Now()
	_, err = s.GiveBack(testCtx(t, 5*time.Second), a, GiveBackOptions{})
	if !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "pid 4242 vfnic") {
		t.Fatalf("GiveBack of a held device: %v, want ErrBusy naming pid 4242", err)
	}
	if el := time.Since(start); el > time.Second {
		t.Errorf("refusal took %v", el)
	}
	if len(k.events()) != 0 {
		t.Errorf("kernel saw %q, want no unbind", k.events())
	}
}

func TestCheckHeldByDeviceCdev(t *testing.T) {
	f, _, s := ownTree(t)
	f.mkdir(f.devRel("0000:00:04.0") + "/vfio-dev/vfio3")
	addProc(t, s, 99, "spdk_tgt", "/dev/vfio/devices/vfio3")
	err := s.CheckHeld(Address{Device: 4})
	if !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "pid 99 spdk_tgt (/dev/vfio/devices/vfio3)") {
		t.Fatalf("CheckHeld: %v, want ErrBusy naming pid 99", err)
	}
}

func TestTakeAndRelease(t *testing.T) {
	_, k, s := ownTree(t)
	a := Address{Device: 3}
	c, err := s.Take(testCtx(t, 5*time.Second), a, TakeOptions{Net: &fixedNet{}})
	if err != nil {
		t.Fatal(err)
	}
	if c.Previous != "virtio-pci" || !c.Bound {
		t.Errorf("Claim = %+v, want Previous virtio-pci, Bound", c)
	}
	if err := c.Release(testCtx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	d, _ := s.Lookup(a)
	if d.Driver != "virtio-pci" || d.DriverOverride != "" {
		t.Errorf("after Release: driver %q override %q, want virtio-pci and no override", d.Driver, d.DriverOverride)
	}
	want := []string{"unbind virtio-pci 0000:00:03.0", "probe 0000:00:03.0", "unbind vfio-pci 0000:00:03.0", "probe 0000:00:03.0"}
	if got := k.events(); !reflect.DeepEqual(got, want) {
		t.Errorf("kernel saw %q, want %q", got, want)
	}
}

func TestTakeAlreadyVFIOReleaseKeeps(t *testing.T) {
	_, k, s := ownTree(t)
	a := Address{Device: 4}
	c, err := s.Take(testCtx(t, time.Second), a, TakeOptions{Net: &fixedNet{}})
	if err != nil {
		t.Fatal(err)
	}
	if c.Bound || c.Previous != "vfio-pci" {
		t.Errorf("Claim = %+v, want not Bound", c)
	}
	if err := c.Release(testCtx(t, time.Second)); err != nil {
		t.Fatal(err)
	}
	if d, _ := s.Lookup(a); d.Driver != "vfio-pci" || len(k.events()) != 0 {
		t.Errorf("device moved to %q, kernel saw %q", d.Driver, k.events())
	}
}

func TestReleaseUnboundStaysUnbound(t *testing.T) {
	_, k, s := ownTree(t)
	a := Address{Domain: 1, Bus: 2, Function: 1} // no driver; igb would claim it
	c, err := s.Take(testCtx(t, 5*time.Second), a, TakeOptions{Net: &fixedNet{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Release(testCtx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	d, _ := s.Lookup(a)
	if d.Driver != "" || d.DriverOverride != "" {
		t.Errorf("after Release: driver %q override %q, want where it was: no driver", d.Driver, d.DriverOverride)
	}
	if got, want := k.events(), []string{"probe 0001:02:00.1", "unbind vfio-pci 0001:02:00.1"}; !reflect.DeepEqual(got, want) {
		t.Errorf("kernel saw %q, want %q", got, want)
	}
}

// TestTakeProbeFailsRestoresDriver: a Take whose vfio-pci probe fails
// (here until its deadline has passed) gives the device back to the driver
// it took it from, so that the NIC's kernel interface comes back.
func TestTakeProbeFailsRestoresDriver(t *testing.T) {
	_, k, s := ownTree(t)
	k.set(func() { k.failProbe["vfio-pci"] = true })
	a := Address{Device: 3}
	c, err := s.Take(testCtx(t, 300*time.Millisecond), a, TakeOptions{Net: &fixedNet{}})
	if !errors.Is(err, ErrBindFailed) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Take with a failing probe: %v, want ErrBindFailed after the deadline", err)
	}
	if c != (Claim{}) {
		t.Errorf("failed Take returned %+v", c)
	}
	d, err := s.Lookup(a)
	if err != nil {
		t.Fatal(err)
	}
	if d.Driver != "virtio-pci" || d.DriverOverride != "" {
		t.Errorf("after a failed Take: driver %q override %q, want virtio-pci again and no override", d.Driver, d.DriverOverride)
	}
	want := []string{"unbind virtio-pci 0000:00:03.0", "probe 0000:00:03.0", "probe 0000:00:03.0"}
	if got := k.events(); !reflect.DeepEqual(got, want) {
		t.Errorf("kernel saw %q, want %q", got, want)
	}
}

func TestTakeRefusesInUse(t *testing.T) {
	f, k, s := ownTree(t)
	f.setLink("eth0", "0x1003", "up")
	_, err := s.Take(testCtx(t, time.Second), Address{Device: 3}, TakeOptions{Net: &fixedNet{}})
	if !errors.Is(err, ErrInUse) || len(k.events()) != 0 {
		t.Fatalf("Take of an up interface: %v, kernel saw %q", err, k.events())
	}
}

func TestListReportsUnreadablePerDevice(t *testing.T) {
	f := standardTree(t)
	// A device whose class attribute is garbage: the others still list.
	f.write(f.devRel("0000:00:04.0")+"/class", "not-a-number\n")
	ds, err := f.sys().List(ListOptions{})
	if !errors.Is(err, ErrUnreadable) || !strings.Contains(err.Error(), "0000:00:04.0") {
		t.Fatalf("List error %v, want ErrUnreadable naming 0000:00:04.0", err)
	}
	var got []string
	for _, d := range ds {
		got = append(got, d.Address.String())
	}
	if want := []string{"0000:00:00.0", "0000:00:03.0", "0001:02:00.1"}; !reflect.DeepEqual(got, want) {
		t.Errorf("List = %v, want %v", got, want)
	}
}
