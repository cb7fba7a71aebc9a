package afxdpvm

import (
	"testing"
	"time"

	"github.com/vfnic/vfnic/qemu"
)

// Guest NICs, in two pairs, each on a hub of its own: vfnic's (afxdp) and
// Linux's peer.
const (
	slotVirtio     = 4 // virtio-net, vfnic's
	slotVirtioPeer = 5 // virtio-net, Linux's, hub 1
	slotIGB        = 6 // igb (82576), vfnic's
	slotIGBPeer    = 7 // virtio-net, Linux's, hub 2
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
	// Split rings on the virtio-net NICs: a packed-ring Linux NIC can
	// stop transmitting for good on QEMU 10 (tests/netstackvm,
	// TestVMPeerStall). The igb pair's peer is a virtio-net NIC, the
	// Linux driver known to keep up on a hub.
	nics := []qemu.NIC{
		{Model: qemu.VirtioNet, Slot: slotVirtio, Net: qemu.Hub(1), Bind: qemu.BindLinux},
		{Model: qemu.VirtioNet, Slot: slotVirtioPeer, Net: qemu.Hub(1), Bind: qemu.BindLinux},
		{Model: qemu.IGB, Slot: slotIGB, Net: qemu.Hub(2), Bind: qemu.BindLinux},
		{Model: qemu.VirtioNet, Slot: slotIGBPeer, Net: qemu.Hub(2), Bind: qemu.BindLinux},
	}
	// xsk_diag: the kernel's listing of AF_XDP sockets (sock_diag).
	// One TCG thread: the igb suites froze multi-threaded TCG guests
	// (qemu.Config.OneTCGThread).
	cfg := qemu.Config{NICs: nics, Kernel: k, Modules: []string{"xsk_diag"}, Timeout: 4 * time.Minute, OneTCGThread: true}
	qemu.RunGoTestT(t, cfg, qemu.GoTest{
		Package: "github.com/vfnic/vfnic/tests/afxdpvm",
		Run:     "^TestGuestZeroCopy$",
		Args:    []string{"-test.timeout=210s"},
	})
}
