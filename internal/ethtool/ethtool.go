// Package ethtool reads and sets the ring sizes and channels of a Linux
// interface through the SIOCETHTOOL ioctl (what ethtool -g and -G, -l
// and -L do), for the guests' tests, whose busybox has no ethtool.
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
	if err := ioctl(ifname, rp.Cmd, unsafe.Pointer(&rp)); err != nil {
		return Rings{}, err
	}
	return Rings{RxMax: rp.RxMax, TxMax: rp.TxMax, Rx: rp.Rx, Tx: rp.Tx}, nil
}

// SetRings sets ifname's ring sizes (drivers such as igb restart the
// interface to do it: its link goes down and up).
func SetRings(ifname string, rx, tx uint32) error {
	rp := ringparam{Cmd: unix.ETHTOOL_GRINGPARAM}
	if err := ioctl(ifname, rp.Cmd, unsafe.Pointer(&rp)); err != nil {
		return err
	}
	rp.Cmd, rp.Rx, rp.Tx = unix.ETHTOOL_SRINGPARAM, rx, tx
	return ioctl(ifname, rp.Cmd, unsafe.Pointer(&rp))
}

// Channels are an interface's queue counts (struct ethtool_channels):
// the driver's maxima and the counts in use.
type Channels struct {
	MaxRx, MaxTx, MaxOther, MaxCombined uint32
	Rx, Tx, Other, Combined             uint32
}

// channels is struct ethtool_channels.
type channels struct {
	Cmd uint32
	Channels
}

// GetChannels asks the driver of ifname for its queue counts.
func GetChannels(ifname string) (Channels, error) {
	ch := channels{Cmd: unix.ETHTOOL_GCHANNELS}
	if err := ioctl(ifname, ch.Cmd, unsafe.Pointer(&ch)); err != nil {
		return Channels{}, err
	}
	return ch.Channels, nil
}

// SetCombined sets ifname's combined queue count, the others left as
// they are (drivers such as igb restart the interface to do it).
func SetCombined(ifname string, n uint32) error {
	ch := channels{Cmd: unix.ETHTOOL_GCHANNELS}
	if err := ioctl(ifname, ch.Cmd, unsafe.Pointer(&ch)); err != nil {
		return err
	}
	ch.Cmd, ch.Combined = unix.ETHTOOL_SCHANNELS, n
	return ioctl(ifname, ch.Cmd, unsafe.Pointer(&ch))
}

// ioctl runs the ethtool command cmd on ifname with its structure at p.
func ioctl(ifname string, cmd uint32, p unsafe.Pointer) error {
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
	ifr.Data = p
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr))); e != 0 {
		return fmt.Errorf("ethtool: command %#x on %s: %w", cmd, ifname, e)
	}
	return nil
}
