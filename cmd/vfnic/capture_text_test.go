package main

import (
	"bufio"
	"bytes"
	"net"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/stretchr/testify/require"
)

func textFrame(t *testing.T, ls ...gopacket.SerializableLayer) []byte {
	buf := gopacket.NewSerializeBuffer()
	require.NoError(t, gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...))
	return buf.Bytes()
}

// textFrames are frames of each kind frameLine describes, with the line
// for each: tcpdump 4.99.3 -n's (after the time), but where a comment
// says how tcpdump differs (it decodes more).
func textFrames(t *testing.T) []struct {
	data []byte
	want string
} {
	a, b := net.HardwareAddr{2, 0, 0, 0, 0, 0x0a}, net.HardwareAddr{2, 0, 0, 0, 0, 0x0b}
	e := func(et layers.EthernetType) *layers.Ethernet {
		return &layers.Ethernet{SrcMAC: a, DstMAC: b, EthernetType: et}
	}
	ip4 := func(p layers.IPProtocol) *layers.IPv4 {
		return &layers.IPv4{Version: 4, TTL: 64, Protocol: p, SrcIP: net.IP{10, 0, 0, 1}, DstIP: net.IP{10, 0, 0, 2}}
	}
	ip6 := func(p layers.IPProtocol) *layers.IPv6 {
		return &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: p, SrcIP: net.ParseIP("2001:db8::1"), DstIP: net.ParseIP("2001:db8::2")}
	}
	tcp := &layers.TCP{SrcPort: 40000, DstPort: 8080, Seq: 7, Ack: 9, SYN: true, ACK: true, Window: 512}
	_ = tcp.SetNetworkLayerForChecksum(ip4(layers.IPProtocolTCP))
	udp := &layers.UDP{SrcPort: 5000, DstPort: 6000}
	_ = udp.SetNetworkLayerForChecksum(ip6(layers.IPProtocolUDP))
	icmp6 := &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(layers.ICMPv6TypeEchoRequest, 0)}
	_ = icmp6.SetNetworkLayerForChecksum(ip6(layers.IPProtocolICMPv6))
	vl := &layers.Ethernet{SrcMAC: a, DstMAC: b, EthernetType: layers.EthernetTypeDot1Q}
	vudp := &layers.UDP{SrcPort: 5001, DstPort: 6001}
	vip := ip4(layers.IPProtocolUDP)
	_ = vudp.SetNetworkLayerForChecksum(vip)
	return []struct {
		data []byte
		want string
	}{
		{textFrame(t, e(layers.EthernetTypeIPv4), ip4(layers.IPProtocolTCP), tcp, gopacket.Payload("hello")),
			"IP 10.0.0.1.40000 > 10.0.0.2.8080: Flags [S.], seq 7:12, ack 9, win 512, length 5"}, // tcpdump adds ": HTTP"
		{textFrame(t, e(layers.EthernetTypeIPv6), ip6(layers.IPProtocolUDP), udp, gopacket.Payload("0123456789")),
			"IP6 2001:db8::1.5000 > 2001:db8::2.6000: UDP, length 10"},
		{textFrame(t, e(layers.EthernetTypeIPv4), ip4(layers.IPProtocolICMPv4),
			&layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeEchoRequest, 0), Id: 7, Seq: 1}, gopacket.Payload("abcd")),
			"IP 10.0.0.1 > 10.0.0.2: ICMP echo request, id 7, seq 1, length 12"},
		{textFrame(t, e(layers.EthernetTypeIPv6), ip6(layers.IPProtocolICMPv6), icmp6, gopacket.Payload("abcd")),
			"IP6 2001:db8::1 > 2001:db8::2: ICMP6, echo request, length 8"}, // tcpdump adds id and seq
		{textFrame(t, &layers.Ethernet{SrcMAC: a, DstMAC: net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, EthernetType: layers.EthernetTypeARP},
			&layers.ARP{AddrType: layers.LinkTypeEthernet, Protocol: layers.EthernetTypeIPv4, HwAddressSize: 6, ProtAddressSize: 4,
				Operation: layers.ARPRequest, SourceHwAddress: a, SourceProtAddress: net.IP{10, 0, 0, 1},
				DstHwAddress: make([]byte, 6), DstProtAddress: net.IP{10, 0, 0, 2}}),
			"ARP, Request who-has 10.0.0.2 tell 10.0.0.1, length 46"}, // padded to 60 bytes
		{textFrame(t, vl, &layers.Dot1Q{VLANIdentifier: 100, Priority: 3, Type: layers.EthernetTypeIPv4}, vip, vudp, gopacket.Payload("xy")),
			"vlan 100, p 3, IP 10.0.0.1.5001 > 10.0.0.2.6001: UDP, length 2"}, // tcpdump names the tag with -e only
		{textFrame(t, e(0x88cc), gopacket.Payload(make([]byte, 46))),
			"02:00:00:00:00:0a > 02:00:00:00:00:0b, ethertype 0x88cc, length 60"}, // tcpdump decodes LLDP
	}
}

func TestFrameLine(t *testing.T) {
	for _, tc := range textFrames(t) {
		require.Equal(t, tc.want, frameLine(tc.data, len(tc.data)))
	}
	require.Equal(t, "[|ether], length 5", frameLine([]byte{1, 2, 3, 4, 5}, 5))
	// Cut at the snap length: what is there is described, the length is the frame's.
	tc := textFrames(t)[0]
	require.NotPanics(t, func() { frameLine(tc.data[:40], len(tc.data)) })

	var out bytes.Buffer
	w := &textWriter{w: bufio.NewWriter(&out)}
	ts := time.Date(2026, 1, 2, 3, 4, 5, 6789000, time.Local)
	require.NoError(t, w.write(ts, tc.data, len(tc.data)))
	require.NoError(t, w.w.Flush())
	require.Equal(t, "03:04:05.006789 "+tc.want+"\n", out.String())

}
