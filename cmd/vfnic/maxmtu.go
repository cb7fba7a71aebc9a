package main

import (
	"encoding/binary"
	"fmt"
	"net"
	"syscall"

	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/pci"
	"golang.org/x/sys/unix"
)

// kernelMaxFrame returns the longest frame vfnic's driver will send on the
// device at a, as far as the kernel's driver tells (its interfaces'
// IFLA_MAX_MTU through netlink, plus a tagged header; see the driver
// cases), when the device is on a kernel network driver: opening it would
// rebind it, so a frame size it can never take is refused before that. ok is false when the kernel cannot say
// (vfio-pci, no driver, no interface): the device's own limit, read once
// it is open, decides then.
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
		mtu, err := maxMTU(ifi.Index)
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

// maxMTU reads IFLA_MAX_MTU of interface index from the kernel; 0 when
// it sets none.
func maxMTU(index int) (int, error) {
	rib, err := syscall.NetlinkRIB(unix.RTM_GETLINK, syscall.AF_UNSPEC)
	if err != nil {
		return 0, err
	}
	msgs, err := syscall.ParseNetlinkMessage(rib)
	if err != nil {
		return 0, err
	}
	for i := range msgs {
		m := &msgs[i]
		// struct ifinfomsg: family, pad, type (2), index (4), flags, change.
		if m.Header.Type != unix.RTM_NEWLINK || len(m.Data) < unix.SizeofIfInfomsg ||
			int(int32(binary.NativeEndian.Uint32(m.Data[4:8]))) != index {
			continue
		}
		attrs, err := syscall.ParseNetlinkRouteAttr(m)
		if err != nil {
			return 0, err
		}
		for _, at := range attrs {
			if at.Attr.Type == unix.IFLA_MAX_MTU && len(at.Value) >= 4 {
				return int(binary.NativeEndian.Uint32(at.Value)), nil
			}
		}
		return 0, nil // a kernel older than 4.19 does not say
	}
	return 0, fmt.Errorf("interface %d not found", index)
}
