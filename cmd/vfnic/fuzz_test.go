package main

import (
	"errors"
	"flag"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/stretchr/testify/require"
)

// FuzzParseArgs runs parse, which takes flags before, after and among the
// positional arguments, on arbitrary command lines (arguments separated by
// NUL bytes). A refusal is a usage error (or help), never a panic; an
// accepted line leaves the positional arguments in fs.Args() in their
// order, each one an argument of the line, and no negative duration.
func FuzzParseArgs(f *testing.F) {
	for _, s := range []string{
		"a\x00-n\x003\x00b\x00-b\x00--\x00-n\x00c",
		"0000:7f:1f.0\x00-d\x00-1s", "-d=2h\x00x\x00-s\x00str", "-h", "--\x00--", "-n", "-b=maybe", "-=x", "---n\x001",
		"x\x00-d\x00", "-s\x00-\x00-n=0x10\x00y",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		args := strings.Split(line, "\x00")
		fs := newFlags("fuzz", "ARGS")
		n := fs.Int("n", 0, "a number")
		fs.Bool("b", false, "a switch")
		fs.String("s", "", "a string")
		d := fs.Duration("d", 0, "a duration")
		err := parse(fs, args)
		if err != nil {
			require.True(t, errors.Is(err, errUsage) || errors.Is(err, flag.ErrHelp), "%q: %v", args, err)
			return
		}
		require.GreaterOrEqual(t, *d, time.Duration(0), "%q", args)
		_ = *n
		// The positional arguments are arguments of the line, in order.
		rest, i := fs.Args(), 0
		for _, p := range rest {
			for i < len(args) && args[i] != p {
				i++
			}
			require.Less(t, i, len(args), "%q: positional %q out of order or invented (%q)", args, p, rest)
			i++
		}
	})
}

// FuzzParsePorts: a -udp-ports list echo accepts holds ports 1-65535,
// and the set written back as a list parses to the same set.
func FuzzParsePorts(f *testing.F) {
	for _, s := range []string{"7", "7,9000", " 7 , 9 ", "0", "65536", "-1", "", ",", "7,7", "+7", "0x10", "1e3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ports, err := parsePorts(s)
		if err != nil {
			require.ErrorIs(t, err, errUsage)
			require.Nil(t, ports)
			return
		}
		require.NotEmpty(t, ports, "%q", s)
		var list []string
		for p := range ports {
			require.NotZero(t, p, "%q", s)
			list = append(list, strconv.Itoa(int(p)))
		}
		slices.Sort(list)
		back, err := parsePorts(strings.Join(list, ","))
		require.NoError(t, err)
		require.Equal(t, ports, back, "%q", s)
	})
}

// FuzzEchoIP: an -ip echo accepts is an IPv4 unicast address a host may
// answer from (not unspecified, loopback, multicast, broadcast or
// reserved), and its text parses back to it.
func FuzzEchoIP(f *testing.F) {
	for _, s := range []string{"10.0.0.1", "0.0.0.0", "127.0.0.1", "224.0.0.1", "255.255.255.255", "240.0.0.1",
		"169.254.1.1", "::1", "::ffff:10.0.0.1", "10.0.0.1%eth0", "010.0.0.1", " 10.0.0.1", "1.2.3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ip, err := parseEchoIP(s)
		if err != nil {
			require.ErrorIs(t, err, errUsage)
			require.False(t, ip.IsValid())
			return
		}
		require.True(t, ip.Is4(), "%q", s)
		require.False(t, ip.IsUnspecified() || ip.IsLoopback() || ip.IsMulticast(), "%q", s)
		require.NotEqual(t, netip.AddrFrom4([4]byte{255, 255, 255, 255}), ip, "%q", s)
		require.Less(t, ip.As4()[0], byte(240), "%q", s)
		require.NotZero(t, ip.As4()[0], "%q", s)
		back, err := parseEchoIP(ip.String())
		require.NoError(t, err)
		require.Equal(t, ip, back)
	})
}

// FuzzEchoAnswer hands arbitrary frames, as the wire delivers them, to
// echo's responder. Nothing panics, and a reply, when there is one, is an
// Ethernet frame from echo's MAC to the requester's unicast MAC; over IP
// it comes from echo's address and goes to a source address a host may
// answer (RFC 1122 3.2.1.3: never a broadcast, multicast, unspecified,
// loopback or reserved one), and over UDP never to a port of the
// reflection set.
func FuzzEchoAnswer(f *testing.F) {
	f.Add(echoUDPFrame(f, peerMAC, peerIP, 40000, 7))
	f.Add(echoUDPFrame(f, mcastMAC, peerIP, 40000, 7))
	f.Add(echoUDPFrame(f, peerMAC, peerIP, 19, 7))
	f.Add(pingFrame(f, peerMAC))
	f.Add(arpFrame(f, peerMAC))
	f.Add([]byte{})
	f.Add(make([]byte, 14))
	ip := netip.AddrFrom4([4]byte(echoIP))
	f.Fuzz(func(t *testing.T, frame []byte) {
		e := newAnswerer(echoMAC, ip, map[uint16]bool{7: true, 9000: true})
		reply := e.answer(frame)
		if reply == nil {
			return
		}
		p := gopacket.NewPacket(reply, layers.LayerTypeEthernet, gopacket.Default)
		eth, ok := p.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
		require.True(t, ok, "reply %x to %x", reply, frame)
		require.Equal(t, echoMAC, eth.SrcMAC)
		require.Len(t, eth.DstMAC, 6)
		require.Zero(t, eth.DstMAC[0]&1, "reply to a group MAC %v (request %x)", eth.DstMAC, frame)
		if ip4, ok := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4); ok {
			require.True(t, ip4.SrcIP.Equal(echoIP), "reply from %v", ip4.SrcIP)
			dst := ip4.DstIP.To4()
			require.NotNil(t, dst)
			require.False(t, dst.IsMulticast() || dst.Equal(net.IPv4bcast) || dst.IsUnspecified() || dst.IsLoopback() ||
				dst[0] == 0 || dst[0] >= 240, "reply to %v (request %x)", dst, frame)
		}
		if udp, ok := p.Layer(layers.LayerTypeUDP).(*layers.UDP); ok {
			require.False(t, reflectionPorts[uint16(udp.DstPort)], "reply to reflection port %d", udp.DstPort)
			require.True(t, udp.SrcPort == 7 || udp.SrcPort == 9000, "reply from port %d", udp.SrcPort)
		}
	})
}
