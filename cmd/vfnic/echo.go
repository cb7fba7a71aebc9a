package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/vfnic/vfnic/lcore"
	"github.com/vfnic/vfnic/nic"
)

// parseEchoIP parses -ip: an IPv4 address echo may answer from.
func parseEchoIP(s string) (netip.Addr, error) {
	ip, err := netip.ParseAddr(s)
	if err != nil || !ip.Is4() {
		return netip.Addr{}, fmt.Errorf("%w: -ip needs an IPv4 address, got %q", errUsage, s)
	}
	if why := notHostAddr(ip); why != "" {
		return netip.Addr{}, fmt.Errorf("%w: -ip %v is %s: a host may not answer from it (RFC 1122 3.2.1.3)", errUsage, ip, why)
	}
	return ip, nil
}

// notHostAddr says why the IPv4 address ip cannot be a host's own, as the
// source of the answers echo sends, or "" when it can. A directed
// broadcast cannot be told without the prefix length, which -ip does not
// take; link-local addresses (169.254/16) are ordinary unicast ones.
func notHostAddr(ip netip.Addr) string {
	switch {
	case ip == netip.IPv4Unspecified() || ip.As4()[0] == 0:
		return "an unspecified address (0.0.0.0/8, this host on this network)"
	case ip.IsLoopback():
		return "a loopback address (127.0.0.0/8)"
	case ip.IsMulticast():
		return "a multicast address (224.0.0.0/4)"
	case ip == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return "the limited broadcast address"
	case ip.As4()[0] >= 240:
		return "a reserved address (240.0.0.0/4)"
	}
	return ""
}

func runEcho(ctx context.Context, args []string, o stdio) error {
	fs := newFlags("echo", "-ip ADDR [flags] DEVICE")
	var df deviceFlags
	df.register(fs)
	df.registerQueues(fs, "the NIC spreads flows over them (RSS); each queue answers on the queue pair it received on")
	ipFlag := fs.String("ip", "", "IPv4 unicast address vfnic answers for (ARP, ICMP echo, UDP echo)")
	portsFlag := fs.String("udp-ports", "7", "comma-separated UDP ports whose datagrams are echoed")
	if err := parse(fs, args); err != nil {
		return err
	}
	ip, err := parseEchoIP(*ipFlag)
	if err != nil {
		return err
	}
	ports, err := parsePorts(*portsFlag)
	if err != nil {
		return err
	}
	core, dev, err := df.open(ctx, fs, nic.Config{}, o.err)
	if err != nil {
		return err
	}
	defer core.Close() // after the device
	defer df.cleanup() // after the device
	defer dev.Close()
	ctx, cancel := df.withDuration(ctx)
	defer cancel()
	out := df.human(o)
	describe(out, dev)
	var es []*echoer
	for i := range df.nqueues() {
		e, err := newEchoerOn(dev, ip, i)
		if err != nil {
			return err
		}
		e.ports = ports
		if i > 0 {
			e.echoTally = es[0].echoTally // one set of counters
		}
		es = append(es, e)
	}
	e := es[0]
	where := coreNote(core)
	if len(es) > 1 {
		where = fmt.Sprintf("%d queues, each %s", len(es), where)
	}
	fmt.Fprintf(out, "echo: answering ARP, ICMP echo and UDP on port(s) %s for %s at %s, %s (ready)\n",
		*portsFlag, ip, dev.MAC(), where)
	p := newProgress(out, dev, df.interval, e.counters)
	err = removed(runEchoers(ctx, es, df.cores(core), p), e.rx)
	if serr := p.summary("echo", df.jsonOut(o), e.details()); serr != nil && err == nil {
		err = serr
	}
	switch {
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return nil
	case errors.Is(err, nic.ErrRemoved):
		// Not a failure: the operator gave the NIC back to the kernel.
		fmt.Fprintf(out, "echo: the kernel took %s back (driver unbound); stopped\n", dev.Info().Address)
		return nil
	}
	return err
}

// reflectionPorts are UDP source ports echo never answers: services that
// answer any datagram (RFC 862-868 echo, daytime, qotd, chargen, time)
// would bounce an echo back forever, and the amplification vectors of
// CISA's UDP-based amplification list (DNS, TFTP, portmap, NTP, NetBIOS,
// SNMP, CLDAP, RIP, SSDP, ARD, WS-Discovery, mDNS, CoAP, Ubiquiti
// discovery, memcached) are how spoofed requests turn a reflector into a
// weapon. Port 0 is never a real client.
var reflectionPorts = map[uint16]bool{
	0: true, 7: true, 13: true, 17: true, 19: true, 37: true, 53: true, 69: true, 111: true,
	123: true, 137: true, 161: true, 389: true, 520: true, 1900: true, 3283: true, 3702: true,
	5353: true, 5683: true, 10001: true, 11211: true,
}

// parsePorts reads -udp-ports.
func parsePorts(s string) (map[uint16]bool, error) {
	ports := map[uint16]bool{}
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.ParseUint(strings.TrimSpace(f), 10, 16)
		if err != nil || n == 0 {
			return nil, fmt.Errorf("%w: -udp-ports: %q is not a port number (1-65535)", errUsage, f)
		}
		ports[uint16(n)] = true
	}
	return ports, nil
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

	// ports are the UDP destination ports echoed.
	ports map[uint16]bool

	// The counters, shared by the queues' echoers (-queues) and read by
	// the live line on another core.
	*echoTally
}

// echoTally are echo's counters.
type echoTally struct {
	arps, pings, udps, ignored, refused, txDrops, errs atomic.Uint64
}

// newEchoerOn makes the echoer of queue pair i of dev, answering for ip.
func newEchoerOn(dev nic.Device, ip netip.Addr, i int) (*echoer, error) {
	rx, err := dev.Rx(i)
	if err != nil {
		return nil, err
	}
	tx, err := dev.Tx(i)
	if err != nil {
		return nil, err
	}
	e := newAnswerer(dev.MAC(), ip, map[uint16]bool{7: true})
	e.dev, e.rx, e.tx = dev, rx, tx
	if err := fillRx(rx); err != nil {
		return nil, err
	}
	return e, nil
}

// newAnswerer returns an echoer that builds replies but has no device yet.
func newAnswerer(mac net.HardwareAddr, ip netip.Addr, ports map[uint16]bool) *echoer {
	a4 := ip.As4()
	e := &echoer{mac: mac, ip: net.IP(a4[:]), ports: ports, sbuf: gopacket.NewSerializeBuffer(), echoTally: &echoTally{}}
	e.parser = gopacket.NewDecodingLayerParser(layers.LayerTypeEthernet, &e.eth, &e.arp, &e.ip4, &e.icmp, &e.udp, &e.payload)
	e.parser.IgnoreUnsupported = true
	return e
}

func (e *echoTally) counters() string {
	return fmt.Sprintf("answered arp %d icmp %d udp %d, ignored %d, refused %d, tx drops %d, errors %d",
		e.arps.Load(), e.pings.Load(), e.udps.Load(), e.ignored.Load(), e.refused.Load(), e.txDrops.Load(), e.errs.Load())
}

// details are the counters for the -json summary.
func (e *echoer) details() map[string]any {
	return map[string]any{"ip": e.ip.String(), "answered_arp": e.arps.Load(), "answered_icmp": e.pings.Load(),
		"answered_udp": e.udps.Load(), "ignored": e.ignored.Load(), "refused": e.refused.Load(),
		"tx_drops": e.txDrops.Load(), "errors": e.errs.Load()}
}

// run answers on core until ctx ends or an operation fails. The core
// polls both queues, gives received frames to handle, discards send
// completions (their buffers are free again) and flushes both queues once
// per round.
func (e *echoer) run(ctx context.Context, core *lcore.Core, p *progress) error {
	return runEchoers(ctx, []*echoer{e}, []*lcore.Core{core}, p)
}

// runEchoers runs es[i] on cores[i] until ctx ends or an operation fails.
func runEchoers(ctx context.Context, es []*echoer, cores []*lcore.Core, p *progress) error {
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	for i, e := range es {
		txc := make([]nic.Completion, 256)
		err := cores[i].AddQueue(e.rx, func(_ nic.Queue, batch []nic.Completion) error { return e.handle(batch, txc) })
		if err != nil {
			return err
		}
		if err := cores[i].AddQueue(e.tx, nil); err != nil {
			return err
		}
	}
	return runCores(ctx, stop, cores, p)
}

// handle answers a batch of receive completions and posts their buffers
// again; txc is scratch for reaping sends when the ring is full.
func (e *echoer) handle(comps, txc []nic.Completion) error {
	refill := false
	for i := range comps {
		c := &comps[i]
		if c.Err != nil {
			// The driver already recycled the buffer into its pool
			// (posted again below); a queue the device broke fails
			// the next Flush instead. A buffer canceled because the
			// kernel took the device back is no error of the device's.
			if !errors.Is(c.Err, nic.ErrCanceled) {
				e.errs.Add(1)
			}
			refill = true
			continue
		}
		if reply := e.answer(c.Data); reply != nil {
			e.send(reply, txc)
		}
		if err := e.rx.Repost(c.Buf, nil); err != nil {
			return err
		}
	}
	if refill {
		// Without this, each frame too long for the buffers would
		// leave the ring one buffer shorter until echo went deaf.
		return fillRx(e.rx)
	}
	return nil
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
		e.txDrops.Add(1)
	}
}

// answer returns the reply to frame, or nil when it needs none.
func (e *echoer) answer(frame []byte) []byte {
	if err := e.parser.DecodeLayers(frame, &e.decoded); err != nil && len(e.decoded) == 0 {
		e.ignored.Add(1)
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
	if refuse(e) {
		e.refused.Add(1)
		return nil
	}
	opts := gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}
	ethr := layers.Ethernet{SrcMAC: e.mac, DstMAC: e.eth.SrcMAC, EthernetType: e.eth.EthernetType}
	var err error
	switch {
	case has(layers.LayerTypeARP):
		if e.arp.Operation != layers.ARPRequest || !net.IP(e.arp.DstProtAddress).Equal(e.ip) {
			e.ignored.Add(1)
			return nil
		}
		arp := layers.ARP{AddrType: layers.LinkTypeEthernet, Protocol: layers.EthernetTypeIPv4,
			HwAddressSize: 6, ProtAddressSize: 4, Operation: layers.ARPReply,
			SourceHwAddress: e.mac, SourceProtAddress: e.ip,
			DstHwAddress: e.arp.SourceHwAddress, DstProtAddress: e.arp.SourceProtAddress}
		err = gopacket.SerializeLayers(e.sbuf, opts, &ethr, &arp)
		e.arps.Add(1)
	case has(layers.LayerTypeIPv4) && e.ip4.DstIP.Equal(e.ip) && has(layers.LayerTypeICMPv4):
		if e.icmp.TypeCode.Type() != layers.ICMPv4TypeEchoRequest {
			e.ignored.Add(1)
			return nil
		}
		ip := e.reverseIP()
		icmp := layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeEchoReply, 0), Id: e.icmp.Id, Seq: e.icmp.Seq}
		err = gopacket.SerializeLayers(e.sbuf, opts, &ethr, &ip, &icmp, gopacket.Payload(e.icmp.Payload))
		e.pings.Add(1)
	case has(layers.LayerTypeIPv4) && e.ip4.DstIP.Equal(e.ip) && has(layers.LayerTypeUDP):
		if !e.ports[uint16(e.udp.DstPort)] {
			e.ignored.Add(1)
			return nil
		}
		ip := e.reverseIP()
		udp := layers.UDP{SrcPort: e.udp.DstPort, DstPort: e.udp.SrcPort}
		_ = udp.SetNetworkLayerForChecksum(&ip)
		err = gopacket.SerializeLayers(e.sbuf, opts, &ethr, &ip, &udp, gopacket.Payload(e.udp.Payload))
		e.udps.Add(1)
	default:
		e.ignored.Add(1)
		return nil
	}
	if err != nil {
		e.errs.Add(1)
		return nil
	}
	return e.sbuf.Bytes()
}

// refuse reports a request that must never be answered whatever it asks:
// a reply to a broadcast or multicast source MAC or IPv4 source would go
// to everyone (ff:ff:ff:ff:ff:ff), one to a source no host may have
// (unspecified, loopback, reserved: notHostAddr) comes from a forged or
// broken packet (RFC 1122 3.2.1.3 has a host discard it), and a UDP
// source port in the reflection set would start a loop or an
// amplification.
func refuse(e *echoer) bool {
	if len(e.eth.SrcMAC) == 6 && e.eth.SrcMAC[0]&1 != 0 {
		return true
	}
	for _, d := range e.decoded {
		switch d {
		case layers.LayerTypeIPv4:
			src, ok := netip.AddrFromSlice(e.ip4.SrcIP.To4())
			if !ok || notHostAddr(src) != "" {
				return true
			}
		case layers.LayerTypeUDP:
			if reflectionPorts[uint16(e.udp.SrcPort)] {
				return true
			}
		}
	}
	return false
}

func (e *echoer) reverseIP() layers.IPv4 {
	return layers.IPv4{Version: 4, IHL: 5, TTL: 64, Protocol: e.ip4.Protocol, SrcIP: e.ip, DstIP: e.ip4.SrcIP, Id: e.ip4.Id}
}
