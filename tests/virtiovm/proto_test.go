package virtiovm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

// The wire protocol between a guest test and the host side. Every frame is
// an Ethernet frame of the local experimental EtherType whose payload
// starts with a fixed header:
//
//	[0:4]   magic "VFNT"
//	[4]     message type
//	[8:12]  session (chosen by the guest at hello; stale frames differ)
//	[12:16] seq or first argument
//	[16:28] three more arguments
//	[28:]   filler that depends on session, seq and offset
//
// Data frames are checked byte for byte against dataFrame.
const (
	etherType = layers.EthernetType(0x88b5)
	hdrLen    = 14 + 28
	minFrame  = 64
	maxFrame  = 1514
)

var magic = []byte("VFNT")

// Message types.
const (
	msgHello        = 1  // guest: start a session; host answers msgHelloAck
	msgHelloAck     = 2  //
	msgSendReq      = 3  // guest: send args[0] data frames, window args[1]
	msgAck          = 4  // guest: received every data frame below seq
	msgSendDone     = 5  // host: all sent and acknowledged; args[0] sent
	msgExpectReq    = 6  // guest: about to send args[0] data frames
	msgExpectAck    = 7  //
	msgResultReq    = 8  // guest: how many arrived?
	msgResult       = 9  // host: args: received, bad, stale
	msgData         = 10 // a data frame (either direction)
	msgBenchTxStart = 11 // guest: count data frames from now
	msgBenchTxAck   = 12 //
	msgBenchTxEnd   = 13 // guest: args[0] frames sent; host answers msgBenchResult
	msgBenchResult  = 14 // host: args: received, microseconds from first to last
	msgBlastReq     = 15 // guest: send 64-byte data frames for args[0] ms (round args[1])
	msgBlastDone    = 16 // host: args[0] frames sent in args[1] microseconds (round args[2])
	msgDelayedReq   = 17 // guest: send one data frame after args[0] ms
	// msgOversizeReq needs no hello: send a data frame of seq bytes to the
	// MAC in args (macArgs), then msgOversizeDone to the reply MAC there.
	msgOversizeReq  = 18
	msgOversizeDone = 19 // host: the oversized frame went out (session of the request)
)

// macArgs packs two MACs into a message's three arguments.
func macArgs(a, b net.HardwareAddr) [3]uint32 {
	var x [12]byte
	copy(x[:6], a)
	copy(x[6:], b)
	return [3]uint32{binary.BigEndian.Uint32(x[0:]), binary.BigEndian.Uint32(x[4:]), binary.BigEndian.Uint32(x[8:])}
}

// argMACs unpacks what macArgs packed.
func argMACs(args [3]uint32) (a, b net.HardwareAddr) {
	var x [12]byte
	for i, v := range args {
		binary.BigEndian.PutUint32(x[4*i:], v)
	}
	return append(net.HardwareAddr(nil), x[:6]...), append(net.HardwareAddr(nil), x[6:]...)
}

var hostMAC = net.HardwareAddr{0x02, 0x00, 0x00, 0x00, 0x00, 0x01}

// msg is a decoded protocol header.
type msg struct {
	typ     uint8
	session uint32
	seq     uint32
	args    [3]uint32
}

// fill is the filler byte at payload offset i of a frame.
func fill(session, seq uint32, i int) byte {
	return byte(uint32(i)*7 + seq*13 + session)
}

// build makes a frame of size bytes (at least minFrame) carrying m.
func build(dst, src net.HardwareAddr, m msg, size int) []byte {
	f := make([]byte, max(size, minFrame))
	copy(f[0:6], dst)
	copy(f[6:12], src)
	binary.BigEndian.PutUint16(f[12:], uint16(etherType))
	p := f[14:]
	copy(p, magic)
	p[4] = m.typ
	binary.BigEndian.PutUint32(p[8:], m.session)
	binary.BigEndian.PutUint32(p[12:], m.seq)
	for i, a := range m.args {
		binary.BigEndian.PutUint32(p[16+4*i:], a)
	}
	for i := 28; i < len(p); i++ {
		p[i] = fill(m.session, m.seq, i)
	}
	return f
}

// ctlFrame is a control frame of the session from src to the host.
func ctlFrame(src net.HardwareAddr, session uint32, typ uint8, args ...uint32) []byte {
	m := msg{typ: typ, session: session}
	copy(m.args[:], args)
	return build(hostMAC, src, m, minFrame)
}

// spanRate is the rate of n frames whose first and last arrived us
// microseconds apart (0 when they did not span any time).
func spanRate(n, us uint32) float64 {
	if us == 0 {
		return 0
	}
	return float64(n-1) / (float64(us) / 1e6)
}

// sizeFor is the length of data frame seq: mixed sizes from 64 to 1514
// bytes, both ends included early.
func sizeFor(seq uint32) int {
	switch seq % 1000 {
	case 0:
		return minFrame
	case 1:
		return maxFrame
	}
	return minFrame + int(seq*7919%uint32(maxFrame-minFrame+1))
}

// dataFrame is data frame seq of a session.
func dataFrame(dst, src net.HardwareAddr, session, seq uint32) []byte {
	return build(dst, src, msg{typ: msgData, session: session, seq: seq}, sizeFor(seq))
}

// peek decodes the protocol header of f without copying or allocating;
// ok is false for frames that are not ours.
func peek(f []byte) (m msg, ok bool) {
	if len(f) < hdrLen || binary.BigEndian.Uint16(f[12:]) != uint16(etherType) || !bytes.Equal(f[14:18], magic) {
		return m, false
	}
	p := f[14:]
	m.typ = p[4]
	m.session = binary.BigEndian.Uint32(p[8:])
	m.seq = binary.BigEndian.Uint32(p[12:])
	for i := range m.args {
		m.args[i] = binary.BigEndian.Uint32(p[16+4*i:])
	}
	return m, true
}

var errBadFrame = errors.New("frame differs from what was sent")

// checkData parses f with gopacket as an Ethernet frame and checks that it
// is data frame seq of the session from src to dst, intact.
func checkData(f []byte, dst, src net.HardwareAddr, session, seq uint32) error {
	pkt := gopacket.NewPacket(f, layers.LayerTypeEthernet, gopacket.Default)
	eth, ok := pkt.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
	if !ok {
		return fmt.Errorf("%w: seq %d: not an Ethernet frame (%v)", errBadFrame, seq, pkt.ErrorLayer())
	}
	switch {
	case eth.EthernetType != etherType:
		return fmt.Errorf("%w: seq %d: EtherType %v", errBadFrame, seq, eth.EthernetType)
	case !bytes.Equal(eth.DstMAC, dst) || !bytes.Equal(eth.SrcMAC, src):
		return fmt.Errorf("%w: seq %d: %v -> %v, want %v -> %v", errBadFrame, seq, eth.SrcMAC, eth.DstMAC, src, dst)
	}
	want := dataFrame(dst, src, session, seq)
	if len(f) != len(want) {
		return fmt.Errorf("%w: seq %d: %d bytes, want %d", errBadFrame, seq, len(f), len(want))
	}
	if !bytes.Equal(eth.Payload, want[14:]) {
		m, _ := peek(f)
		return fmt.Errorf("%w: seq %d: payload differs (carries type %d seq %d session %#x)", errBadFrame, seq, m.typ, m.seq, m.session)
	}
	return nil
}
