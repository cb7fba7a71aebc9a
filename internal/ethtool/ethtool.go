// Package ethtool reads and sets the ring sizes of a Linux interface
// through the SIOCETHTOOL ioctl (what ethtool -g and -G do), for the
// guests' tests, whose busybox has no ethtool.
package ethtool

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Rings are an interface's receive and transmit ring sizes in
// descriptors: the driver's maxima and the sizes in use.
type Rings struct {
	RxMax, TxMax uint32
	Rx, Tx       uint32
}

// ringparam is struct ethtool_ringparam.
type ringparam struct {
	Cmd, RxMax, RxMiniMax, RxJumboMax, TxMax, Rx, RxMini, RxJumbo, Tx uint32
}

// ifreqData is struct ifreq with ifr_data.
type ifreqData struct {
	Name [unix.IFNAMSIZ]byte
	Data unsafe.Pointer
	_    [16]byte
}

// GetRings asks the driver of ifname for its ring sizes.
func GetRings(ifname string) (Rings, error) {
	rp := ringparam{Cmd: unix.ETHTOOL_GRINGPARAM}
	if err := ioctl(ifname, &rp); err != nil {
		return Rings{}, err
	}
	return Rings{RxMax: rp.RxMax, TxMax: rp.TxMax, Rx: rp.Rx, Tx: rp.Tx}, nil
}

// SetRings sets ifname's ring sizes (drivers such as igb restart the
// interface to do it: its link goes down and up).
func SetRings(ifname string, rx, tx uint32) error {
	rp := ringparam{Cmd: unix.ETHTOOL_GRINGPARAM}
	if err := ioctl(ifname, &rp); err != nil {
		return err
	}
	rp.Cmd, rp.Rx, rp.Tx = unix.ETHTOOL_SRINGPARAM, rx, tx
	return ioctl(ifname, &rp)
}

func ioctl(ifname string, rp *ringparam) error {
	if len(ifname) >= unix.IFNAMSIZ {
		return fmt.Errorf("ethtool: interface name %q too long", ifname)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("ethtool: %w", err)
	}
	defer unix.Close(fd)
	var ifr ifreqData
	copy(ifr.Name[:], ifname)
	ifr.Data = unsafe.Pointer(rp)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr))); e != 0 {
		return fmt.Errorf("ethtool: command %#x on %s: %w", rp.Cmd, ifname, e)
	}
	return nil
}
