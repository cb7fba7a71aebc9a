package main

import (
	"net"
	"net/netip"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/stretchr/testify/require"
)

var (
	echoMAC  = net.HardwareAddr{2, 0, 0, 0, 0, 1}
	peerMAC  = net.HardwareAddr{2, 0, 0, 0, 0, 2}
	echoIP   = net.IPv4(10, 0, 0, 1).To4()
	peerIP   = net.IPv4(10, 0, 0, 2).To4()
	mcastMAC = net.HardwareAddr{0x01, 0x00, 0x5e, 0, 0, 1}
)

func echoUDPFrame(t testing.TB, srcMAC net.HardwareAddr, srcIP net.IP, sport, dport uint16) []byte {
	eth := &layers.Ethernet{SrcMAC: srcMAC, DstMAC: echoMAC, EthernetType: layers.EthernetTypeIPv4}
	ip := &layers.IPv4{Version: 4, IHL: 5, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: srcIP, DstIP: echoIP}
	udp := &layers.UDP{SrcPort: layers.UDPPort(sport), DstPort: layers.UDPPort(dport)}
	require.NoError(t, udp.SetNetworkLayerForChecksum(ip))
	buf := gopacket.NewSerializeBuffer()
	require.NoError(t, gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true},
		eth, ip, udp, gopacket.Payload("hello")))
	return buf.Bytes()
}

func pingFrame(t testing.TB, srcMAC net.HardwareAddr) []byte {
	eth := &layers.Ethernet{SrcMAC: srcMAC, DstMAC: echoMAC, EthernetType: layers.EthernetTypeIPv4}
	ip := &layers.IPv4{Version: 4, IHL: 5, TTL: 64, Protocol: layers.IPProtocolICMPv4, SrcIP: peerIP, DstIP: echoIP}
	icmp := &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeEchoRequest, 0), Id: 1, Seq: 1}
	buf := gopacket.NewSerializeBuffer()
	require.NoError(t, gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true},
		eth, ip, icmp, gopacket.Payload("ping")))
	return buf.Bytes()
}

func arpFrame(t testing.TB, srcMAC net.HardwareAddr) []byte {
	return arpRequest(t, srcMAC, layers.EthernetBroadcast)
}

// arpRequest asks who has echoIP, sent to dstMAC: broadcast to resolve, or
// the known MAC to confirm (the unicast probe of Linux's PROBE state).
func arpRequest(t testing.TB, srcMAC, dstMAC net.HardwareAddr) []byte {
	eth := &layers.Ethernet{SrcMAC: srcMAC, DstMAC: dstMAC, EthernetType: layers.EthernetTypeARP}
	arp := &layers.ARP{AddrType: layers.LinkTypeEthernet, Protocol: layers.EthernetTypeIPv4, HwAddressSize: 6, ProtAddressSize: 4,
		Operation: layers.ARPRequest, SourceHwAddress: srcMAC, SourceProtAddress: peerIP,
		DstHwAddress: make(net.HardwareAddr, 6), DstProtAddress: echoIP}
	buf := gopacket.NewSerializeBuffer()
	require.NoError(t, gopacket.SerializeLayers(buf, gopacket.SerializeOptions{}, eth, arp))
	return buf.Bytes()
}

// TestEchoSafety checks echo's rules against reflection: it answers a
// unicast request on an asked-for port, and never a broadcast or
// multicast source, nor a UDP source port in the reflection set, nor a
// port it was not asked to echo.
func TestEchoSafety(t *testing.T) {
	ports, err := parsePorts("7,9000")
	require.NoError(t, err)
	cases := []struct {
		name    string
		frame   func(t *testing.T) []byte
		answer  bool
		refused bool
	}{
		{"udp to 7 from an ephemeral port", func(t *testing.T) []byte { return echoUDPFrame(t, peerMAC, peerIP, 40000, 7) }, true, false},
		{"udp to an asked port", func(t *testing.T) []byte { return echoUDPFrame(t, peerMAC, peerIP, 40000, 9000) }, true, false},
		{"udp to a port not asked for", func(t *testing.T) []byte { return echoUDPFrame(t, peerMAC, peerIP, 40000, 9) }, false, false},
		{"udp 7 to 7", func(t *testing.T) []byte { return echoUDPFrame(t, peerMAC, peerIP, 7, 7) }, false, true},
		{"udp from chargen", func(t *testing.T) []byte { return echoUDPFrame(t, peerMAC, peerIP, 19, 7) }, false, true},
		{"udp from ntp", func(t *testing.T) []byte { return echoUDPFrame(t, peerMAC, peerIP, 123, 7) }, false, true},
		{"udp from memcached", func(t *testing.T) []byte { return echoUDPFrame(t, peerMAC, peerIP, 11211, 7) }, false, true},
		{"udp from port 0", func(t *testing.T) []byte { return echoUDPFrame(t, peerMAC, peerIP, 0, 7) }, false, true},
		{"udp from a broadcast MAC", func(t *testing.T) []byte { return echoUDPFrame(t, layers.EthernetBroadcast, peerIP, 40000, 7) }, false, true},
		{"udp from a multicast MAC", func(t *testing.T) []byte { return echoUDPFrame(t, mcastMAC, peerIP, 40000, 7) }, false, true},
		{"udp from a broadcast IP", func(t *testing.T) []byte { return echoUDPFrame(t, peerMAC, net.IPv4bcast.To4(), 40000, 7) }, false, true},
		{"udp from a loopback IP", func(t *testing.T) []byte { return echoUDPFrame(t, peerMAC, net.IPv4(127, 0, 0, 1).To4(), 40000, 7) }, false, true},
		{"udp from 0.1.2.3", func(t *testing.T) []byte { return echoUDPFrame(t, peerMAC, net.IPv4(0, 1, 2, 3).To4(), 40000, 7) }, false, true},
		{"udp from a reserved IP", func(t *testing.T) []byte { return echoUDPFrame(t, peerMAC, net.IPv4(240, 0, 0, 9).To4(), 40000, 7) }, false, true},
		{"ping", func(t *testing.T) []byte { return pingFrame(t, peerMAC) }, true, false},
		{"ping from a broadcast MAC", func(t *testing.T) []byte { return pingFrame(t, layers.EthernetBroadcast) }, false, true},
		{"arp", func(t *testing.T) []byte { return arpFrame(t, peerMAC) }, true, false},
		{"arp unicast probe", func(t *testing.T) []byte { return arpRequest(t, peerMAC, echoMAC) }, true, false},
		{"arp from a multicast MAC", func(t *testing.T) []byte { return arpFrame(t, mcastMAC) }, false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newAnswerer(echoMAC, netip.MustParseAddr("10.0.0.1"), ports)
			reply := e.answer(tc.frame(t))
			require.Equal(t, tc.answer, reply != nil, "answered")
			require.Equal(t, tc.refused, e.refused.Load() == 1, "refused counter %d", e.refused.Load())
			if reply != nil {
				p := gopacket.NewPacket(reply, layers.LayerTypeEthernet, gopacket.Default)
				eth := p.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
				require.Equal(t, peerMAC, eth.DstMAC, "the reply goes to the requester only")
				if arp, ok := p.Layer(layers.LayerTypeARP).(*layers.ARP); ok {
					require.Equal(t, uint16(layers.ARPReply), arp.Operation)
					require.Equal(t, []byte(echoMAC), arp.SourceHwAddress)
					require.Equal(t, []byte(echoIP), arp.SourceProtAddress)
					require.Equal(t, []byte(peerIP), arp.DstProtAddress)
				}
				if udp, ok := p.Layer(layers.LayerTypeUDP).(*layers.UDP); ok {
					require.Equal(t, layers.UDPPort(40000), udp.DstPort)
					require.Equal(t, []byte("hello"), udp.Payload)
				}
			}
		})
	}
}

func TestEchoPortsFlag(t *testing.T) {
	for _, bad := range []string{"", "0", "7,x", "65536", "-1"} {
		_, err := parsePorts(bad)
		require.ErrorIs(t, err, errUsage, "%q", bad)
	}
	p, err := parsePorts(" 7, 9000 ")
	require.NoError(t, err)
	require.Equal(t, map[uint16]bool{7: true, 9000: true}, p)
}

// TestEchoIPNotHost: echo refuses, as a usage error before the device is
// looked up, an -ip it may not answer from (RFC 1122 3.2.1.3), and takes
// ordinary unicast addresses, link-local ones included, as far as opening
// the (missing) device.
func TestEchoIPNotHost(t *testing.T) {
	for ip, want := range map[string]string{
		"0.0.0.0":         "-ip 0.0.0.0 is an unspecified address",
		"0.1.2.3":         "-ip 0.1.2.3 is an unspecified address",
		"127.0.0.1":       "-ip 127.0.0.1 is a loopback address",
		"127.255.0.9":     "-ip 127.255.0.9 is a loopback address",
		"224.0.0.1":       "-ip 224.0.0.1 is a multicast address",
		"239.255.255.250": "-ip 239.255.255.250 is a multicast address",
		"255.255.255.255": "-ip 255.255.255.255 is the limited broadcast address",
		"240.0.0.1":       "-ip 240.0.0.1 is a reserved address",
		"::1":             `-ip needs an IPv4 address, got "::1"`,
		"::ffff:10.0.0.1": `-ip needs an IPv4 address, got "::ffff:10.0.0.1"`,
		"ff02::1":         `-ip needs an IPv4 address, got "ff02::1"`,
	} {
		args := []string{"echo", "-ip", ip, "0000:7f:1f.7"}
		code, out, errw := runCLI(args...)
		require.Equal(t, exitUsage, code, "%v: %s", args, errw)
		require.Contains(t, errw, want, "%v", args)
		require.NotContains(t, errw, "not found", "%v: refused before the device is looked up", args)
		require.Empty(t, out)
	}
	for _, ip := range []string{"10.0.0.1", "169.254.7.1", "192.0.2.255", "223.255.255.254", "1.0.0.0"} {
		args := []string{"echo", "-ip", ip, "0000:7f:1f.7"}
		code, _, errw := runCLI(args...)
		require.Equal(t, exitFailure, code, "%v: %s", args, errw)
		require.Contains(t, errw, "not found", "%v", args)
	}
}
