package igb

import (
	"fmt"

	"github.com/vfnic/vfnic/nic"
)

// errCsumOff is SendL4Checksum's refusal with nic.Config.NoTxChecksumOffload.
var errCsumOff = fmt.Errorf("%w: igb: transmit checksum offload turned off (nic.Config.NoTxChecksumOffload)", nic.ErrNotSupported)

// ChecksumVerified reports what the device found when it checked the
// received frame at buf (a completion's Buf, while the frame is lent):
// checked is true when it verified the frame's TCP or UDP checksum and,
// for IPv4, its header checksum; valid when those it verified were
// correct. A frame the device did not check (fragments, other protocols)
// is checked false. It is the receive side of a network stack's checksum
// offload (package netstack) in basic types, so that the stack needs no
// igb types. With nic.Config.NoRxChecksumOffload every frame is checked
// false.
func (q *RxQueue) ChecksumVerified(buf uintptr) (checked, valid bool, err error) {
	o, err := q.Offload(buf)
	if err != nil || q.noCsum {
		return false, false, err
	}
	l4 := o.L4Checksum != ChecksumNone
	ip := o.PacketType&(PktIPv4|PktIPv4Ex) == 0 || o.IPChecksum != ChecksumNone
	checked = l4 && ip
	valid = o.L4Checksum != ChecksumBad && o.IPChecksum != ChecksumBad
	return checked, valid, nil
}

// SendL4Checksum is SendChecksum with TxL4: the device fills in the
// frame's TCP or UDP checksum (the IPv4 header's is the caller's). It is
// the transmit side of a network stack's checksum offload (package
// netstack) in basic types. Frames the device cannot checksum fail with
// an error matching nic.ErrNotSupported, as SendChecksum's do, and so
// does every frame with nic.Config.NoTxChecksumOffload.
func (q *TxQueue) SendL4Checksum(frame []byte, ctx any) error {
	if q.noCsum {
		return errCsumOff
	}
	return q.SendChecksum(frame, ctx, TxL4)
}

// ChecksumOffload reports whether ChecksumVerified reports the device's
// verdicts (not turned off by nic.Config.NoRxChecksumOffload).
func (q *RxQueue) ChecksumOffload() bool { return !q.noCsum }

// ChecksumOffload reports whether SendL4Checksum has the device fill in
// checksums (not turned off by nic.Config.NoTxChecksumOffload).
func (q *TxQueue) ChecksumOffload() bool { return !q.noCsum }
