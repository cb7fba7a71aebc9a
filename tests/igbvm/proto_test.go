package igbvm

import (
	"encoding/binary"
	"fmt"
	"net"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
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
	msgAck      = 5 // the count of data frames received so far
	msgTxReq    = 6 // guest: I will send arg data frames; check them
	msgDelayed  = 7 // guest: send one data frame after arg milliseconds
	msgNak      = 8 // host: a data frame was wrong (arg: its expected seq)
)

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
