package main

import (
	"net"

	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/pci"
)

// kernelMaxFrame returns the longest frame vfnic's driver will send on the
// device at a, as far as the kernel's driver tells (its interfaces'
// IFLA_MAX_MTU through netlink, plus a tagged header; see the driver
// cases), when the device is on a kernel network driver: opening it would
// rebind it, so a frame size it can never take is refused before that. ok
// is false when the kernel cannot say (vfio-pci, no driver, no interface):
// the device's own limit, read once it is open, decides then.
func kernelMaxFrame(a pci.Address) (max int, ok bool) {
	d, err := pci.Sysfs{}.Lookup(a)
	if err != nil || d.Driver == "" || d.Driver == pci.VFIODriver {
		return 0, false
	}
	for _, ifn := range d.NetInterfaces {
		ifi, err := net.InterfaceByName(ifn)
		if err != nil {
			continue
		}
		mtu, err := pci.MaxMTU(ifi.Index)
		if err != nil || mtu <= 0 {
			continue
		}
		switch d.Driver {
		case "virtio-pci":
			// Linux allows 65535 when the device offers no MTU; vfnic's
			// virtio driver then uses 1500, as Linux does by default.
			if mtu >= 65535 {
				mtu = 1500
			}
		case "igb":
			// vfnic's igb driver sends standard frames only: a
			// 1500-byte payload with two VLAN tags (1522 bytes).
			return min(mtu, 1500) + nic.FrameOverhead, true
		}
		return mtu + nic.FrameOverhead, true
	}
	return 0, false
}
