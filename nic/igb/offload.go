package igb

import (
	"fmt"

	"github.com/vfnic/vfnic/nic"
)

// Checksum is the device's verdict on one checksum of a received frame.
type Checksum uint8

// Checksum verdicts.
const (
	// ChecksumNone: the device did not check it (not IP, not TCP/UDP, or
	// offload off).
	ChecksumNone Checksum = iota
	// ChecksumGood: checked and correct.
	ChecksumGood
	// ChecksumBad: checked and wrong.
	ChecksumBad
)

func (c Checksum) String() string {
	switch c {
	case ChecksumNone:
		return "none"
	case ChecksumGood:
		return "good"
	case ChecksumBad:
		return "bad"
	}
	return fmt.Sprintf("Checksum(%d)", int(c))
}

// Packet type bits of the receive write-back (PKTTYPE in pkt_info,
// datasheet 7.1.5.2; Linux E1000_RXDADV_PKTTYPE_*).
const (
	PktIPv4   = 0x010
	PktIPv4Ex = 0x020
	PktIPv6   = 0x040
	PktIPv6Ex = 0x080
	PktTCP    = 0x100
	PktUDP    = 0x200
	PktSCTP   = 0x400
	PktNFS    = 0x800
)

// Write-back status and error bits beyond DD/EOP (Linux E1000_RXD_STAT_*,
// E1000_RXDEXT_STATERR_*).
const (
	rxdStatusVP    = 1 << 3 // VLAN packet: the tag was stripped to the vlan field
	rxdStatusUDPCS = 1 << 4
	rxdStatusTCPCS = 1 << 5
	rxdStatusIPCS  = 1 << 6
	rxdErrL4E      = 1 << 29
	rxdErrIPE      = 1 << 30
	rxdErrRXE      = 1 << 31
)

// RxOffload is what the device reported about a received frame besides
// its length: packet type, RSS hash, checksum verdicts and stripped VLAN
// tag. It is informational: the driver never indexes anything with it.
type RxOffload struct {
	// PacketType holds Pkt* bits (IPv4, UDP, ...).
	PacketType uint16
	// RSSType is the hash function used (0: no hash, e.g. RSS off).
	RSSType uint8
	// RSSHash is the Toeplitz hash, valid when RSSType is not 0.
	RSSHash uint32
	// VLANStripped says the device removed an 802.1Q tag (Config.VLANStrip);
	// VLAN is its TCI.
	VLANStripped bool
	VLAN         uint16
	// IPChecksum and L4Checksum are the device's checksum verdicts; UDP
	// says the L4 checksum was a UDP one.
	IPChecksum, L4Checksum Checksum
	UDP                    bool
	// RxError is the RXE bit (a CRC, symbol or other receive error). It
	// is always false: the driver does not ask the device to store bad
	// frames (RCTL.SBP), so a write-back with RXE completes as an error
	// (nic.ErrDeviceStatus) and its frame is never lent. Kept so that
	// code reading it still compiles.
	RxError bool
}

// rxMeta is the raw write-back of a received frame, kept per buffer until
// it goes back to the device.
type rxMeta struct{ w0, w1 uint64 }

func (m rxMeta) decode(rss bool) RxOffload {
	lo, st := uint32(m.w0), uint32(m.w1)
	o := RxOffload{PacketType: uint16(lo & 0xfff0), RSSType: uint8(lo & 0xf), RxError: st&rxdErrRXE != 0}
	if rss && o.RSSType != 0 {
		// With RXCSUM.PCSD the second word is the hash; without it, the
		// IP identification and fragment checksum.
		o.RSSHash = uint32(m.w0 >> 32)
	} else {
		o.RSSType = 0
	}
	if st&rxdStatusVP != 0 {
		o.VLANStripped, o.VLAN = true, uint16(m.w1>>48)
	}
	if st&rxdStatusIPCS != 0 {
		o.IPChecksum = ChecksumGood
		if st&rxdErrIPE != 0 {
			o.IPChecksum = ChecksumBad
		}
	}
	if st&(rxdStatusTCPCS|rxdStatusUDPCS) != 0 {
		o.L4Checksum = ChecksumGood
		if st&rxdErrL4E != 0 {
			o.L4Checksum = ChecksumBad
		}
		o.UDP = st&rxdStatusUDPCS != 0
	}
	return o
}

// Offload returns what the device reported about the received frame at
// buf (a completion's Buf), while the frame is lent to the caller.
func (q *RxQueue) Offload(buf uintptr) (RxOffload, error) {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if q.Closed {
		return RxOffload{}, nic.ErrClosed
	}
	b, err := q.bufs.Lent(buf)
	if err != nil {
		return RxOffload{}, err
	}
	return q.meta[b].decode(q.rss), nil
}
