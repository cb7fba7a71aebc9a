package netstackvm

import (
	"os"
	"testing"
	"time"

	"github.com/vfnic/vfnic/qemu"
)

// Guest addresses: the netstack on the vfnic NIC, Linux on the other.
const (
	slotVfnic = 4
	slotLinux = 6 // igb NICs sit two slots apart (QEMU reserves slots for VFs)
	vfnicIP4  = "10.0.9.1"
	linuxIP4  = "10.0.9.2/24"
	vfnicIP6  = "fd00:9::1"
	linuxIP6  = "fd00:9::2/64"
)

// TestVM boots one guest per NIC kind and runs TestGuestNetstack there.
func TestVM(t *testing.T) {
	if qemu.InGuest() {
		t.Skip("host side: boots the guests that run TestGuestNetstack")
	}
	qemu.RequireVM(t)
	type kind struct {
		name   string
		model  qemu.NICModel
		packed bool
	}
	// igb in make test (its checksum offloads run on and off there);
	// virtio split too with VFNIC_NETSTACK_SPLIT=1: a guest per kind is
	// about a minute, and the suite has a 15-minute budget.
	kinds := []kind{{"igb", qemu.IGB, false}}
	if os.Getenv("VFNIC_NETSTACK_SPLIT") == "1" {
		kinds = append(kinds, kind{"virtio-split", qemu.VirtioNet, false})
	}
	// virtio-packed only on request until its receive stall is found: on
	// a loaded machine (load average 10 to 13 on 2 cores) the packed
	// ring's device stopped delivering frames in two runs of four (the
	// polling core asleep waiting for an interrupt, every receive buffer
	// posted, the device's receive count frozen, the stack's sends still
	// going out: Linux's ARP then fails with "no route to host"), once at
	// the first fetch and once during the QUIC echo; split and igb pass
	// in the same runs. A third run failed at the first fetch with the
	// rings' counts logged: the device had delivered 3 frames and held
	// no completion unread (not a lost interrupt), the driver's one
	// receive flush after the initial fill was suppressed by the
	// device's event, and Linux's sends were held in its own queues
	// (TCPSpuriousRtxHostQueues). That fits QEMU queueing the wire's
	// frames while it takes the packed receive ring for unable to
	// receive, and releasing them only on a receive notification, which
	// nic/virtio's event suppression did not send (not yet confirmed in
	// QEMU's state). VFNIC_NETSTACK_PACKED=1 puts it back.
	if os.Getenv("VFNIC_NETSTACK_PACKED") == "1" {
		kinds = append(kinds, kind{"virtio-packed", qemu.VirtioNet, true})
	}
	args, timeout := []string{"-test.timeout=160s"}, 3*time.Minute
	if r := os.Getenv("VFNIC_NETSTACK_REPEAT"); r != "" {
		// A soak for stalls: each fetch that many times, in a guest
		// that may then run for minutes.
		args, timeout = []string{"-test.timeout=30m", "-netstack.repeat=" + r}, 31*time.Minute
	}
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			cfg := qemu.Config{
				NICs: []qemu.NIC{
					{Model: k.model, Packed: k.packed, Slot: slotVfnic, Net: qemu.Hub(1), Bind: qemu.BindVFIO},
					{Model: k.model, Packed: k.packed, Slot: slotLinux, Net: qemu.Hub(1), Bind: qemu.BindLinux, IPv4: linuxIP4},
				},
				Timeout:      timeout,
				OneTCGThread: true,
			}
			if os.Getenv("VFNIC_GUEST_VERBOSE") != "" {
				cfg.Output = os.Stderr
			}
			qemu.RunGoTestT(t, cfg, qemu.GoTest{
				Package: "github.com/vfnic/vfnic/tests/netstackvm",
				Run:     "^TestGuest",
				Args:    args,
			})
		})
	}
}
