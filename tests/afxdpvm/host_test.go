package afxdpvm

import (
	"testing"
	"time"

	"github.com/vfnic/vfnic/qemu"
)

// Guest NICs: vfnic's (afxdp) and Linux's, on one hub.
const (
	slotVfnic = 4
	slotLinux = 5
)

// TestVM boots the guest on the backports kernel and runs
// TestGuestZeroCopy there.
func TestVM(t *testing.T) {
	if qemu.InGuest() {
		t.Skip("host side: boots the guest that runs TestGuestZeroCopy")
	}
	qemu.RequireVM(t)
	k, err := qemu.FindBackportsKernel()
	if err != nil {
		// RequireVM's rule for the second kernel: loud under CI.
		msg := "VM test cannot run: " + err.Error() + " (scripts/setup.sh fetches it into kernel-bpo)"
		if qemu.InCI() {
			t.Fatal(msg + " (CI=true: VM tests must run)")
		}
		t.Skip(msg)
	}
	// Split rings on both NICs: a packed-ring Linux NIC can stop
	// transmitting for good on QEMU 10 (tests/netstackvm, TestVMPeerStall).
	nics := []qemu.NIC{
		{Model: qemu.VirtioNet, Slot: slotVfnic, Net: qemu.Hub(1), Bind: qemu.BindLinux},
		{Model: qemu.VirtioNet, Slot: slotLinux, Net: qemu.Hub(1), Bind: qemu.BindLinux},
	}
	// xsk_diag: the kernel's listing of AF_XDP sockets (sock_diag).
	cfg := qemu.Config{NICs: nics, Kernel: k, Modules: []string{"xsk_diag"}, Timeout: 3 * time.Minute, OneTCGThread: true}
	qemu.RunGoTestT(t, cfg, qemu.GoTest{
		Package: "github.com/vfnic/vfnic/tests/afxdpvm",
		Run:     "^TestGuestZeroCopy$",
		Args:    []string{"-test.timeout=150s"},
	})
}
