package main

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

// numRange is a field that takes the values lo, lo+1, ..., lo+n-1, one
// per frame, and wraps.
type numRange struct{ lo, n uint64 }

func (r numRange) at(i uint64) uint64 {
	if r.n <= 1 {
		return r.lo
	}
	return r.lo + i%r.n
}

func (r numRange) String() string {
	if r.n <= 1 {
		return strconv.FormatUint(r.lo, 10)
	}
	return fmt.Sprintf("%d-%d", r.lo, r.lo+r.n-1)
}

// parseNumRange reads "N" or "N-M" (inclusive) within [min, max].
func parseNumRange(flagName, s string, min, max uint64) (numRange, error) {
	a, b, isRange := strings.Cut(s, "-")
	lo, err1 := strconv.ParseUint(a, 10, 64)
	hi, err2 := lo, error(nil)
	if isRange {
		hi, err2 = strconv.ParseUint(b, 10, 64)
	}
	switch {
	case err1 != nil || err2 != nil:
		return numRange{}, fmt.Errorf("%w: -%s %q: want N or N-M", errUsage, flagName, s)
	case lo < min || hi > max:
		return numRange{}, fmt.Errorf("%w: -%s %s outside [%d, %d]", errUsage, flagName, s, min, max)
	case hi < lo:
		return numRange{}, fmt.Errorf("%w: -%s %s: the range is reversed", errUsage, flagName, s)
	}
	return numRange{lo: lo, n: hi - lo + 1}, nil
}

// ipRange is an address field: IPv4 addresses counted as 32-bit numbers,
// IPv6 ones in their low 64 bits (high holds the rest).
type ipRange struct {
	v6   bool
	high uint64
	low  numRange
	text string
}

func (r ipRange) at(i uint64, b []byte) {
	if r.v6 {
		binary.BigEndian.PutUint64(b[0:], r.high)
		binary.BigEndian.PutUint64(b[8:], r.low.at(i))
		return
	}
	binary.BigEndian.PutUint32(b, uint32(r.low.at(i)))
}

func parseIPRange(flagName, s string) (ipRange, error) {
	a, b, isRange := strings.Cut(s, "-")
	if !isRange {
		b = a
	}
	lo, err1 := netip.ParseAddr(a)
	hi, err2 := netip.ParseAddr(b)
	if err1 != nil || err2 != nil || lo.Zone() != "" || hi.Zone() != "" {
		return ipRange{}, fmt.Errorf("%w: -%s %q: want an IPv4 or IPv6 address, or a range A-B", errUsage, flagName, s)
	}
	lo, hi = lo.Unmap(), hi.Unmap()
	if lo.Is4() != hi.Is4() {
		return ipRange{}, fmt.Errorf("%w: -%s %s: both ends must be IPv4, or both IPv6", errUsage, flagName, s)
	}
	r := ipRange{v6: lo.Is6(), text: s}
	var l, h uint64
	if lo.Is4() {
		a4, b4 := lo.As4(), hi.As4()
		l, h = uint64(binary.BigEndian.Uint32(a4[:])), uint64(binary.BigEndian.Uint32(b4[:]))
	} else {
		a16, b16 := lo.As16(), hi.As16()
		r.high = binary.BigEndian.Uint64(a16[:8])
		if binary.BigEndian.Uint64(b16[:8]) != r.high {
			return ipRange{}, fmt.Errorf("%w: -%s %s: an IPv6 range may differ in its low 64 bits only", errUsage, flagName, s)
		}
		l, h = binary.BigEndian.Uint64(a16[8:]), binary.BigEndian.Uint64(b16[8:])
	}
	if h < l {
		return ipRange{}, fmt.Errorf("%w: -%s %s: the range is reversed", errUsage, flagName, s)
	}
	if h-l == ^uint64(0) {
		return ipRange{}, fmt.Errorf("%w: -%s %s: a range of 2^64 addresses is too wide", errUsage, flagName, s)
	}
	r.low = numRange{lo: l, n: h - l + 1}
	return r, nil
}

// parseMACRange reads a MAC or a range of MACs "A-B" (colon-separated),
// counted as 48-bit numbers.
func parseMACRange(flagName, s string) (numRange, error) {
	parts := []string{s}
	if strings.Count(s, "-") == 1 {
		parts = strings.Split(s, "-")
	}
	var v [2]uint64
	for i, p := range parts {
		m, err := net.ParseMAC(p)
		if err != nil || len(m) != 6 { // ParseMAC takes EUI-64 and InfiniBand addresses too
			return numRange{}, fmt.Errorf("%w: -%s %q is not a 6-byte Ethernet address (or a range A-B of them)", errUsage, flagName, s)
		}
		v[i] = uint64(m[0])<<40 | uint64(m[1])<<32 | uint64(binary.BigEndian.Uint32(m[2:]))
	}
	if len(parts) == 1 {
		return numRange{lo: v[0], n: 1}, nil
	}
	if v[1] < v[0] {
		return numRange{}, fmt.Errorf("%w: -%s %s: the range is reversed", errUsage, flagName, s)
	}
	return numRange{lo: v[0], n: v[1] - v[0] + 1}, nil
}

func macOf(v uint64) net.HardwareAddr {
	return net.HardwareAddr{byte(v >> 40), byte(v >> 32), byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}
}

// sizeSeq is the frame size of each frame: a range, or a mix repeated.
type sizeSeq struct {
	r   numRange
	mix []int // one entry per frame of the mix's cycle
	txt string
}

func (s sizeSeq) at(i uint64) int {
	if len(s.mix) > 0 {
		return s.mix[i%uint64(len(s.mix))]
	}
	return int(s.r.at(i))
}

func (s sizeSeq) bounds() (lo, hi int) {
	if len(s.mix) == 0 {
		return int(s.r.lo), int(s.r.lo + s.r.n - 1)
	}
	lo, hi = s.mix[0], s.mix[0]
	for _, v := range s.mix {
		lo, hi = min(lo, v), max(hi, v)
	}
	return lo, hi
}

// mean is the average frame size, for the rate note.
func (s sizeSeq) mean() float64 {
	if len(s.mix) == 0 {
		return float64(s.r.lo) + float64(s.r.n-1)/2
	}
	t := 0
	for _, v := range s.mix {
		t += v
	}
	return float64(t) / float64(len(s.mix))
}

// maxMixFrames bounds a size mix's cycle.
const maxMixFrames = 4096

// parseSizeMix reads "SIZE:COUNT,..." (IMIX: 64:7,594:4,1518:1): COUNT
// frames of each SIZE in turn, over and over.
func parseSizeMix(s string) (sizeSeq, error) {
	q := sizeSeq{txt: s}
	for _, part := range strings.Split(s, ",") {
		a, b, ok := strings.Cut(part, ":")
		size, err1 := strconv.Atoi(a)
		n, err2 := strconv.Atoi(b)
		if !ok || err1 != nil || err2 != nil || n <= 0 {
			return sizeSeq{}, fmt.Errorf("%w: -size-mix %q: want SIZE:COUNT,... (64:7,594:4,1518:1)", errUsage, s)
		}
		if len(q.mix)+n > maxMixFrames {
			return sizeSeq{}, fmt.Errorf("%w: -size-mix %q: more than %d frames in a cycle", errUsage, s, maxMixFrames)
		}
		for range n {
			q.mix = append(q.mix, size)
		}
	}
	return q, nil
}

// flowSpec is what pktgen varies from frame to frame: each range takes
// its next value with every frame, independently, wrapping at its end
// (ranges of coprime lengths go through every combination).
type flowSpec struct {
	srcMAC, dstMAC   numRange
	srcIP, dstIP     ipRange
	srcPort, dstPort numRange
	sizes            sizeSeq
	vlan             int // -1: untagged
}

// headerLen is the bytes before the sequence number.
func (f *flowSpec) headerLen() int {
	n := 14 + 20 + 8
	if f.srcIP.v6 {
		n += 20
	}
	if f.vlan >= 0 {
		n += 4
	}
	return n
}

// minSize is the shortest frame that holds the headers and the 8-byte
// sequence number, and no less than Ethernet's 60 bytes.
func (f *flowSpec) minSize() int { return max(minFrame, f.headerLen()+8) }

// flowGen writes frame i of a flowSpec into one buffer: a template built
// once, whose varying fields it rewrites in place with the checksums
// adjusted incrementally (RFC 1624), so that a frame costs a few stores
// and allocates nothing. IPv4 frames carry no UDP checksum (0 is allowed);
// IPv6 frames carry a correct one.
type flowGen struct {
	spec            flowSpec
	buf             []byte
	l3, l4, seqOff  int
	ipCk, udpCk     int // checksum offsets; -1: none
	srcAddr, dstAdd int // address offsets
	addr            [16]byte
}

func newFlowGen(spec flowSpec) (*flowGen, error) {
	_, maxSize := spec.sizes.bounds()
	g := &flowGen{spec: spec, l3: 14, ipCk: -1, udpCk: -1}
	eth := &layers.Ethernet{SrcMAC: macOf(spec.srcMAC.lo), DstMAC: macOf(spec.dstMAC.lo), EthernetType: layers.EthernetTypeIPv4}
	ls := []gopacket.SerializableLayer{eth}
	if spec.vlan >= 0 {
		ls = append(ls, &layers.Dot1Q{VLANIdentifier: uint16(spec.vlan), Type: layers.EthernetTypeIPv4})
		eth.EthernetType = layers.EthernetTypeDot1Q
		g.l3 += 4
	}
	udp := &layers.UDP{SrcPort: layers.UDPPort(spec.srcPort.lo), DstPort: layers.UDPPort(spec.dstPort.lo)}
	var s, d [16]byte
	spec.srcIP.at(0, s[:])
	spec.dstIP.at(0, d[:])
	if spec.srcIP.v6 {
		ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolUDP, SrcIP: net.IP(s[:]), DstIP: net.IP(d[:])}
		_ = udp.SetNetworkLayerForChecksum(ip)
		if spec.vlan >= 0 {
			ls[1].(*layers.Dot1Q).Type = layers.EthernetTypeIPv6
		} else {
			eth.EthernetType = layers.EthernetTypeIPv6
		}
		ls = append(ls, ip)
		g.l4, g.srcAddr, g.dstAdd = g.l3+40, g.l3+8, g.l3+24
	} else {
		ip := &layers.IPv4{Version: 4, IHL: 5, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: net.IP(s[:4]), DstIP: net.IP(d[:4])}
		_ = udp.SetNetworkLayerForChecksum(ip)
		ls = append(ls, ip)
		g.l4, g.srcAddr, g.dstAdd, g.ipCk = g.l3+20, g.l3+12, g.l3+16, g.l3+10
	}
	g.seqOff = g.l4 + 8
	if maxSize < g.seqOff+8 {
		return nil, fmt.Errorf("%w: frame of %d bytes cannot hold a sequence number", errUsage, maxSize)
	}
	ls = append(ls, udp, gopacket.Payload(make([]byte, maxSize-g.seqOff)))
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
		return nil, err
	}
	g.buf = append([]byte(nil), buf.Bytes()...)
	if spec.srcIP.v6 {
		g.udpCk = g.l4 + 6
	} else {
		// The sequence number changes in place for every frame: no UDP
		// checksum over IPv4.
		binary.BigEndian.PutUint16(g.buf[g.l4+6:], 0)
	}
	return g, nil
}

// head implements headed: every field that changes lies before the end of
// the sequence number, and the payload after it is zeros.
func (g *flowGen) head() int { return zeroPast(g.buf, g.seqOff+8) }

// next returns frame i (valid until the next call), its sequence number
// i in the 8 bytes after the UDP header.
func (g *flowGen) next(i uint64) []byte {
	b, sp := g.buf, &g.spec
	if sp.dstMAC.n > 1 {
		putMAC(b[0:], sp.dstMAC.at(i))
	}
	if sp.srcMAC.n > 1 {
		putMAC(b[6:], sp.srcMAC.at(i))
	}
	n := 4
	if sp.srcIP.v6 {
		n = 16
	}
	// An address is in the IPv4 header checksum, or the IPv6 pseudo-header.
	addrCk := g.ipCk
	if sp.srcIP.v6 {
		addrCk = g.udpCk
	}
	if sp.srcIP.low.n > 1 {
		sp.srcIP.at(i, g.addr[:])
		g.putWords(g.srcAddr, g.addr[:n], addrCk)
	}
	if sp.dstIP.low.n > 1 {
		sp.dstIP.at(i, g.addr[:])
		g.putWords(g.dstAdd, g.addr[:n], addrCk)
	}
	if sp.srcPort.n > 1 {
		g.put16(g.l4, uint16(sp.srcPort.at(i)), g.udpCk)
	}
	if sp.dstPort.n > 1 {
		g.put16(g.l4+2, uint16(sp.dstPort.at(i)), g.udpCk)
	}
	size := sp.sizes.at(i)
	udpLen := uint16(size - g.l4)
	if old := binary.BigEndian.Uint16(b[g.l4+4:]); old != udpLen {
		if sp.srcIP.v6 {
			g.put16(g.l3+4, udpLen, -1) // payload length: not checksummed
			adjust(b, g.udpCk, old, udpLen)
		} else {
			g.put16(g.l3+2, uint16(size-g.l3), g.ipCk)
		}
		g.put16(g.l4+4, udpLen, g.udpCk)
	}
	var seq [8]byte
	binary.BigEndian.PutUint64(seq[:], i)
	g.putWords(g.seqOff, seq[:], g.udpCk)
	return b[:size]
}

func putMAC(b []byte, v uint64) {
	b[0], b[1] = byte(v>>40), byte(v>>32)
	binary.BigEndian.PutUint32(b[2:], uint32(v))
}

// putWords writes v (an even number of bytes) at off, 16 bits at a time.
func (g *flowGen) putWords(off int, v []byte, ck int) {
	for j := 0; j < len(v); j += 2 {
		g.put16(off+j, binary.BigEndian.Uint16(v[j:]), ck)
	}
}

// put16 writes v at off and adjusts the checksum at ck (-1: none).
func (g *flowGen) put16(off int, v uint16, ck int) {
	old := binary.BigEndian.Uint16(g.buf[off:])
	if old == v {
		return
	}
	binary.BigEndian.PutUint16(g.buf[off:], v)
	adjust(g.buf, ck, old, v)
}

// adjust updates the Internet checksum at b[ck:] for a 16-bit word of
// the sum changing from old to v: HC' = ~(~HC + ~m + m') (RFC 1624, eqn.
// 3). A UDP checksum that comes out 0 is sent as 0xffff (RFC 768).
func adjust(b []byte, ck int, old, v uint16) {
	if ck < 0 {
		return
	}
	sum := uint32(^binary.BigEndian.Uint16(b[ck:])) + uint32(^old) + uint32(v)
	sum = (sum & 0xffff) + sum>>16
	sum = (sum & 0xffff) + sum>>16
	c := ^uint16(sum)
	if c == 0 {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(b[ck:], c)
}
