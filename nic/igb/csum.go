package igb

// ChecksumVerified reports what the device found when it checked the
// received frame at buf (a completion's Buf, while the frame is lent):
// checked is true when it verified the frame's TCP or UDP checksum and,
// for IPv4, its header checksum; valid when those it verified were
// correct. A frame the device did not check (fragments, other protocols)
// is checked false. It is the receive side of a network stack's checksum
// offload (package netstack) in basic types, so that the stack needs no
// igb types.
func (q *RxQueue) ChecksumVerified(buf uintptr) (checked, valid bool, err error) {
	o, err := q.Offload(buf)
	if err != nil {
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
// an error matching nic.ErrNotSupported, as SendChecksum's do.
func (q *TxQueue) SendL4Checksum(frame []byte, ctx any) error {
	return q.SendChecksum(frame, ctx, TxL4)
}
