package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/vfnic/vfnic/nic"
)

func runEcho(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlags("echo", "-ip ADDR [flags] PCI-ADDR")
	var df deviceFlags
	df.register(fs)
	ipFlag := fs.String("ip", "", "IPv4 address vfnic answers for (ARP, ICMP echo, UDP echo)")
	if err := parse(fs, args); err != nil {
		return err
	}
	ip, err := netip.ParseAddr(*ipFlag)
	if err != nil || !ip.Is4() {
		return fmt.Errorf("%w: -ip needs an IPv4 address, got %q", errUsage, *ipFlag)
	}
	dev, err := df.openOne(ctx, fs)
	if err != nil {
		return err
	}
	defer dev.Close()
	ctx, cancel := df.withDuration(ctx)
	defer cancel()
	describe(out, dev)
	e, err := newEchoer(dev, ip)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "echo: answering ARP, ICMP echo and UDP for %s at %s (ready)\n", ip, dev.MAC())
	p := newProgress(out, dev, df.interval, e.counters)
	err = e.run(ctx, p)
	p.summary("echo")
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return nil
	}
	return err
}

// echoer answers for one IPv4 address on queue pair 0.
type echoer struct {
	dev nic.Device
	rx  nic.RxQueue
	tx  nic.TxQueue
	mac net.HardwareAddr
	ip  net.IP

	parser  *gopacket.DecodingLayerParser
	eth     layers.Ethernet
	arp     layers.ARP
	ip4     layers.IPv4
	icmp    layers.ICMPv4
	udp     layers.UDP
	payload gopacket.Payload
	decoded []gopacket.LayerType
	sbuf    gopacket.SerializeBuffer

	arps, pings, udps, ignored, txDrops, errs uint64
}

func newEchoer(dev nic.Device, ip netip.Addr) (*echoer, error) {
	rx, err := dev.Rx(0)
	if err != nil {
		return nil, err
	}
	tx, err := dev.Tx(0)
	if err != nil {
		return nil, err
	}
	a4 := ip.As4()
	e := &echoer{dev: dev, rx: rx, tx: tx, mac: dev.MAC(), ip: net.IP(a4[:]), sbuf: gopacket.NewSerializeBuffer()}
	e.parser = gopacket.NewDecodingLayerParser(layers.LayerTypeEthernet, &e.eth, &e.arp, &e.ip4, &e.icmp, &e.udp, &e.payload)
	e.parser.IgnoreUnsupported = true
	if err := fillRx(rx); err != nil {
		return nil, err
	}
	return e, nil
}

func (e *echoer) counters() string {
	return fmt.Sprintf("answered arp %d icmp %d udp %d, ignored %d, tx drops %d, errors %d",
		e.arps, e.pings, e.udps, e.ignored, e.txDrops, e.errs)
}

func (e *echoer) run(ctx context.Context, p *progress) error {
	comps := make([]nic.Completion, 64)
	txc := make([]nic.Completion, 256)
	for {
		n, err := e.rx.SRead(ctx, comps, 1, 100*time.Millisecond)
		if err != nil && !errors.Is(err, nic.ErrTimeout) {
			return err
		}
		for i := range comps[:n] {
			c := &comps[i]
			if c.Err != nil {
				// The driver already recycled the buffer; a queue the
				// device broke fails the next SRead or Flush instead.
				e.errs++
				continue
			}
			if reply := e.answer(c.Data); reply != nil {
				e.send(reply, txc)
			}
			if err := e.rx.Repost(c.Buf, nil); err != nil {
				return err
			}
		}
		if n > 0 {
			if err := e.rx.Flush(); err != nil {
				return err
			}
			if err := e.tx.Flush(); err != nil {
				return err
			}
		}
		reapTx(e.tx, txc)
		p.tick()
	}
}

// minFrame is the shortest Ethernet frame without FCS; shorter replies
// (ARP) are padded, as a NIC's MAC would.
const minFrame = 60

func (e *echoer) send(frame []byte, txc []nic.Completion) {
	if len(frame) < minFrame {
		var pad [minFrame]byte
		frame = pad[:copy(pad[:], frame)+minFrame-len(frame)]
	}
	err := e.tx.Send(frame, nil)
	if errors.Is(err, nic.ErrFull) {
		_ = e.tx.Flush()
		reapTx(e.tx, txc)
		err = e.tx.Send(frame, nil)
	}
	if err != nil {
		e.txDrops++
	}
}

// answer returns the reply to frame, or nil when it needs none.
func (e *echoer) answer(frame []byte) []byte {
	if err := e.parser.DecodeLayers(frame, &e.decoded); err != nil && len(e.decoded) == 0 {
		e.ignored++
		return nil
	}
	has := func(t gopacket.LayerType) bool {
		for _, d := range e.decoded {
			if d == t {
				return true
			}
		}
		return false
	}
	opts := gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}
	ethr := layers.Ethernet{SrcMAC: e.mac, DstMAC: e.eth.SrcMAC, EthernetType: e.eth.EthernetType}
	var err error
	switch {
	case has(layers.LayerTypeARP):
		if e.arp.Operation != layers.ARPRequest || !net.IP(e.arp.DstProtAddress).Equal(e.ip) {
			e.ignored++
			return nil
		}
		arp := layers.ARP{AddrType: layers.LinkTypeEthernet, Protocol: layers.EthernetTypeIPv4,
			HwAddressSize: 6, ProtAddressSize: 4, Operation: layers.ARPReply,
			SourceHwAddress: e.mac, SourceProtAddress: e.ip,
			DstHwAddress: e.arp.SourceHwAddress, DstProtAddress: e.arp.SourceProtAddress}
		err = gopacket.SerializeLayers(e.sbuf, opts, &ethr, &arp)
		e.arps++
	case has(layers.LayerTypeIPv4) && e.ip4.DstIP.Equal(e.ip) && has(layers.LayerTypeICMPv4):
		if e.icmp.TypeCode.Type() != layers.ICMPv4TypeEchoRequest {
			e.ignored++
			return nil
		}
		ip := e.reverseIP()
		icmp := layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeEchoReply, 0), Id: e.icmp.Id, Seq: e.icmp.Seq}
		err = gopacket.SerializeLayers(e.sbuf, opts, &ethr, &ip, &icmp, gopacket.Payload(e.icmp.Payload))
		e.pings++
	case has(layers.LayerTypeIPv4) && e.ip4.DstIP.Equal(e.ip) && has(layers.LayerTypeUDP):
		ip := e.reverseIP()
		udp := layers.UDP{SrcPort: e.udp.DstPort, DstPort: e.udp.SrcPort}
		_ = udp.SetNetworkLayerForChecksum(&ip)
		err = gopacket.SerializeLayers(e.sbuf, opts, &ethr, &ip, &udp, gopacket.Payload(e.udp.Payload))
		e.udps++
	default:
		e.ignored++
		return nil
	}
	if err != nil {
		e.errs++
		return nil
	}
	return e.sbuf.Bytes()
}

func (e *echoer) reverseIP() layers.IPv4 {
	return layers.IPv4{Version: 4, IHL: 5, TTL: 64, Protocol: e.ip4.Protocol, SrcIP: e.ip, DstIP: e.ip4.SrcIP, Id: e.ip4.Id}
}
