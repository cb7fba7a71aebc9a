package igbvm

import (
	"encoding/binary"
	"fmt"
	"net"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

// Frames between the guest and the host: Ethernet with a local
// experimental EtherType, then
//
//	[14:18] "IGBV"  [18] type  [19] 0  [20:24] session  [24:28] seq or argument
//	[28:30] frame length  [30:] pattern bytes (data frames)
//
// The session is chosen by the guest test, so frames left over from an
// earlier test are told apart.
const (
	etherType = 0x88B5
	hdrLen    = 30
	minData   = 64
	maxData   = 1514
)

// Message types.
const (
	msgHello    = 1 // guest: are you there; host: helloAck
	msgHelloAck = 2
	msgRxReq    = 3 // guest: send me arg data frames (window of acks)
	msgData     = 4
	msgAck      = 5  // the count of data frames received so far
	msgTxReq    = 6  // guest: I will send arg data frames; check them
	msgDelayed  = 7  // guest: send one data frame after arg milliseconds
	msgNak      = 8  // host: a data frame was wrong (arg: its expected seq)
	msgRSSReq   = 9  // guest: send arg>>16 UDP flows of arg&0xffff frames each
	msgPaced    = 10 // guest: send arg>>16 data frames, arg&0xffff microseconds apart
	// msgOversize (guest): send an arg-byte frame to the sender's MAC,
	// then msgOversizeDone to the MAC in bytes [30:36] of the request.
	msgOversize     = 11
	msgOversizeDone = 12
	// msgVLANReq (guest): send data frame 0 with an 802.1Q tag whose TCI
	// is arg, then data frame 1 untagged.
	msgVLANReq = 13
	// msgCsumReq (guest): arg checksum-offload frames follow (csumFrames),
	// sent with their checksums zeroed; the host checks each and answers
	// msgCsumDone with arg good | bad<<16.
	msgCsumReq  = 14
	msgCsumDone = 15
	// msgLinkFlap (guest): take the link of the NIC that sent this down
	// from QEMU's monitor (set_link nic0 off), and up again after arg
	// milliseconds. Nothing is answered (the link is down).
	msgLinkFlap = 16
)

// csumFrames are the frames of the checksum-offload test, with correct
// checksums (gopacket): UDP and TCP over IPv4, IPv4 with options, IPv6,
// and a VLAN-tagged IPv4 frame; each carries the test header (type
// msgData, arg its index) as payload.
func csumFrames(dst, src net.HardwareAddr, session uint32) [][]byte {
	var out [][]byte
	for i, k := range []struct {
		v6, tcp bool
		vlan    uint16
		opts    int
	}{{}, {tcp: true}, {opts: 4}, {v6: true}, {v6: true, tcp: true}, {vlan: 9}, {vlan: 9, tcp: true}} {
		payload := make([]byte, hdrLen+17)
		fill(payload, dst, src, msgData, session, uint32(i))
		eth := &layers.Ethernet{SrcMAC: src, DstMAC: dst, EthernetType: layers.EthernetTypeIPv4}
		ls := []gopacket.SerializableLayer{eth}
		et := layers.EthernetTypeIPv4
		if k.v6 {
			et = layers.EthernetTypeIPv6
		}
		if k.vlan != 0 {
			eth.EthernetType = layers.EthernetTypeDot1Q
			ls = append(ls, &layers.Dot1Q{VLANIdentifier: k.vlan, Type: et})
		} else {
			eth.EthernetType = et
		}
		proto := layers.IPProtocolUDP
		if k.tcp {
			proto = layers.IPProtocolTCP
		}
		var nl gopacket.NetworkLayer
		if k.v6 {
			ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: proto, SrcIP: net.ParseIP("fd00::2"), DstIP: net.ParseIP("fd00::1")}
			nl, ls = ip, append(ls, ip)
		} else {
			ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: proto, SrcIP: guestIP, DstIP: hostIP}
			for j := 0; j < k.opts; j++ {
				ip.Options = append(ip.Options, layers.IPv4Option{OptionType: 1}) // NOP
			}
			nl, ls = ip, append(ls, ip)
		}
		if k.tcp {
			l4 := &layers.TCP{SrcPort: 4000, DstPort: 9, Seq: uint32(i), ACK: true, Window: 1024}
			_ = l4.SetNetworkLayerForChecksum(nl)
			ls = append(ls, l4)
		} else {
			l4 := &layers.UDP{SrcPort: 4000, DstPort: 9}
			_ = l4.SetNetworkLayerForChecksum(nl)
			ls = append(ls, l4)
		}
		buf := gopacket.NewSerializeBuffer()
		if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{ComputeChecksums: true, FixLengths: true},
			append(ls, gopacket.Payload(payload))...); err != nil {
			panic(err) // fixed, valid layers
		}
		out = append(out, append([]byte(nil), buf.Bytes()...))
	}
	return out
}

// checkCsum decodes a frame of csumFrames: its session, and whether its
// IPv4 and TCP/UDP checksums are right (gopacket recomputes them by
// serializing the decoded layers again).
func checkCsum(f []byte) (session uint32, good, ok bool) {
	p := gopacket.NewPacket(f, layers.LayerTypeEthernet, gopacket.Default)
	app := p.ApplicationLayer()
	if app == nil || len(app.Payload()) < hdrLen || string(app.Payload()[14:18]) != "IGBV" {
		return 0, false, false
	}
	session = binary.LittleEndian.Uint32(app.Payload()[20:24])
	var ls []gopacket.SerializableLayer
	var nl gopacket.NetworkLayer
	for _, l := range p.Layers() {
		switch l := l.(type) {
		case *layers.IPv4:
			nl = l
		case *layers.IPv6:
			nl = l
		case *layers.TCP:
			_ = l.SetNetworkLayerForChecksum(nl)
		case *layers.UDP:
			_ = l.SetNetworkLayerForChecksum(nl)
		}
		if sl, isSL := l.(gopacket.SerializableLayer); isSL {
			ls = append(ls, sl)
		}
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{ComputeChecksums: true}, ls...); err != nil {
		return session, false, true
	}
	return session, string(buf.Bytes()) == string(f), true
}

// RSS flows: UDP/IPv4 from 10.0.0.1:rssPort0+flow to 10.0.0.2:9, with the
// test header (type msgData, arg flow<<16|seq) as UDP payload.
const rssPort0 = 10000

var hostIP, guestIP = net.IPv4(10, 0, 0, 1).To4(), net.IPv4(10, 0, 0, 2).To4()

// udpFrame builds a UDP/IPv4 frame with checksums, through gopacket.
func udpFrame(dst, src net.HardwareAddr, session uint32, flow, seq int) []byte {
	payload := make([]byte, hdrLen+16)
	fill(payload, dst, src, msgData, session, uint32(flow<<16|seq))
	eth := &layers.Ethernet{SrcMAC: src, DstMAC: dst, EthernetType: layers.EthernetTypeIPv4}
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: hostIP, DstIP: guestIP}
	udp := &layers.UDP{SrcPort: layers.UDPPort(rssPort0 + flow), DstPort: 9}
	_ = udp.SetNetworkLayerForChecksum(ip)
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{ComputeChecksums: true, FixLengths: true},
		eth, ip, udp, gopacket.Payload(payload)); err != nil {
		panic(err) // fixed, valid layers
	}
	return buf.Bytes()
}

// parseUDP decodes a frame from udpFrame: the flow (by source port) and
// the test header in the payload.
func parseUDP(f []byte) (flow int, m msg, ok bool) {
	p := gopacket.NewPacket(f, layers.LayerTypeEthernet, gopacket.NoCopy)
	udp, isUDP := p.Layer(layers.LayerTypeUDP).(*layers.UDP)
	if !isUDP || len(udp.Payload) < hdrLen || string(udp.Payload[14:18]) != "IGBV" {
		return 0, msg{}, false
	}
	b := udp.Payload
	m = msg{typ: b[18], session: binary.LittleEndian.Uint32(b[20:24]), arg: binary.LittleEndian.Uint32(b[24:28])}
	return int(udp.SrcPort) - rssPort0, m, true
}

var hostMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x01}

// msg is a decoded frame.
type msg struct {
	typ     uint8
	session uint32
	arg     uint32
	size    int
}

// dataSize is the length of data frame seq: 64 to 1514 bytes, mixed.
func dataSize(seq uint32) int { return minData + int(seq*7919)%(maxData-minData+1) }

func build(dst, src net.HardwareAddr, typ uint8, session, arg uint32, size int) []byte {
	if size < hdrLen {
		size = 60
	}
	b := make([]byte, size)
	fill(b, dst, src, typ, session, arg)
	return b
}

// fill writes a frame of len(b) bytes into b.
func fill(b []byte, dst, src net.HardwareAddr, typ uint8, session, arg uint32) {
	copy(b[0:6], dst)
	copy(b[6:12], src)
	binary.BigEndian.PutUint16(b[12:14], etherType)
	copy(b[14:18], "IGBV")
	b[18], b[19] = typ, 0
	binary.LittleEndian.PutUint32(b[20:24], session)
	binary.LittleEndian.PutUint32(b[24:28], arg)
	binary.LittleEndian.PutUint16(b[28:30], uint16(len(b)))
	for i := hdrLen; i < len(b); i++ {
		b[i] = byte(arg*31 + uint32(i))
	}
}

// tagged inserts an 802.1Q tag with the given TCI after f's addresses.
func tagged(f []byte, tci uint16) []byte {
	b := make([]byte, 0, len(f)+4)
	b = append(b, f[:12]...)
	b = binary.BigEndian.AppendUint16(b, 0x8100)
	b = binary.BigEndian.AppendUint16(b, tci)
	return append(b, f[12:]...)
}

func dataFrame(dst, src net.HardwareAddr, session, seq uint32) []byte {
	return build(dst, src, msgData, session, seq, dataSize(seq))
}

// parse decodes f with gopacket's Ethernet layer and checks the header
// and, for data frames, the length and every pattern byte.
func parse(f []byte) (msg, error) {
	p := gopacket.NewPacket(f, layers.LayerTypeEthernet, gopacket.NoCopy)
	eth, ok := p.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
	if !ok || eth.EthernetType != etherType {
		return msg{}, fmt.Errorf("not a test frame (%d bytes)", len(f))
	}
	b := f
	if len(b) < hdrLen || string(b[14:18]) != "IGBV" {
		return msg{}, fmt.Errorf("bad magic in a %d-byte frame", len(b))
	}
	m := msg{typ: b[18], session: binary.LittleEndian.Uint32(b[20:24]), arg: binary.LittleEndian.Uint32(b[24:28]),
		size: int(binary.LittleEndian.Uint16(b[28:30]))}
	if m.typ != msgData {
		return m, nil
	}
	if m.size != len(b) || m.size != dataSize(m.arg) {
		return m, fmt.Errorf("data frame %d: %d bytes, header says %d, expected %d", m.arg, len(b), m.size, dataSize(m.arg))
	}
	for i := hdrLen; i < len(b); i++ {
		if b[i] != byte(m.arg*31+uint32(i)) {
			return m, fmt.Errorf("data frame %d: byte %d is %#x", m.arg, i, b[i])
		}
	}
	return m, nil
}

// rssKey is the key the driver programs (Microsoft's verification key).
var rssKey = []byte{
	0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3, 0x8f, 0xb0,
	0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30, 0xf2, 0x0c,
	0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
}

// toeplitz is the RSS hash of input under key (Microsoft's RSS spec).
func toeplitz(key, input []byte) uint32 {
	var h uint32
	w := binary.BigEndian.Uint32(key)
	for i, b := range input {
		for bit := 7; bit >= 0; bit-- {
			if b>>uint(bit)&1 != 0 {
				h ^= w
			}
			w <<= 1
			if kb := i + 4; kb < len(key) && key[kb]>>uint(bit)&1 != 0 {
				w |= 1
			}
		}
	}
	return h
}

// flowHash is the IPv4/UDP RSS hash of flow: source and destination
// address, then source and destination port.
func flowHash(flow int) uint32 {
	in := make([]byte, 12)
	copy(in[0:4], hostIP)
	copy(in[4:8], guestIP)
	binary.BigEndian.PutUint16(in[8:10], uint16(rssPort0+flow))
	binary.BigEndian.PutUint16(in[10:12], 9)
	return toeplitz(rssKey, in)
}
