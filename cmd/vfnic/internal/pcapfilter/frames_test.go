package pcapfilter

import (
	"net"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/stretchr/testify/require"
)

// testFrame is a crafted frame with a name the tests refer to.
type testFrame struct {
	name string
	data []byte
}

var (
	macA  = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x0a}
	macB  = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x0b}
	bcast = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	mcast = net.HardwareAddr{0x01, 0x80, 0xc2, 0, 0, 0x0e}
)

func ip4(s string) net.IP { return net.ParseIP(s).To4() }
func ip6(s string) net.IP { return net.ParseIP(s) }

func serialize(t testing.TB, ls ...gopacket.SerializableLayer) []byte {
	t.Helper()
	buf := gopacket.NewSerializeBuffer()
	require.NoError(t, gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...))
	return append([]byte(nil), buf.Bytes()...)
}

// eth returns the Ethernet header, and 802.1Q/802.1ad tags for vlans
// (outermost first), of a frame carrying type et.
func eth(src, dst net.HardwareAddr, et layers.EthernetType, vlans ...uint16) []gopacket.SerializableLayer {
	e := &layers.Ethernet{SrcMAC: src, DstMAC: dst, EthernetType: et}
	if len(vlans) == 0 {
		return []gopacket.SerializableLayer{e}
	}
	e.EthernetType = layers.EthernetTypeDot1Q
	if len(vlans) > 1 {
		e.EthernetType = layers.EthernetTypeQinQ
	}
	ls := []gopacket.SerializableLayer{e}
	for i, id := range vlans {
		next := et
		if i < len(vlans)-1 {
			next = layers.EthernetTypeDot1Q
		}
		ls = append(ls, &layers.Dot1Q{VLANIdentifier: id, Priority: 3, Type: next})
	}
	return ls
}

func udp4(t testing.TB, src, dst string, sport, dport uint16, payload int, vlans ...uint16) []byte {
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: ip4(src), DstIP: ip4(dst)}
	u := &layers.UDP{SrcPort: layers.UDPPort(sport), DstPort: layers.UDPPort(dport)}
	_ = u.SetNetworkLayerForChecksum(ip)
	return serialize(t, append(eth(macA, macB, layers.EthernetTypeIPv4, vlans...), ip, u, gopacket.Payload(make([]byte, payload)))...)
}

func tcp4(t testing.TB, src, dst string, sport, dport uint16, opts bool, vlans ...uint16) []byte {
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolTCP, SrcIP: ip4(src), DstIP: ip4(dst)}
	if opts { // IHL 6: the ports move by 4 bytes
		ip.Options = []layers.IPv4Option{{OptionType: 1}, {OptionType: 1}, {OptionType: 1}, {OptionType: 0}}
	}
	tc := &layers.TCP{SrcPort: layers.TCPPort(sport), DstPort: layers.TCPPort(dport), SYN: true, Window: 1024}
	_ = tc.SetNetworkLayerForChecksum(ip)
	return serialize(t, append(eth(macA, macB, layers.EthernetTypeIPv4, vlans...), ip, tc)...)
}

func l4v6(t testing.TB, proto layers.IPProtocol, src, dst string, sport, dport uint16, vlans ...uint16) []byte {
	ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: proto, SrcIP: ip6(src), DstIP: ip6(dst)}
	var l4 gopacket.SerializableLayer
	switch proto {
	case layers.IPProtocolTCP:
		tc := &layers.TCP{SrcPort: layers.TCPPort(sport), DstPort: layers.TCPPort(dport), ACK: true, Window: 1024}
		_ = tc.SetNetworkLayerForChecksum(ip)
		l4 = tc
	case layers.IPProtocolUDP:
		u := &layers.UDP{SrcPort: layers.UDPPort(sport), DstPort: layers.UDPPort(dport)}
		_ = u.SetNetworkLayerForChecksum(ip)
		l4 = u
	case layers.IPProtocolICMPv6:
		ic := &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(layers.ICMPv6TypeEchoRequest, 0)}
		_ = ic.SetNetworkLayerForChecksum(ip)
		l4 = ic
	}
	return serialize(t, append(eth(macB, macA, layers.EthernetTypeIPv6, vlans...), ip, l4, gopacket.Payload([]byte{byte(sport), byte(dport), 1, 2, 3, 4, 5, 6}))...)
}

// testFrames are the frames every expression is tried on: each protocol
// the primitives name, tagged and untagged, with the corner cases libpcap
// handles (IP options, later fragments, IPv6 fragment headers, QinQ, short
// frames). All differ, so that a frame is known by its bytes.
func testFrames(t testing.TB) []testFrame {
	icmp := serialize(t, append(eth(macB, macA, layers.EthernetTypeIPv4),
		&layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolICMPv4, SrcIP: ip4("10.0.0.3"), DstIP: ip4("10.0.0.1")},
		&layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeEchoRequest, 0), Id: 7, Seq: 1})...)
	arp := serialize(t, append(eth(macA, bcast, layers.EthernetTypeARP),
		&layers.ARP{AddrType: layers.LinkTypeEthernet, Protocol: layers.EthernetTypeIPv4, HwAddressSize: 6, ProtAddressSize: 4,
			Operation: layers.ARPRequest, SourceHwAddress: macA, SourceProtAddress: ip4("10.0.0.1"),
			DstHwAddress: make([]byte, 6), DstProtAddress: ip4("10.0.0.2")})...)
	rarp := append([]byte(nil), arp...)
	rarp[12], rarp[13] = 0x80, 0x35
	rarp[21] = 3 // RARP request
	copy(rarp[28:32], ip4("172.16.5.5"))
	// A later fragment of a UDP datagram: where the ports would be, 53 and
	// 53, which 'port 53' must not take for ports.
	frag := serialize(t, append(eth(macA, macB, layers.EthernetTypeIPv4),
		&layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: ip4("10.0.0.1"), DstIP: ip4("10.0.0.2"), FragOffset: 185},
		gopacket.Payload([]byte{0, 53, 0, 53, 0, 8, 0, 0}))...)
	// IPv6 with a fragment header before ICMPv6.
	f6 := serialize(t, append(eth(macB, macA, layers.EthernetTypeIPv6),
		&layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolIPv6Fragment, SrcIP: ip6("2001:db8::2"), DstIP: ip6("2001:db8::1")},
		// Next header ICMPv6, offset 0 with more fragments, id 9; then an echo request.
		gopacket.Payload([]byte{58, 0, 0, 1, 0, 0, 0, 9, 128, 0, 0, 0, 0, 1, 0, 1}))...)
	sctp := serialize(t, append(eth(macA, macB, layers.EthernetTypeIPv4),
		&layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolSCTP, SrcIP: ip4("10.0.0.1"), DstIP: ip4("10.0.0.9")},
		&layers.SCTP{SrcPort: 3868, DstPort: 3868})...)
	lldp := serialize(t, eth(macA, mcast, layers.EthernetType(0x88cc))[0], gopacket.Payload(make([]byte, 46)))
	return []testFrame{
		{"tcp4", tcp4(t, "10.0.0.1", "10.0.0.2", 40000, 80, false)},
		{"tcp4opts", tcp4(t, "10.0.0.2", "10.1.2.3", 8080, 40001, true)},
		{"udp4", udp4(t, "10.0.0.1", "192.168.1.9", 5353, 53, 10)},
		{"udp4big", udp4(t, "192.168.1.9", "10.0.0.1", 9, 9, 1400)},
		{"icmp4", icmp},
		{"arp", arp},
		{"rarp", rarp},
		{"frag4", frag},
		{"sctp4", sctp},
		{"tcp6", l4v6(t, layers.IPProtocolTCP, "2001:db8::1", "2001:db8::2", 40002, 443)},
		{"udp6", l4v6(t, layers.IPProtocolUDP, "fe80::1", "ff02::1:2", 546, 547)},
		{"icmp6", l4v6(t, layers.IPProtocolICMPv6, "2001:db8::2", "2001:db8::1", 0, 0)},
		{"icmp6frag", f6},
		{"vlan100udp4", udp4(t, "10.0.0.1", "10.0.0.2", 5000, 53, 20, 100)},
		{"vlan200tcp6", l4v6(t, layers.IPProtocolTCP, "2001:db8:1::1", "2001:db8::2", 80, 40003, 200)},
		{"qinq10-20udp4", udp4(t, "10.9.9.9", "10.0.0.2", 6000, 7000, 30, 10, 20)},
		{"lldp", lldp},
		{"short", []byte{2, 0, 0, 0, 0, 0x0b, 2, 0, 0, 0, 0, 0x0a, 0x08, 0x00, 0x45, 0}},
	}
}
