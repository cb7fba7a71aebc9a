package vfio

import (
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// fd0Pipe makes fd 0 the write end of a pipe for the test, and returns a
// check that fd 0 is still open and nothing was written to it.
func fd0Pipe(t *testing.T) (check func()) {
	t.Helper()
	saved, err := unix.Dup(0)
	if err != nil {
		t.Skip(err)
	}
	t.Cleanup(func() {
		unix.Dup2(saved, 0)
		unix.Close(saved)
	})
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(p[0]) })
	if err := unix.Dup2(p[1], 0); err != nil {
		t.Fatal(err)
	}
	unix.Close(p[1])
	return func() {
		t.Helper()
		if _, err := unix.FcntlInt(0, unix.F_GETFD, 0); err != nil {
			t.Errorf("fd 0 was closed: %v", err)
		}
		var b [64]byte
		if n, err := unix.Read(p[0], b[:]); err != unix.EAGAIN {
			t.Errorf("fd 0 was written: %d bytes, %v", n, err)
		}
	}
}

func wantInvalid(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, os.ErrInvalid) {
		t.Errorf("%s on a zero value: %v, want os.ErrInvalid", what, err)
	}
}

// TestZeroContainer: a Container that OpenContainerAt did not make owns no
// descriptor: its methods fail with os.ErrInvalid, its Close does nothing,
// and neither touches fd 0.
func TestZeroContainer(t *testing.T) {
	check := fd0Pipe(t)
	var c Container
	_, err := c.CheckExtension(ExtType1v2IOMMU)
	wantInvalid(t, "CheckExtension", err)
	_, err = c.OpenGroup(1)
	wantInvalid(t, "OpenGroup", err)
	_, err = c.IOMMUInfo()
	wantInvalid(t, "IOMMUInfo", err)
	_, err = c.IOVARanges()
	wantInvalid(t, "IOVARanges", err)
	wantInvalid(t, "MapDMA", c.MapDMA(make([]byte, 4096), 0))
	wantInvalid(t, "UnmapDMA", c.UnmapDMA(0, 4096))
	if err := c.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	wantInvalid(t, "CheckExtension after Close", func() error { _, err := c.CheckExtension(ExtType1v2IOMMU); return err }())
	check()
}

// TestZeroGroup: the same for a Group that Container.OpenGroup did not make.
func TestZeroGroup(t *testing.T) {
	check := fd0Pipe(t)
	var g Group
	_, err := g.OpenDevice("0000:7f:1f.0")
	wantInvalid(t, "OpenDevice", err)
	if err := g.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	check()
}

// TestZeroDevice: the same for a Device that Group.OpenDevice did not make.
func TestZeroDevice(t *testing.T) {
	check := fd0Pipe(t)
	var d Device
	_, err := d.RegionInfo(RegionConfig)
	wantInvalid(t, "RegionInfo", err)
	_, err = d.ReadRegion(RegionConfig, make([]byte, 4), 0)
	wantInvalid(t, "ReadRegion", err)
	_, err = d.WriteRegion(RegionConfig, make([]byte, 4), 0)
	wantInvalid(t, "WriteRegion", err)
	_, err = d.ReadConfig16(0)
	wantInvalid(t, "ReadConfig16", err)
	wantInvalid(t, "SetBusMaster", d.SetBusMaster(true))
	_, err = d.MapRegion(0)
	wantInvalid(t, "MapRegion", err)
	wantInvalid(t, "Reset", d.Reset())
	_, err = d.IRQInfo(IRQMSIX)
	wantInvalid(t, "IRQInfo", err)
	wantInvalid(t, "EnableIRQ", d.EnableIRQ(IRQMSIX, []int{-1}))
	wantInvalid(t, "DisableIRQ", d.DisableIRQ(IRQMSIX))
	wantInvalid(t, "TriggerIRQ", d.TriggerIRQ(IRQMSIX, 0))
	if err := d.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	wantInvalid(t, "Reset after Close", d.Reset())
	check()
}
