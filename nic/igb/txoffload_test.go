package igb

import (
	"encoding/binary"
	"net"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/nic"
)

// transmitOffload is fakeNIC.transmit for queues that use SendChecksum:
// it keeps the two contexts that context descriptors load (writing
// nothing back for them, as the 82576 does) and fills in the checksums a
// data descriptor's POPTS asks for from its context, as the device's
// checksum engine does: IPv4 header over a zero field, TCP/UDP over the
// L4 bytes starting from the seed in the field.
func (n *fakeNIC) transmitOffload() [][]byte {
	var out [][]byte
	tdt := n.f.get(txReg(regTDT0, 0))
	for ; n.tdh != tdt; n.tdh = (n.tdh + 1) % n.tx.n {
		p := desc(n.tx, n.tdh)
		w0 := atomic.LoadUint64((*uint64)(p))
		cmd := atomic.LoadUint32((*uint32)(unsafe.Add(p, 8)))
		ol := atomic.LoadUint32((*uint32)(unsafe.Add(p, 12)))
		if cmd&(0xf<<20) == txcDTypCtx {
			require.Equal(n.t, uint32(txcDTypCtx|txdCmdDEXT), cmd&^(txcTUCmdIPv4|txcTUCmdL4TCP), "context descriptor type")
			n.ctx[ol>>txcIdxSh&1] = [2]uint32{uint32(w0), cmd}
			continue
		}
		require.Equal(n.t, uint32(txdDTypData|txdCmdDEXT|txdCmdIFCS|txdCmdEOP|txdCmdRS), cmd&^0xffff)
		l := cmd & 0xffff
		require.Equal(n.t, l, ol>>txdPaylenSh, "PAYLEN")
		f := append([]byte(nil), n.buf(n.tx, w0)[:l]...)
		c := n.ctx[ol>>txdIdxSh&1]
		mac, ip := int(c[0]>>txcMACLenSh&0x7f), int(c[0]&0x1ff)
		if ol&txdPoptsIXSM != 0 {
			require.NotZero(n.t, c[1]&txcTUCmdIPv4, "IXSM with an IPv4 context")
			binary.BigEndian.PutUint16(f[mac+10:], ^fold(sum16(f[mac:mac+ip])))
		}
		if ol&txdPoptsTXSM != 0 {
			field := 6
			if c[1]&txcTUCmdL4TCP != 0 {
				field = 16
			}
			l4 := append([]byte(nil), f[mac+ip:]...)
			if len(l4)%2 == 1 {
				l4 = append(l4, 0) // pad the last byte
			}
			binary.BigEndian.PutUint16(f[mac+ip+field:], ^fold(sum16(l4)))
		}
		out = append(out, f)
		atomic.StoreUint32((*uint32)(unsafe.Add(p, 12)), txdStatusDD)
	}
	return out
}

// csumFrame builds an Ethernet frame (tagged when vlan != 0) carrying UDP
// or TCP over IPv4 (with ipOpts bytes of options) or IPv6, with correct
// checksums (gopacket) in want and zeroes in sent; l4 is the offset of
// the TCP or UDP checksum field.
func csumFrame(t *testing.T, v6, tcp bool, vlan uint16, ipOpts int) (sent, want []byte, l4 int) {
	src, dst := net.HardwareAddr{2, 0, 0, 0, 0, 1}, net.HardwareAddr{2, 0, 0, 0, 0, 2}
	var ls []gopacket.SerializableLayer
	eth := &layers.Ethernet{SrcMAC: src, DstMAC: dst, EthernetType: layers.EthernetTypeIPv4}
	ls = append(ls, eth)
	if vlan != 0 {
		eth.EthernetType = layers.EthernetTypeDot1Q
		ls = append(ls, &layers.Dot1Q{VLANIdentifier: vlan, Type: layers.EthernetTypeIPv4})
	}
	var nl gopacket.NetworkLayer
	proto := layers.IPProtocolUDP
	if tcp {
		proto = layers.IPProtocolTCP
	}
	if v6 {
		if vlan != 0 {
			ls[1].(*layers.Dot1Q).Type = layers.EthernetTypeIPv6
		} else {
			eth.EthernetType = layers.EthernetTypeIPv6
		}
		ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: proto, SrcIP: net.ParseIP("fd00::1"), DstIP: net.ParseIP("fd00::2")}
		nl, ls = ip, append(ls, ip)
	} else {
		ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: proto, SrcIP: net.IPv4(10, 0, 0, 1), DstIP: net.IPv4(10, 0, 0, 2)}
		if ipOpts > 0 {
			ip.Options = []layers.IPv4Option{{OptionType: 1}} // NOP options pad to ipOpts
			for i := 1; i < ipOpts; i++ {
				ip.Options = append(ip.Options, layers.IPv4Option{OptionType: 1})
			}
		}
		nl, ls = ip, append(ls, ip)
	}
	payload := gopacket.Payload("checksum offload test payload, odd length.")
	if tcp {
		l4 := &layers.TCP{SrcPort: 1234, DstPort: 80, Seq: 7, ACK: true, Window: 512}
		require.NoError(t, l4.SetNetworkLayerForChecksum(nl))
		ls = append(ls, l4, payload)
	} else {
		l4 := &layers.UDP{SrcPort: 1234, DstPort: 9}
		require.NoError(t, l4.SetNetworkLayerForChecksum(nl))
		ls = append(ls, l4, payload)
	}
	buf := gopacket.NewSerializeBuffer()
	require.NoError(t, gopacket.SerializeLayers(buf, gopacket.SerializeOptions{ComputeChecksums: true, FixLengths: true}, ls...))
	want = append([]byte(nil), buf.Bytes()...)
	sent = append([]byte(nil), want...)
	p := gopacket.NewPacket(sent, layers.LayerTypeEthernet, gopacket.NoCopy)
	if ip4, ok := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4); ok {
		off := len(sent) - len(ip4.Contents) - len(ip4.Payload)
		binary.BigEndian.PutUint16(sent[off+10:], 0)
	}
	tl := p.TransportLayer()
	l4 = len(sent) - len(tl.LayerContents()) - len(tl.LayerPayload()) + 6
	if tcp {
		l4 += 10
	}
	binary.BigEndian.PutUint16(sent[l4:], 0)
	return sent, want, l4
}

// TestSendChecksum sends frames of every header shape SendChecksum takes
// and checks what a device computing as the 82576 does would put on the
// wire: the checksums gopacket computes. Context descriptors are written
// only when a frame's headers match neither of the two the device holds,
// and take no completion of the caller's.
func TestSendChecksum(t *testing.T) {
	d, f := newFakeDevice(t, Config{Config: nic.Config{QueueSize: 16}})
	fn := newFakeNIC(t, d, f)
	tx := d.tx[0]
	comps := make([]nic.Completion, 16)
	cases := []struct {
		name    string
		v6, tcp bool
		vlan    uint16
		opts    int
		newCtx  bool
		cs      TxChecksum
	}{
		{name: "udp4", cs: TxIPv4 | TxL4, newCtx: true},
		{name: "udp4 again", cs: TxIPv4 | TxL4},
		{name: "tcp4", tcp: true, cs: TxIPv4 | TxL4, newCtx: true},
		{name: "udp4 a third time", cs: TxIPv4 | TxL4},
		{name: "udp6", v6: true, cs: TxL4, newCtx: true},
		{name: "tcp4 still held", tcp: true, cs: TxIPv4 | TxL4},
		{name: "tcp4 ip options", tcp: true, opts: 8, cs: TxIPv4 | TxL4, newCtx: true},
		{name: "udp4 tagged", vlan: 7, cs: TxIPv4 | TxL4, newCtx: true},
		{name: "tcp6 tagged", v6: true, tcp: true, vlan: 7, cs: TxL4, newCtx: true},
		{name: "ip header only (udp4's context)", cs: TxIPv4, newCtx: true},
	}
	for round := 0; round < 3; round++ { // several laps of the 16-slot ring
		for i, c := range cases {
			if round > 0 && i == 0 {
				c.newCtx = false // the last case left udp4's context in place
			}
			sent, want, l4 := csumFrame(t, c.v6, c.tcp, c.vlan, c.opts)
			if c.cs&TxL4 == 0 {
				binary.BigEndian.PutUint16(want[l4:], 0) // left as sent
			}
			orig := append([]byte(nil), sent...)
			tail := tx.tail
			require.NoError(t, tx.SendChecksum(sent, i, c.cs), c.name)
			require.Equal(t, orig, sent, "the caller's frame is not changed")
			used := (tx.tail + tx.n - tail) % tx.n
			if c.newCtx {
				require.EqualValues(t, 2, used, "%s: a context descriptor and the frame's", c.name)
			} else {
				require.EqualValues(t, 1, used, "%s: the contexts the device holds serve", c.name)
			}
			require.Equal(t, 1, tx.Outstanding(), "context descriptors are not the caller's operations")
			require.Zero(t, tx.Poll(comps), "nothing written back yet")
			require.NoError(t, tx.Flush())
			out := fn.transmitOffload()
			require.Len(t, out, 1)
			require.Equal(t, want, out[0], "%s (round %d): the frame on the wire", c.name, round)
			n := tx.Poll(comps)
			require.Equal(t, 1, n, "%s: one completion, the frame's", c.name)
			require.NoError(t, comps[0].Err)
			require.Equal(t, i, comps[0].Context)
			require.Zero(t, tx.Outstanding())
		}
	}
}

// TestSendChecksumErrors: frames the device cannot checksum are refused
// with nic.ErrNotSupported, bad requests with nic.ErrInvalid, and neither
// takes a descriptor.
func TestSendChecksumErrors(t *testing.T) {
	d, _ := newFakeDevice(t, Config{Config: nic.Config{QueueSize: 16}})
	tx := d.tx[0]
	udp4, _, _ := csumFrame(t, false, false, 0, 0)
	udp6, _, _ := csumFrame(t, true, false, 0, 0)
	arp := make([]byte, 60)
	binary.BigEndian.PutUint16(arp[12:], 0x0806)
	icmp := append([]byte(nil), udp4...)
	icmp[14+9] = 1
	short := append([]byte(nil), udp4...)
	binary.BigEndian.PutUint16(short[14+2:], uint16(len(udp4)-14+1)) // IP length beyond the frame
	for _, c := range []struct {
		name  string
		frame []byte
		cs    TxChecksum
		want  error
	}{
		{"arp", arp, TxIPv4, nic.ErrNotSupported},
		{"icmp L4", icmp, TxL4, nic.ErrNotSupported},
		{"ip length beyond frame", short, TxIPv4, nic.ErrNotSupported},
		{"IPv4 checksum of IPv6", udp6, TxIPv4 | TxL4, nic.ErrInvalid},
		{"no checksum asked", udp4, 0, nic.ErrInvalid},
		{"unknown bits", udp4, 1 << 5, nic.ErrInvalid},
		{"short frame", udp4[:10], TxL4, nic.ErrFrameSize},
	} {
		require.ErrorIs(t, tx.SendChecksum(c.frame, nil, c.cs), c.want, c.name)
	}
	require.Zero(t, tx.tail, "no descriptor taken")
	// icmp with the IPv4 header checksum only is fine.
	require.NoError(t, tx.SendChecksum(icmp, nil, TxIPv4))
}

// TestSendChecksumFull: a new context needs two free descriptors; without
// them SendChecksum says ErrFull and posts nothing.
func TestSendChecksumFull(t *testing.T) {
	d, _ := newFakeDevice(t, Config{Config: nic.Config{QueueSize: 16}})
	tx := d.tx[0]
	udp4, _, _ := csumFrame(t, false, false, 0, 0)
	for i := 0; i < 14; i++ {
		require.NoError(t, tx.Send(udp4, nil))
	}
	tail := tx.tail
	require.ErrorIs(t, tx.SendChecksum(udp4, nil, TxL4), nic.ErrFull)
	require.Equal(t, tail, tx.tail)
	require.Equal(t, 14, tx.Outstanding())
}

// TestSendChecksumAllocs: the offload path allocates nothing.
func TestSendChecksumAllocs(t *testing.T) {
	d, f := newFakeDevice(t, Config{Config: nic.Config{QueueSize: 64}})
	fn := newFakeNIC(t, d, f)
	tx := d.tx[0]
	udp4, _, _ := csumFrame(t, false, false, 0, 0)
	comps := make([]nic.Completion, 8)
	allocs := testing.AllocsPerRun(100, func() {
		_ = tx.SendChecksum(udp4, nil, TxIPv4|TxL4)
		_ = tx.Flush()
		fn.tdh = f.get(txReg(regTDT0, 0)) // the device "sent" it
		p := desc(&tx.queue, (fn.tdh+tx.n-1)%tx.n)
		atomic.StoreUint32((*uint32)(unsafe.Add(p, 12)), txdStatusDD)
		for tx.Poll(comps) > 0 {
		}
	})
	require.Zero(t, allocs)
}
