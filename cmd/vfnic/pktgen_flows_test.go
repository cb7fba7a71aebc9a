package main

import (
	"encoding/binary"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
	"github.com/stretchr/testify/require"
)

// sum16 is the one's-complement sum of b's 16-bit words (a trailing byte
// padded with zero), folded.
func sum16(b []byte, start uint32) uint32 {
	s := start
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s > 0xffff {
		s = (s & 0xffff) + s>>16
	}
	return s
}

// udp6Valid checks an IPv6 UDP datagram's checksum over its pseudo-header.
func udp6Valid(ip *layers.IPv6, udp []byte) bool {
	var ph []byte
	ph = append(ph, ip.SrcIP...)
	ph = append(ph, ip.DstIP...)
	ph = binary.BigEndian.AppendUint32(ph, uint32(len(udp)))
	ph = append(ph, 0, 0, 0, 17)
	return sum16(udp, sum16(ph, 0)) == 0xffff
}

func mustSpec(t *testing.T, v6 bool, vlan int) flowSpec {
	t.Helper()
	sp := flowSpec{vlan: vlan}
	var err error
	sp.dstMAC, err = parseMACRange("dst-mac", "02:00:00:00:00:fe-02:00:00:00:01:01")
	require.NoError(t, err)
	sp.srcMAC, err = parseMACRange("src-mac", "02:00:00:00:00:01")
	require.NoError(t, err)
	src, dst := "10.0.0.254-10.0.1.1", "192.168.1.9"
	if v6 {
		src, dst = "2001:db8::fffe-2001:db8::1:1", "2001:db8:1::9"
	}
	sp.srcIP, err = parseIPRange("src-ip", src)
	require.NoError(t, err)
	sp.dstIP, err = parseIPRange("dst-ip", dst)
	require.NoError(t, err)
	sp.srcPort, err = parseNumRange("src-port", "9000-9002", 1, 65535)
	require.NoError(t, err)
	sp.dstPort, err = parseNumRange("port", "9", 1, 65535)
	require.NoError(t, err)
	return sp
}

// TestFlowGen: every frame of the ranges decodes as what it should be,
// with correct IPv4 header and IPv6 UDP checksums after the in-place
// rewrites, the right lengths, and its sequence number.
func TestFlowGen(t *testing.T) {
	for _, tc := range []struct {
		v6    bool
		vlan  int
		sizes string
	}{{false, -1, "60-70"}, {true, -1, "70-90"}, {false, 7, "mix"}, {true, 300, "mix"}} {
		sp := mustSpec(t, tc.v6, tc.vlan)
		if tc.sizes == "mix" {
			var err error
			sp.sizes, err = parseSizeMix("1518:2,90:1,1000:3")
			require.NoError(t, err)
		} else {
			r, err := parseNumRange("size", tc.sizes, 60, 65535)
			require.NoError(t, err)
			sp.sizes = sizeSeq{r: r}
		}
		g, err := newFlowGen(sp)
		require.NoError(t, err)
		for i := range uint64(40) {
			b := append([]byte(nil), g.next(i)...)
			require.Len(t, b, sp.sizes.at(i), "frame %d", i)
			p := gopacket.NewPacket(b, layers.LayerTypeEthernet, gopacket.Default)
			require.Nil(t, p.ErrorLayer(), "frame %d: %v", i, p.ErrorLayer())
			eth := p.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
			require.Equal(t, macOf(sp.dstMAC.at(i)), eth.DstMAC, "frame %d", i)
			require.Equal(t, net.HardwareAddr{2, 0, 0, 0, 0, 1}, eth.SrcMAC)
			if tc.vlan >= 0 {
				tag := p.Layer(layers.LayerTypeDot1Q).(*layers.Dot1Q)
				require.EqualValues(t, tc.vlan, tag.VLANIdentifier)
			}
			udp := p.Layer(layers.LayerTypeUDP).(*layers.UDP)
			require.EqualValues(t, sp.srcPort.at(i), udp.SrcPort)
			require.EqualValues(t, 9, udp.DstPort)
			require.Equal(t, i, binary.BigEndian.Uint64(udp.Payload), "the sequence number")
			var want [16]byte
			sp.srcIP.at(i, want[:])
			if tc.v6 {
				ip := p.Layer(layers.LayerTypeIPv6).(*layers.IPv6)
				require.Equal(t, net.IP(want[:]), ip.SrcIP, "frame %d", i)
				require.Equal(t, net.ParseIP("2001:db8:1::9"), ip.DstIP)
				require.EqualValues(t, len(ip.Payload), ip.Length)
				require.True(t, udp6Valid(ip, ip.Payload), "frame %d: UDP checksum", i)
				require.NotZero(t, udp.Checksum)
			} else {
				ip := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
				require.Equal(t, net.IP(want[:4]), ip.SrcIP, "frame %d", i)
				require.EqualValues(t, 0xffff, sum16(ip.Contents, 0), "frame %d: IPv4 header checksum", i)
				require.EqualValues(t, len(ip.Contents)+len(ip.Payload), ip.Length)
				require.Zero(t, udp.Checksum, "no UDP checksum over IPv4")
			}
			require.EqualValues(t, len(udp.Contents)+len(udp.Payload), udp.Length)
		}
		require.Zero(t, testing.AllocsPerRun(100, func() { g.next(7) }), "a frame allocates nothing")
	}
}

func TestRanges(t *testing.T) {
	r, err := parseNumRange("port", "10-12", 1, 65535)
	require.NoError(t, err)
	require.Equal(t, []uint64{10, 11, 12, 10}, []uint64{r.at(0), r.at(1), r.at(2), r.at(3)})
	require.Equal(t, "10-12", r.String())
	ip, err := parseIPRange("src-ip", "10.0.0.255-10.0.1.0")
	require.NoError(t, err)
	var b [16]byte
	ip.at(1, b[:])
	require.Equal(t, net.IP{10, 0, 1, 0}, net.IP(b[:4]), "carries into the next octet")
	m, err := parseMACRange("dst-mac", "02:00:00:00:00:ff-02:00:00:00:01:00")
	require.NoError(t, err)
	require.Equal(t, "02:00:00:00:01:00", macOf(m.at(1)).String())
	require.Equal(t, "02:00:00:00:00:ff-02:00:00:00:01:00", macRangeNote(m))
	mix, err := parseSizeMix("64:7,594:4,1518:1")
	require.NoError(t, err)
	require.Len(t, mix.mix, 12)
	require.InDelta(t, (64*7+594*4+1518)/12.0, mix.mean(), 1e-9)
	lo, hi := mix.bounds()
	require.Equal(t, []int{64, 1518}, []int{lo, hi})
	require.Equal(t, "a mix of 64:7,594:4,1518:1 byte", sizeNote(mix))
}

func writeTestPcap(t *testing.T, path string, link layers.LinkType, frames ...[]byte) {
	t.Helper()
	f, err := os.Create(path)
	require.NoError(t, err)
	defer f.Close()
	w := pcapgo.NewWriter(f)
	require.NoError(t, w.WriteFileHeader(65535, link))
	for _, b := range frames {
		require.NoError(t, w.WritePacket(gopacket.CaptureInfo{Timestamp: time.Unix(1, 0), CaptureLength: len(b), Length: len(b)}, b))
	}
}

// TestReplayFrames: -replay reads pcap and pcapng files of Ethernet
// frames, in order, and refuses what it cannot send before the device
// is looked up.
func TestReplayFrames(t *testing.T) {
	dir := t.TempDir()
	a, b := make([]byte, 60), make([]byte, 1514)
	a[0], b[0] = 1, 2
	pcap := filepath.Join(dir, "a.pcap")
	writeTestPcap(t, pcap, layers.LinkTypeEthernet, a, b, a)
	frames, err := readFrames(pcap)
	require.NoError(t, err)
	require.Equal(t, [][]byte{a, b, a}, frames)
	lo, hi := frameBounds(frames)
	require.Equal(t, []int{60, 1514}, []int{lo, hi})
	r := &replayFrames{frames: frames}
	require.Equal(t, b, r.next(4), "in order, over and over")

	ng := filepath.Join(dir, "a.pcapng")
	f, err := os.Create(ng)
	require.NoError(t, err)
	w, err := pcapgo.NewNgWriter(f, layers.LinkTypeEthernet)
	require.NoError(t, err)
	require.NoError(t, w.WritePacket(gopacket.CaptureInfo{Timestamp: time.Unix(1, 0), CaptureLength: 60, Length: 60, InterfaceIndex: 0}, a))
	require.NoError(t, w.Flush())
	require.NoError(t, f.Close())
	frames, err = readFrames(ng)
	require.NoError(t, err)
	require.Equal(t, [][]byte{a}, frames)

	empty := filepath.Join(dir, "empty.pcap")
	writeTestPcap(t, empty, layers.LinkTypeEthernet)
	raw := filepath.Join(dir, "raw.pcap")
	writeTestPcap(t, raw, layers.LinkTypeRaw, a)
	junk := filepath.Join(dir, "junk")
	require.NoError(t, os.WriteFile(junk, []byte("hello, world"), 0o644))
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-replay", filepath.Join(dir, "none.pcap")}, "no such file"},
		{[]string{"-replay", empty}, "holds no frames"},
		{[]string{"-replay", raw}, "not Ethernet"},
		{[]string{"-replay", junk}, "-replay: " + junk},
		{[]string{"-replay", pcap, "-size", "100", "-port", "7"}, "-replay sends the file's frames as they are: drop -port, -size"},
		{[]string{"-replay", pcap, "-loop", "-1"}, "-loop -1 is negative"},
	} {
		code, out, errw := runCLI(append(append([]string{"pktgen"}, tc.args...), "0000:7f:1f.0")...)
		require.Equal(t, exitUsage, code, "%v: %s", tc.args, errw)
		require.Empty(t, out)
		require.Contains(t, errw, tc.want, tc.args)
		require.NotContains(t, errw, "not found", "refused before the device is looked up")
	}
	// A good file gets as far as the device.
	code, _, errw := runCLI("pktgen", "-replay", pcap, "-rate", "10", "-loop", "0", "0000:7f:1f.7")
	require.Equal(t, exitFailure, code, errw)
	require.Contains(t, errw, "not found")
}
