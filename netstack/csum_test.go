package netstack

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// frame4 is an Ethernet frame of an IPv4 packet of protocol proto whose
// payload is l4 (its checksum field at csumOff set right, unless -1).
func frame4(proto tcpip.TransportProtocolNumber, l4 []byte, csumOff int, fragOff uint16) []byte {
	b := make([]byte, header.EthernetMinimumSize+header.IPv4MinimumSize+len(l4))
	binary.BigEndian.PutUint16(b[12:], uint16(header.IPv4ProtocolNumber))
	ip := header.IPv4(b[header.EthernetMinimumSize:])
	src, dst := tcpip.AddrFrom4([4]byte{10, 0, 0, 1}), tcpip.AddrFrom4([4]byte{10, 0, 0, 2})
	ip.Encode(&header.IPv4Fields{TotalLength: uint16(len(ip)), TTL: 64, Protocol: uint8(proto),
		SrcAddr: src, DstAddr: dst, FragmentOffset: fragOff})
	ip.SetChecksum(^ip.CalculateChecksum())
	fillL4(ip.Payload(), l4, proto, src, dst, csumOff)
	return b
}

// frame6 is frame4 over IPv6 (next header proto).
func frame6(proto tcpip.TransportProtocolNumber, l4 []byte, csumOff int) []byte {
	b := make([]byte, header.EthernetMinimumSize+header.IPv6MinimumSize+len(l4))
	binary.BigEndian.PutUint16(b[12:], uint16(header.IPv6ProtocolNumber))
	ip := header.IPv6(b[header.EthernetMinimumSize:])
	var s, d [16]byte
	s[0], d[0], s[15], d[15] = 0xfd, 0xfd, 1, 2
	src, dst := tcpip.AddrFrom16(s), tcpip.AddrFrom16(d)
	ip.Encode(&header.IPv6Fields{PayloadLength: uint16(len(l4)), TransportProtocol: proto, HopLimit: 64, SrcAddr: src, DstAddr: dst})
	fillL4(ip.Payload(), l4, proto, src, dst, csumOff)
	return b
}

// fillL4 copies l4 into seg and sets its checksum field at csumOff right
// (unless -1).
func fillL4(seg, l4 []byte, proto tcpip.TransportProtocolNumber, src, dst tcpip.Address, csumOff int) {
	copy(seg, l4)
	if csumOff >= 0 {
		seed := header.PseudoHeaderChecksum(proto, src, dst, uint16(len(seg)))
		seg[csumOff], seg[csumOff+1] = 0, 0
		binary.BigEndian.PutUint16(seg[csumOff:], ^checksum.Checksum(seg, seed))
	}
}

// TestChecksumsValid: the endpoint's own verdict on received frames.
func TestChecksumsValid(t *testing.T) {
	tcp := make([]byte, 20+100)
	tcp[12] = 5 << 4 // data offset
	for i := 20; i < len(tcp); i++ {
		tcp[i] = byte(i)
	}
	udp := make([]byte, 8+37)
	binary.BigEndian.PutUint16(udp[4:], uint16(len(udp)))
	flip := func(b []byte, i int) []byte { b[len(b)-i] ^= 0x40; return b }
	badIPHdr := frame4(header.TCPProtocolNumber, tcp, 16, 0)
	badIPHdr[header.EthernetMinimumSize+8]-- // TTL, under the header checksum
	arp := make([]byte, header.EthernetMinimumSize+header.ARPSize)
	binary.BigEndian.PutUint16(arp[12:], uint16(header.ARPProtocolNumber))
	for _, c := range []struct {
		name  string
		frame []byte
		want  bool
	}{
		{"TCP over IPv4", frame4(header.TCPProtocolNumber, tcp, 16, 0), true},
		{"TCP over IPv4, payload corrupted", flip(frame4(header.TCPProtocolNumber, tcp, 16, 0), 3), false},
		{"TCP over IPv4, IP header corrupted", badIPHdr, false},
		{"TCP over IPv6", frame6(header.TCPProtocolNumber, tcp, 16), true},
		{"TCP over IPv6, payload corrupted", flip(frame6(header.TCPProtocolNumber, tcp, 16), 1), false},
		{"UDP over IPv4", frame4(header.UDPProtocolNumber, udp, 6, 0), true},
		{"UDP over IPv4 without a checksum", frame4(header.UDPProtocolNumber, udp, -1, 0), true},
		{"UDP over IPv6", frame6(header.UDPProtocolNumber, udp, 6), true},
		{"UDP over IPv6 without a checksum", frame6(header.UDPProtocolNumber, udp, -1), false},
		{"UDP over IPv6, corrupted", flip(frame6(header.UDPProtocolNumber, udp, 6), 2), false},
		{"an IPv4 fragment", frame4(header.UDPProtocolNumber, udp, 6, 8), false},
		{"ICMPv4 (the stack checks it)", frame4(header.ICMPv4ProtocolNumber, make([]byte, 8), -1, 0), true},
		{"ICMPv6 (the stack checks it)", frame6(header.ICMPv6ProtocolNumber, make([]byte, 8), -1), true},
		{"IPv6 with an extension header", frame6(0, make([]byte, 8), -1), false},
		{"ARP", arp, true},
		{"truncated", frame4(header.TCPProtocolNumber, tcp, 16, 0)[:40], false},
		{"runt", make([]byte, 10), false},
		{"another EtherType", make([]byte, 60), false},
	} {
		require.Equal(t, c.want, checksumsValid(c.frame), c.name)
	}
}
