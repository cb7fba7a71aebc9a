package netstack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"sync/atomic"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/qdisc/fifo"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/icmp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"

	"github.com/vfnic/vfnic/lcore"
	"github.com/vfnic/vfnic/nic"
)

// nicID is the stack's one NIC.
const nicID tcpip.NICID = 1

// DefaultQueueLen is the least default length of the qdisc queue of each
// transmit queue, in packets (Linux's txqueuelen). The default is longer
// where one TCP connection's send buffer holds more full-sized packets
// (Config.QueueLen).
const DefaultQueueLen = 1000

// Route sends packets for Dst through Gateway (an on-link route when
// Gateway is the zero Addr).
type Route struct {
	Dst     netip.Prefix
	Gateway netip.Addr
}

// BufferSizes is a TCP buffer size range in bytes; zero fields keep
// gVisor's values (min 4 KiB, default 1 MiB, max 4 MiB).
type BufferSizes struct {
	Min, Default, Max int
}

// Config says how a Net is set up on a device.
type Config struct {
	// Addrs are the static addresses with their prefix lengths (IPv4 and
	// IPv6); each prefix also becomes an on-link route. An IPv6
	// link-local address derived from the MAC is added as Linux does.
	Addrs []netip.Prefix
	// Gateway4 and Gateway6 are the default gateways (zero: none).
	Gateway4, Gateway6 netip.Addr
	// Routes are further routes.
	Routes []Route

	// CPUs pins the polling core of queue pair i to CPUs[i]; pairs beyond
	// its length (all, when empty) run on a core locked to a thread but
	// not pinned (lcore.AnyCPU).
	CPUs []int
	// Mode is the polling cores' mode; the zero value is lcore.Adaptive.
	Mode lcore.Mode
	// QueueLen is the qdisc queue length per transmit queue in packets.
	// 0 means room for a whole send buffer of one TCP connection
	// (TCPSendBuffer.Max, 4 MiB unless set) in packets of the MTU, and
	// at least DefaultQueueLen: gVisor has no TCP Small Queues, so a
	// connection puts its whole congestion window in the queue at once,
	// and a queue shorter than that drops a burst of its own packets,
	// the loss that sets off the crawl of RACK recovery (package doc).
	QueueLen int
	// CoreTransmit has the polling core of each queue pair write the
	// packets of its transmit queue, in its rounds beside the frames it
	// receives: a sender queues a packet and wakes the core if the queue
	// was empty, in place of gVisor's fifo qdisc and its dispatcher
	// goroutine per transmit queue (one hand-off fewer per burst).
	CoreTransmit bool

	// TCPSendBuffer and TCPReceiveBuffer set TCP's buffer ranges.
	TCPSendBuffer, TCPReceiveBuffer BufferSizes
	// DisableRACK turns off RACK loss detection, which is on by default
	// (with SACK, which RACK needs): RACK recovers losses faster, but
	// gVisor's crawls at two segments per retransmission timeout after
	// some burst losses (package doc), which turning it off avoids.
	DisableRACK bool

	// NoRxChecksumOffload and NoTxChecksumOffload turn off the checksum
	// offloads of a device that has them (nic/igb): by default the stack
	// skips verifying the TCP, UDP and IPv4 header checksums the device
	// verified (it verifies those of every other frame, fragments
	// included), and leaves TCP and UDP checksums for the device to fill
	// in. Over IPv6, a UDP datagram the stack fragments goes out with
	// its checksum left at zero, which receivers drop (no device sums
	// across fragments): turn transmit offload off where UDP datagrams
	// exceed the MTU over IPv6. Net.Offloads says what is in use.
	NoRxChecksumOffload, NoTxChecksumOffload bool
	// GSO turns on generic segmentation offload: TCP builds segments of
	// up to 64 KiB, which the stack cuts into MSS-sized packets just
	// before they reach the device (gVisor's software GSO, as Linux's
	// GSO for a device without TSO), so that its sender runs once per
	// 64 KiB instead of once per packet; the packets on the wire are
	// the same. It is off by default: it made the crawl of gVisor's RACK
	// recovery more frequent under CPU starvation (package doc).
	GSO bool
	// NoGRO turns off generic receive offload, on by default: each
	// receive queue coalesces the in-order TCP segments of a flow that
	// arrive in one batch into one packet of up to 64 KiB before the
	// stack processes it (gVisor's GRO, as Linux's), so that TCP's
	// receive path runs once per burst instead of once per packet. The
	// endpoint verifies the checksums of what it coalesces (the stack
	// does not check them again).
	NoGRO bool

	// DropEvery, for tests, drops every DropEvery-th frame received and
	// every DropEvery-th frame sent in the endpoint (0: none), to make
	// TCP recover losses through a real NIC. SetDropEvery changes it.
	DropEvery int

	// Capture, if set, receives every frame the device received and
	// every frame posted to it, in pcap format (Ethernet link type), cut
	// to CaptureSnapLen bytes (0: 128), for debugging: one Write per
	// frame, under a lock the receive and transmit paths share. The first
	// Write error stops the capture (Stats.CaptureErr).
	Capture        io.Writer
	CaptureSnapLen int
}

// Stats are the endpoint's frame counters.
type Stats struct {
	// RxFrames were delivered to the stack; RxDropped dropped (too short,
	// no stack attached, or DropEvery); RxErrors were error completions.
	RxFrames, RxDropped, RxErrors uint64
	// TxFrames were posted to the device; TxDropped were not (a full ring
	// after waiting, oversized, a closed device, or DropEvery).
	TxFrames, TxDropped uint64
	// RxChecksumDevice counts frames delivered with checksums the device
	// verified; RxChecksumBad those it found wrong (the stack drops them
	// and counts them in its own checksum error counters).
	// TxChecksumDevice counts frames whose checksum the device filled in.
	RxChecksumDevice, RxChecksumBad, TxChecksumDevice uint64
	// Cores are the polling cores' counters, one per queue pair.
	Cores []lcore.Stats
	// CaptureErr is the error that stopped Config.Capture, if one did.
	CaptureErr error
}

// Net is gVisor's TCP/IP stack on a nic.Device, with the listen and dial
// functions of package net. Create it with New; Close stops it.
type Net struct {
	dev   nic.Device
	ep    *endpoint
	stack *stack.Stack
	cores []*lcore.Core // appended under coresMu while New runs; fixed after

	coresMu sync.Mutex

	once    sync.Once
	cause   atomic.Pointer[error] // why the Net stopped, once it has
	done    chan struct{}
	watched sync.WaitGroup
}

// ErrNotIPLiteral means an address named a host rather than an IP
// address: the Net resolves no names.
var ErrNotIPLiteral = errors.New("netstack: address is not an IP literal (no name resolution)")

// New runs a TCP/IP stack on dev, which must be open and whose queues
// nothing else uses: it posts every receive buffer, starts one polling
// core per queue pair and attaches the stack. The device stays the
// caller's: close it after the Net. If the kernel takes the device back,
// the Net stops by itself: its connections fail with errors that match
// nic.ErrRemoved, and Done is closed.
func New(dev nic.Device, cfg Config) (*Net, error) {
	if dev == nil {
		return nil, fmt.Errorf("%w: netstack: nil device", os.ErrInvalid)
	}
	if cfg.QueueLen < 0 || cfg.DropEvery < 0 {
		return nil, fmt.Errorf("%w: netstack: negative QueueLen or DropEvery", os.ErrInvalid)
	}
	ep, err := newEndpoint(dev, cfg.DropEvery, cfg.NoRxChecksumOffload, cfg.NoTxChecksumOffload, !cfg.GSO, cfg.NoGRO)
	if err != nil {
		return nil, err
	}
	s := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, ipv6.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol, icmp.NewProtocol4, icmp.NewProtocol6},
		HandleLocal:        true,
	})
	n := &Net{dev: dev, ep: ep, stack: s, done: make(chan struct{})}
	fail := func(err error) (*Net, error) {
		for _, c := range n.cores {
			_ = c.Close()
		}
		s.Destroy()
		return nil, err
	}
	sndMax, err := n.configureTCP(cfg)
	if err != nil {
		return fail(err)
	}
	if cfg.QueueLen == 0 {
		cfg.QueueLen = defaultQueueLen(sndMax, int(ep.mtu))
	}
	ep.closed = n.wakeCores
	if cfg.Capture != nil {
		ep.capture = newPcap(cfg.Capture, cfg.CaptureSnapLen)
	}
	var qd stack.QueueingDiscipline
	if cfg.CoreTransmit {
		for i := range ep.tx {
			ep.tx[i].qlen = cfg.QueueLen
		}
		qd = coreQDisc{ep}
	} else {
		qd = fifo.New(ep, len(ep.tx), cfg.QueueLen)
	}
	if terr := s.CreateNICWithOptions(nicID, ep, stack.NICOptions{QDisc: qd}); terr != nil {
		qd.Close()
		return fail(fmt.Errorf("netstack: create NIC: %s", terr))
	}
	if err := n.configureAddrs(cfg); err != nil {
		return fail(err)
	}
	for i := range ep.rx {
		r := &ep.rx[i]
		if err := fill(r.q); err != nil {
			return fail(err)
		}
		cpu := lcore.AnyCPU
		if i < len(cfg.CPUs) {
			cpu = cfg.CPUs[i]
		}
		core, err := lcore.New(lcore.Config{CPU: cpu, Mode: cfg.Mode})
		if err != nil {
			return fail(err)
		}
		n.coresMu.Lock()
		n.cores = append(n.cores, core)
		n.coresMu.Unlock()
		if err := core.AddQueue(r.q, r.handle); err != nil {
			return fail(err)
		}
		if cfg.CoreTransmit {
			t := &ep.tx[i]
			if err := core.AddFunc(func() (int, error) { return ep.drain(t) }); err != nil {
				return fail(err)
			}
			t.core.Store(core)
		}
		if err := core.Start(context.Background()); err != nil {
			return fail(err)
		}
	}
	for i, c := range n.cores {
		n.watched.Add(1)
		go n.watch(c, ep.rx[i].q)
	}
	return n, nil
}

// fill posts every free receive buffer of q.
func fill(q nic.RxQueue) error {
	for {
		err := q.PostRecv(nil)
		if errors.Is(err, nic.ErrFull) {
			break
		}
		if err != nil {
			return fmt.Errorf("netstack: post receive buffers: %w", err)
		}
	}
	if err := q.Flush(); err != nil {
		return fmt.Errorf("netstack: post receive buffers: %w", err)
	}
	return nil
}

// wakeCores makes each polling core run a round, in which a core whose
// queues were closed stops.
func (n *Net) wakeCores() {
	n.coresMu.Lock()
	defer n.coresMu.Unlock()
	for _, c := range n.cores {
		_ = c.Wake()
	}
}

// watch stops the Net when a polling core stops by itself: the device
// failed or was taken back.
func (n *Net) watch(c *lcore.Core, q nic.RxQueue) {
	defer n.watched.Done()
	err := c.Wait(context.Background())
	if n.cause.Load() != nil {
		return // Close stopped it
	}
	// The core reports what failed first (often the interrupt eventfd
	// the removal closed); the queue says why.
	if qerr := q.Flush(); qerr != nil && !errors.Is(err, nic.ErrRemoved) {
		err = errors.Join(qerr, err)
	}
	if err == nil {
		err = nic.ErrClosed
	}
	n.stop(fmt.Errorf("netstack: device stopped: %w", err))
}

// configureTCP sets TCP's options from cfg and returns the largest send
// buffer a connection may have.
func (n *Net) configureTCP(cfg Config) (sndMax int, err error) {
	set := func(opt tcpip.SettableTransportProtocolOption) error {
		if terr := n.stack.SetTransportProtocolOption(tcp.ProtocolNumber, opt); terr != nil {
			return fmt.Errorf("%w: netstack: TCP option %T: %s", os.ErrInvalid, opt, terr)
		}
		return nil
	}
	sack := tcpip.TCPSACKEnabled(true)
	if err := set(&sack); err != nil {
		return 0, err
	}
	rec := tcpip.TCPRACKLossDetection
	if cfg.DisableRACK {
		rec = 0
	}
	if err := set(&rec); err != nil {
		return 0, err
	}
	mod := tcpip.TCPModerateReceiveBufferOption(true)
	if err := set(&mod); err != nil {
		return 0, err
	}
	var snd tcpip.TCPSendBufferSizeRangeOption
	if terr := n.stack.TransportProtocolOption(tcp.ProtocolNumber, &snd); terr != nil {
		return 0, fmt.Errorf("netstack: %s", terr)
	}
	merge(&snd.Min, &snd.Default, &snd.Max, cfg.TCPSendBuffer)
	if err := set(&snd); err != nil {
		return 0, err
	}
	var rcv tcpip.TCPReceiveBufferSizeRangeOption
	if terr := n.stack.TransportProtocolOption(tcp.ProtocolNumber, &rcv); terr != nil {
		return 0, fmt.Errorf("netstack: %s", terr)
	}
	merge(&rcv.Min, &rcv.Default, &rcv.Max, cfg.TCPReceiveBuffer)
	return snd.Max, set(&rcv)
}

// defaultQueueLen is Config.QueueLen's default: a send buffer of sndMax
// bytes in the smallest full-sized TCP packets of the MTU (IPv6 and TCP
// headers with timestamps take 72 bytes; 80 leaves room for SACK
// blocks), with a few packets over for the ACKs and datagrams of other
// flows.
func defaultQueueLen(sndMax, mtu int) int {
	const headers, others = 80, 64
	if mtu <= headers {
		return DefaultQueueLen
	}
	return max(DefaultQueueLen, (sndMax+mtu-headers-1)/(mtu-headers)+others)
}

func merge(lo, def, hi *int, b BufferSizes) {
	if b.Min > 0 {
		*lo = b.Min
	}
	if b.Default > 0 {
		*def = b.Default
	}
	if b.Max > 0 {
		*hi = b.Max
	}
}

func (n *Net) configureAddrs(cfg Config) error {
	ll := netip.PrefixFrom(netip.AddrFrom16(header.LinkLocalAddr(n.ep.mac).As16()), 64)
	addrs := append([]netip.Prefix{ll}, cfg.Addrs...)
	for _, p := range addrs {
		if !p.IsValid() {
			return fmt.Errorf("%w: netstack: address %v", os.ErrInvalid, p)
		}
		a := p.Addr().Unmap()
		proto := ipv4.ProtocolNumber
		if a.Is6() {
			proto = ipv6.ProtocolNumber
		}
		awp := tcpip.AddressWithPrefix{Address: tcpip.AddrFromSlice(a.AsSlice()), PrefixLen: p.Bits()}
		if terr := n.stack.AddProtocolAddress(nicID, tcpip.ProtocolAddress{Protocol: proto, AddressWithPrefix: awp}, stack.AddressProperties{}); terr != nil {
			return fmt.Errorf("%w: netstack: address %v: %s", os.ErrInvalid, p, terr)
		}
		n.stack.AddRoute(tcpip.Route{Destination: awp.Subnet(), NIC: nicID})
	}
	routes := cfg.Routes
	if cfg.Gateway4.IsValid() {
		routes = append(routes, Route{Dst: netip.PrefixFrom(netip.IPv4Unspecified(), 0), Gateway: cfg.Gateway4})
	}
	if cfg.Gateway6.IsValid() {
		routes = append(routes, Route{Dst: netip.PrefixFrom(netip.IPv6Unspecified(), 0), Gateway: cfg.Gateway6})
	}
	for _, r := range routes {
		if !r.Dst.IsValid() {
			return fmt.Errorf("%w: netstack: route to %v", os.ErrInvalid, r.Dst)
		}
		d := r.Dst.Masked()
		sub, err := tcpip.NewSubnet(tcpip.AddrFromSlice(d.Addr().AsSlice()), tcpip.MaskFromBytes(net.CIDRMask(d.Bits(), d.Addr().BitLen())))
		if err != nil {
			return fmt.Errorf("%w: netstack: route to %v: %v", os.ErrInvalid, r.Dst, err)
		}
		rt := tcpip.Route{Destination: sub, NIC: nicID}
		if r.Gateway.IsValid() {
			if r.Gateway.Is4() != d.Addr().Is4() {
				return fmt.Errorf("%w: netstack: route to %v through %v", os.ErrInvalid, r.Dst, r.Gateway)
			}
			rt.Gateway = tcpip.AddrFromSlice(r.Gateway.AsSlice())
		}
		n.stack.AddRoute(rt)
	}
	return nil
}

// Stack is the underlying gVisor stack, for settings this package does
// not cover.
func (n *Net) Stack() *stack.Stack { return n.stack }

// Stats returns the endpoint's frame counters.
func (n *Net) Stats() Stats {
	e := n.ep
	st := Stats{
		RxFrames: e.rxFrames.Load(), RxDropped: e.rxDropped.Load(), RxErrors: e.rxErrors.Load(),
		TxFrames: e.txFrames.Load(), TxDropped: e.txDropped.Load(),
		RxChecksumDevice: e.rxCsumDevice.Load(), RxChecksumBad: e.rxCsumBad.Load(),
		TxChecksumDevice: e.txCsumDevice.Load(),
	}
	if e.capture != nil {
		st.CaptureErr = e.capture.error()
	}
	n.coresMu.Lock()
	for _, c := range n.cores {
		st.Cores = append(st.Cores, c.Stats())
	}
	n.coresMu.Unlock()
	return st
}

// Offloads are the offloads a Net uses (Net.Offloads).
type Offloads struct {
	// RxChecksum: the device's receive checksum verdicts are used.
	// TxChecksum: the device fills in TCP and UDP checksums.
	RxChecksum, TxChecksum bool
	// GSO: TCP segments are cut into packets just before the link
	// (Config.GSO). GRO: received TCP segments are coalesced
	// (Config.NoGRO).
	GSO, GRO bool
}

// Offloads says which offloads the Net uses.
func (n *Net) Offloads() Offloads {
	return Offloads{RxChecksum: n.ep.rxOffload, TxChecksum: n.ep.txOffload, GSO: n.ep.gso, GRO: n.ep.gro}
}

// SetDropEvery, for tests, makes the endpoint drop every k-th frame it
// receives and every k-th it sends (0: none; see Config.DropEvery).
func (n *Net) SetDropEvery(k int) { n.ep.dropEvery.Store(uint64(max(k, 0))) }

// MTU is the link MTU: the device's frame size less the Ethernet header
// and VLAN tags (nic.FrameOverhead), capped by the device's MTU.
func (n *Net) MTU() int { return int(n.ep.mtu) }

// Done is closed once the Net has stopped (Close, or the device failing
// or being taken back); Err then says why.
func (n *Net) Done() <-chan struct{} { return n.done }

// Err is nil while the Net runs, then why it stopped: an error matching
// net.ErrClosed after Close, nic.ErrRemoved when the kernel took the
// device back.
func (n *Net) Err() error {
	if p := n.cause.Load(); p != nil {
		return *p
	}
	return nil
}

// Close stops the stack: listeners and connections fail with errors that
// match net.ErrClosed, the polling cores stop and every goroutine of the
// Net ends before Close returns. The device stays open (it is the
// caller's). Close is safe to call more than once.
func (n *Net) Close() error {
	n.stop(fmt.Errorf("netstack: %w", net.ErrClosed))
	n.watched.Wait()
	<-n.done
	return nil
}

// stop tears the stack down once, recording cause first so that the
// errors of the connections it aborts carry it.
func (n *Net) stop(cause error) {
	n.once.Do(func() {
		n.cause.Store(&cause)
		// Aborting the endpoints wakes every blocked Accept, Read and
		// Write (and sends resets while the device still works).
		n.stack.Close()
		for _, c := range n.cores {
			_ = c.Close() // the device's error is already the cause
		}
		// Removing the NIC stops the qdisc's dispatchers.
		_ = n.stack.RemoveNIC(nicID)
		n.stack.Wait()
		close(n.done)
	})
}

// wrap gives the error of an operation on a stopped Net its cause.
func (n *Net) wrap(err error) error {
	if err == nil || err == io.EOF {
		return err
	}
	// gonet's timeout is its own type: give deadlines the standard
	// library's error, as *net.TCPConn does.
	if oe, ok := err.(*net.OpError); ok && oe.Timeout() && !errors.Is(err, os.ErrDeadlineExceeded) {
		c := *oe
		c.Err = os.ErrDeadlineExceeded
		return &c
	}
	if p := n.cause.Load(); p != nil && !errors.Is(err, *p) {
		return fmt.Errorf("%w (%v)", *p, err)
	}
	return err
}

// fullAddr converts an address for the stack and says which network
// protocol it belongs to; an unspecified address with dual set listens
// on IPv6 and, v4-mapped, IPv4.
func fullAddr(ap netip.AddrPort, v6 bool) (tcpip.FullAddress, tcpip.NetworkProtocolNumber) {
	a := ap.Addr()
	fa := tcpip.FullAddress{NIC: nicID, Port: ap.Port()}
	if a.Is4In6() {
		a = a.Unmap()
	}
	switch {
	case !a.IsValid() || a.IsUnspecified():
		if v6 || a.Is6() {
			return fa, ipv6.ProtocolNumber
		}
		return fa, ipv4.ProtocolNumber
	case a.Is4():
		fa.Addr = tcpip.AddrFromSlice(a.AsSlice())
		return fa, ipv4.ProtocolNumber
	default:
		fa.Addr = tcpip.AddrFromSlice(a.AsSlice())
		return fa, ipv6.ProtocolNumber
	}
}

// parse splits a "host:port" of network into an address, with the
// network's family rules: "tcp4" and "udp4" only IPv4, "tcp6" and "udp6"
// only IPv6; an empty host is the unspecified address of the family
// ("tcp": IPv6 with IPv4 mapped in).
func parse(network, address string) (ap netip.AddrPort, kind string, v6 bool, err error) {
	var fam byte
	switch network {
	case "tcp", "udp":
		kind = network
	case "tcp4", "udp4", "tcp6", "udp6":
		kind, fam = network[:3], network[3]
	default:
		return ap, "", false, net.UnknownNetworkError(network)
	}
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return ap, "", false, err
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return ap, "", false, fmt.Errorf("%w: netstack: port %q", os.ErrInvalid, port)
	}
	var a netip.Addr
	if host != "" {
		if a, err = netip.ParseAddr(host); err != nil {
			return ap, "", false, fmt.Errorf("%w: %q", ErrNotIPLiteral, host)
		}
		a = a.WithZone("")
	}
	switch {
	case fam == '4' && a.IsValid() && !a.Unmap().Is4(), fam == '6' && a.Is4():
		return ap, "", false, fmt.Errorf("%w: netstack: %s address %v", os.ErrInvalid, network, a)
	}
	return netip.AddrPortFrom(a, uint16(p)), kind, fam != '4', nil
}

// Listen announces on the local address: network "tcp", "tcp4" or
// "tcp6", address "host:port" with an IP literal or an empty host. It
// returns a *TCPListener.
func (n *Net) Listen(network, address string) (net.Listener, error) {
	ap, kind, v6, err := parse(network, address)
	if err != nil {
		return nil, &net.OpError{Op: "listen", Net: network, Err: err}
	}
	if kind != "tcp" {
		return nil, &net.OpError{Op: "listen", Net: network, Err: net.UnknownNetworkError(network)}
	}
	return n.listenTCP(ap, v6)
}

// ListenTCP announces on addr (a nil addr or nil IP: every address, IPv4
// and IPv6).
func (n *Net) ListenTCP(addr *net.TCPAddr) (*TCPListener, error) {
	var ap netip.AddrPort
	if addr != nil {
		ap = addr.AddrPort()
	}
	return n.listenTCP(ap, true)
}

// ListenTCPAddrPort announces on addr.
func (n *Net) ListenTCPAddrPort(addr netip.AddrPort) (*TCPListener, error) {
	return n.listenTCP(addr, true)
}

func (n *Net) listenTCP(ap netip.AddrPort, v6 bool) (*TCPListener, error) {
	if err := n.Err(); err != nil {
		return nil, &net.OpError{Op: "listen", Net: "tcp", Err: err}
	}
	fa, proto := fullAddr(ap, v6)
	l, err := gonet.ListenTCP(n.stack, fa, proto)
	if err != nil {
		return nil, n.wrap(err)
	}
	return &TCPListener{l: l, n: n}, nil
}

// ListenPacket listens on the local address: network "udp", "udp4" or
// "udp6". It returns a *UDPConn.
func (n *Net) ListenPacket(network, address string) (net.PacketConn, error) {
	ap, kind, v6, err := parse(network, address)
	if err != nil {
		return nil, &net.OpError{Op: "listen", Net: network, Err: err}
	}
	if kind != "udp" {
		return nil, &net.OpError{Op: "listen", Net: network, Err: net.UnknownNetworkError(network)}
	}
	return n.listenUDP(ap, v6)
}

// ListenUDP listens on addr (nil or a nil IP: every address).
func (n *Net) ListenUDP(addr *net.UDPAddr) (*UDPConn, error) {
	var ap netip.AddrPort
	if addr != nil {
		ap = addr.AddrPort()
	}
	return n.listenUDP(ap, true)
}

// ListenUDPAddrPort listens on addr.
func (n *Net) ListenUDPAddrPort(addr netip.AddrPort) (*UDPConn, error) {
	return n.listenUDP(addr, true)
}

func (n *Net) listenUDP(ap netip.AddrPort, v6 bool) (*UDPConn, error) {
	if err := n.Err(); err != nil {
		return nil, &net.OpError{Op: "listen", Net: "udp", Err: err}
	}
	fa, proto := fullAddr(ap, v6)
	c, err := gonet.DialUDP(n.stack, &fa, nil, proto)
	if err != nil {
		return nil, n.wrap(err)
	}
	return &UDPConn{UDPConn: c, n: n}, nil
}

// Dial is DialContext with a background context.
func (n *Net) Dial(network, address string) (net.Conn, error) {
	return n.DialContext(context.Background(), network, address)
}

// DialContext connects to address ("host:port", host an IP literal) on
// network "tcp", "tcp4", "tcp6", "udp", "udp4" or "udp6". A TCP dial
// ends when ctx does, with ctx's error. It returns a *TCPConn or a
// *UDPConn.
func (n *Net) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	ap, kind, _, err := parse(network, address)
	if err == nil && !ap.Addr().IsValid() {
		err = fmt.Errorf("%w: netstack: no host to dial in %q", os.ErrInvalid, address)
	}
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: network, Err: err}
	}
	if err := n.Err(); err != nil {
		return nil, &net.OpError{Op: "dial", Net: network, Err: err}
	}
	fa, proto := fullAddr(ap, false)
	if kind == "udp" {
		c, err := gonet.DialUDP(n.stack, nil, &fa, proto)
		if err != nil {
			return nil, n.wrap(err)
		}
		return &UDPConn{UDPConn: c, n: n}, nil
	}
	c, err := gonet.DialContextTCP(ctx, n.stack, fa, proto)
	if err != nil {
		if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
			err = &net.OpError{Op: "dial", Net: network, Err: fmt.Errorf("%w (%v)", ctx.Err(), err)}
		}
		return nil, n.wrap(err)
	}
	return &TCPConn{TCPConn: c, n: n}, nil
}

// TCPListener is a TCP listener on a Net (a net.Listener).
type TCPListener struct {
	l *gonet.TCPListener
	n *Net
}

// Accept waits for the next connection and returns a *TCPConn.
func (l *TCPListener) Accept() (net.Conn, error) {
	c, err := l.l.Accept()
	if err != nil {
		return nil, l.n.wrap(err)
	}
	return &TCPConn{TCPConn: c.(*gonet.TCPConn), n: l.n}, nil
}

// Close stops listening.
func (l *TCPListener) Close() error { return l.l.Close() }

// Addr is the listening address.
func (l *TCPListener) Addr() net.Addr { return l.l.Addr() }

// TCPConn is a TCP connection on a Net (a net.Conn with deadlines). Once
// the Net stops, its errors carry the reason (Net.Err).
type TCPConn struct {
	*gonet.TCPConn
	n *Net
}

// Read implements net.Conn.
func (c *TCPConn) Read(b []byte) (int, error) {
	k, err := c.TCPConn.Read(b)
	return k, c.n.wrap(err)
}

// Write implements net.Conn.
func (c *TCPConn) Write(b []byte) (int, error) {
	k, err := c.TCPConn.Write(b)
	return k, c.n.wrap(err)
}

// UDPConn is a UDP socket on a Net (a net.PacketConn and net.Conn with
// deadlines). Once the Net stops, its errors carry the reason.
type UDPConn struct {
	*gonet.UDPConn
	n *Net
}

// ReadFrom implements net.PacketConn.
func (c *UDPConn) ReadFrom(b []byte) (int, net.Addr, error) {
	k, a, err := c.UDPConn.ReadFrom(b)
	return k, a, c.n.wrap(err)
}

// WriteTo implements net.PacketConn.
func (c *UDPConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	k, err := c.UDPConn.WriteTo(b, addr)
	return k, c.n.wrap(err)
}

// Read implements net.Conn.
func (c *UDPConn) Read(b []byte) (int, error) {
	k, err := c.UDPConn.Read(b)
	return k, c.n.wrap(err)
}

// Write implements net.Conn.
func (c *UDPConn) Write(b []byte) (int, error) {
	k, err := c.UDPConn.Write(b)
	return k, c.n.wrap(err)
}
