// Package guesttest is run inside a guest by the qemu package's tests, to
// check that guest test results (pass, fail, skip, subtests) reach the host.
package guesttest

import (
	"os"
	"testing"

	"github.com/vfnic/vfnic/qemu"
)

// TestGuestPass passes only in a guest whose NICs are bound to vfio-pci.
func TestGuestPass(t *testing.T) {
	qemu.SkipUnlessGuest(t)
	nics, err := qemu.GuestNICs()
	if err != nil || len(nics) == 0 {
		t.Fatalf("GuestNICs: %v %v", nics, err)
	}
	for _, n := range nics {
		t.Run(string(n.Model), func(t *testing.T) {
			if _, err := os.Stat("/sys/bus/pci/drivers/vfio-pci/" + n.GuestAddr()); err != nil {
				t.Fatalf("%s not bound to vfio-pci: %v", n.GuestAddr(), err)
			}
			t.Logf("%s on vfio-pci", n.GuestAddr())
		})
	}
	if b, err := os.ReadFile("testdata/marker.txt"); err != nil || string(b) != "testdata reached the guest\n" {
		t.Errorf("testdata/marker.txt: %q %v", b, err)
	}
}

// TestGuestFail fails on purpose when VFNIC_WANT_FAIL=1.
func TestGuestFail(t *testing.T) {
	if os.Getenv("VFNIC_WANT_FAIL") == "1" {
		t.Log("failing on purpose")
		t.Fail()
	}
}

// TestGuestSkip skips on purpose when VFNIC_WANT_FAIL=1.
func TestGuestSkip(t *testing.T) {
	if os.Getenv("VFNIC_WANT_FAIL") == "1" {
		t.Skip("skipping on purpose")
	}
}
