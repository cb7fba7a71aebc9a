package netstack

import (
	"encoding/binary"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// l4 finds the TCP or UDP segment of a whole (unfragmented) IPv4 or IPv6
// frame: the offset of its checksum field, and the pseudo-header sum.
// ok is false for anything else (fragments, other protocols, IPv6
// extension headers, truncated frames).
func l4(frame []byte) (ip, seg []byte, csumOff int, seed uint16, ok bool) {
	if len(frame) < header.EthernetMinimumSize {
		return nil, nil, 0, 0, false
	}
	et := binary.BigEndian.Uint16(frame[12:])
	ip = frame[header.EthernetMinimumSize:]
	var proto uint8
	switch et {
	case uint16(header.IPv4ProtocolNumber):
		h := header.IPv4(ip)
		if !h.IsValid(len(ip)) || h.More() || h.FragmentOffset() != 0 {
			return nil, nil, 0, 0, false
		}
		hl, tl := int(h.HeaderLength()), int(h.TotalLength())
		proto, seg = h.Protocol(), ip[hl:tl]
		seed = header.PseudoHeaderChecksum(h.TransportProtocol(), h.SourceAddress(), h.DestinationAddress(), uint16(len(seg)))
	case uint16(header.IPv6ProtocolNumber):
		h := header.IPv6(ip)
		if !h.IsValid(len(ip)) {
			return nil, nil, 0, 0, false
		}
		pl := int(h.PayloadLength())
		proto, seg = h.NextHeader(), ip[header.IPv6MinimumSize:header.IPv6MinimumSize+pl]
		seed = header.PseudoHeaderChecksum(h.TransportProtocol(), h.SourceAddress(), h.DestinationAddress(), uint16(len(seg)))
	default:
		return nil, nil, 0, 0, false
	}
	switch proto {
	case uint8(header.TCPProtocolNumber):
		if len(seg) < header.TCPMinimumSize {
			return nil, nil, 0, 0, false
		}
		csumOff = header.TCPChecksumOffset
	case uint8(header.UDPProtocolNumber):
		if len(seg) < header.UDPMinimumSize {
			return nil, nil, 0, 0, false
		}
		csumOff = 6
	default:
		return nil, nil, 0, 0, false
	}
	return ip, seg, csumOff, seed, true
}

// needsL4Checksum reports whether frame is a whole TCP or UDP frame, whose
// checksum the stack left to the device.
func needsL4Checksum(frame []byte) bool {
	_, _, _, _, ok := l4(frame)
	return ok
}

// setL4Checksum computes the TCP or UDP checksum of a whole frame in
// place (a frame the device could not checksum).
func setL4Checksum(frame []byte) {
	_, seg, off, seed, ok := l4(frame)
	if !ok {
		return
	}
	seg[off], seg[off+1] = 0, 0
	c := ^checksum.Checksum(seg, seed)
	if c == 0 && off == 6 {
		c = 0xffff // UDP sends a zero sum as all ones (RFC 768)
	}
	binary.BigEndian.PutUint16(seg[off:], c)
}

// checksumsValid reports whether the stack may skip verifying a received
// frame's checksums because they are right (CapabilityRXChecksumOffload
// skips the IPv4 header's and TCP's and UDP's): the IPv4 header checksum
// of an unfragmented packet, and the TCP or UDP checksum of a whole
// segment over IPv4 or IPv6 without extension headers, are checked here.
// ICMP and ICMPv6, which the stack checks regardless, pass with a good
// IP header, and ARP has no checksum. Anything else, a bad checksum
// included, is left to the stack, which verifies and counts it
// (fragments are reassembled first).
func checksumsValid(frame []byte) bool {
	if len(frame) < header.EthernetMinimumSize {
		return false
	}
	et := tcpip.NetworkProtocolNumber(binary.BigEndian.Uint16(frame[12:]))
	if et == header.ARPProtocolNumber {
		return true
	}
	ip, seg, off, seed, ok := l4(frame)
	if !ok {
		return icmpWhole(et, frame[header.EthernetMinimumSize:])
	}
	if et == header.IPv4ProtocolNumber && !header.IPv4(ip).IsChecksumValid() {
		return false
	}
	if off == 6 && seg[6] == 0 && seg[7] == 0 {
		// A UDP datagram sent without a checksum: IPv4 allows it (the
		// stack accepts it), IPv6 does not (the stack drops it).
		return et == header.IPv4ProtocolNumber
	}
	return checksum.Checksum(seg, seed) == 0xffff
}

// icmpWhole reports whether ip is an ICMP packet in an unfragmented IPv4
// packet with a good header checksum, or an ICMPv6 packet right after the
// IPv6 header: the stack checks their ICMP checksums regardless.
func icmpWhole(et tcpip.NetworkProtocolNumber, ip []byte) bool {
	switch et {
	case header.IPv4ProtocolNumber:
		h := header.IPv4(ip)
		return h.IsValid(len(ip)) && h.IsChecksumValid() && !h.More() && h.FragmentOffset() == 0 &&
			h.TransportProtocol() == header.ICMPv4ProtocolNumber
	case header.IPv6ProtocolNumber:
		h := header.IPv6(ip)
		return h.IsValid(len(ip)) && h.TransportProtocol() == header.ICMPv6ProtocolNumber
	}
	return false
}
