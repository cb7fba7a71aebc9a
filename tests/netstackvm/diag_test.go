package netstackvm

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"

	"github.com/vfnic/vfnic/internal/stackstats"
	"github.com/vfnic/vfnic/netstack"
)

// capture keeps the last frames of the stack's pcap stream (Config.Capture)
// in a ring, so that a stalled transfer can show what went over the wire
// just before and during the stall.
type capture struct {
	mu   sync.Mutex
	hdr  bool
	recs [][]byte
	next int
	n    uint64
}

func newCapture(frames int) *capture { return &capture{recs: make([][]byte, frames)} }

// Write takes one pcap record per call, as gVisor's sniffer writes them
// (the file header first).
func (c *capture) Write(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.hdr {
		c.hdr = true
		return len(b), nil
	}
	r := c.recs[c.next]
	c.recs[c.next] = append(r[:0], b...)
	c.next = (c.next + 1) % len(c.recs)
	c.n++
	return len(b), nil
}

// tail decodes the last n frames: time, direction (tx: from mac), and the
// TCP header fields a stall turns on.
func (c *capture) tail(n int, mac net.HardwareAddr) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var sb strings.Builder
	fmt.Fprintf(&sb, "last %d of %d frames captured:\n", min(n, int(c.n)), c.n)
	for i := min(n, int(c.n), len(c.recs)); i > 0; i-- {
		r := c.recs[(c.next-i+len(c.recs))%len(c.recs)]
		if len(r) < 16 {
			continue
		}
		ts := time.Unix(int64(binary.LittleEndian.Uint32(r[0:])), int64(binary.LittleEndian.Uint32(r[4:]))*1000)
		orig := binary.LittleEndian.Uint32(r[12:])
		fmt.Fprintf(&sb, "  %s len %5d %s\n", ts.Format("15:04:05.000000"), orig, describe(r[16:], mac))
	}
	return sb.String()
}

func describe(f []byte, mac net.HardwareAddr) string {
	if len(f) < header.EthernetMinimumSize {
		return "short"
	}
	eth := header.Ethernet(f)
	dir := "rx"
	if string(eth.SourceAddress()) == string(mac) {
		dir = "tx"
	}
	p := f[header.EthernetMinimumSize:]
	var tp []byte
	var plen int
	switch eth.Type() {
	case header.IPv4ProtocolNumber:
		ip := header.IPv4(p)
		if len(p) < header.IPv4MinimumSize || ip.Protocol() != uint8(header.TCPProtocolNumber) {
			return dir + " ipv4 other"
		}
		hl := int(ip.HeaderLength())
		if len(p) < hl {
			return dir + " ipv4 short"
		}
		tp, plen = p[hl:], int(ip.TotalLength())-hl
	case header.IPv6ProtocolNumber:
		ip := header.IPv6(p)
		if len(p) < header.IPv6MinimumSize {
			return dir + " ipv6 short"
		}
		if ip.TransportProtocol() != header.TCPProtocolNumber {
			return fmt.Sprintf("%s ipv6 next %d", dir, ip.NextHeader())
		}
		tp, plen = p[header.IPv6MinimumSize:], int(ip.PayloadLength())
	case header.ARPProtocolNumber:
		a := header.ARP(p)
		if !a.IsValid() {
			return dir + " arp short"
		}
		return fmt.Sprintf("%s arp op %d who has %v tell %v", dir, a.Op(), net.IP(a.ProtocolAddressTarget()), net.IP(a.ProtocolAddressSender()))
	default:
		return fmt.Sprintf("%s ethertype %#x", dir, eth.Type())
	}
	if len(tp) < header.TCPMinimumSize {
		return dir + " tcp short"
	}
	t := header.TCP(tp)
	off := int(t.DataOffset())
	opts := ""
	if off <= len(tp) && off > header.TCPMinimumSize {
		o := header.ParseTCPOptions(tp[header.TCPMinimumSize:off])
		for _, s := range o.SACKBlocks {
			opts += fmt.Sprintf(" sack %d-%d", s.Start, s.End)
		}
	}
	return fmt.Sprintf("%s %d>%d %-6s seq %d ack %d win %d data %d%s", dir, t.SourcePort(), t.DestinationPort(),
		t.Flags(), t.SequenceNumber(), t.AckNumber(), t.WindowSize(), plen-off, opts)
}

// stackDiag describes the stack: its TCP endpoints (state, RTT, RTO,
// congestion window) and its non-zero counters.
func stackDiag(n *netstack.Net) string {
	var sb strings.Builder
	for _, te := range n.Stack().RegisteredEndpoints() {
		ep, ok := te.(tcpip.Endpoint)
		if !ok {
			continue
		}
		var info tcpip.TCPInfoOption
		if err := ep.GetSockOpt(&info); err != nil {
			continue
		}
		st := tcp.EndpointState(info.State)
		if st == tcp.StateTimeWait || st == tcp.StateListen || st == tcp.StateClose {
			continue
		}
		var snd, rcv int
		if v, err := ep.GetSockOptInt(tcpip.SendQueueSizeOption); err == nil {
			snd = v
		}
		if v, err := ep.GetSockOptInt(tcpip.ReceiveQueueSizeOption); err == nil {
			rcv = v
		}
		id := te.(tcpip.Endpoint).Info().(*stack.TransportEndpointInfo).ID
		fmt.Fprintf(&sb, "  tcp %v:%d-%v:%d %v: rtt %v rttvar %v rto %v cc state %d cwnd %d ssthresh %d reorder %v; send queue %d, receive queue %d\n",
			id.LocalAddress, id.LocalPort, id.RemoteAddress, id.RemotePort, st, info.RTT, info.RTTVar, info.RTO,
			info.CcState, info.SndCwnd, info.SndSsthresh, info.ReorderSeen, snd, rcv)
	}
	sb.WriteString("  stack counters: " + stackstats.NonZero(n.Stack().Stats()) + "\n")
	return sb.String()
}

// linuxDiag is what the guest's Linux says about its TCP sockets and
// counters and the interface's: /proc/net/tcp{,6}, the non-zero TCP and
// IP counters, and the interface's statistics.
func linuxDiag(ifc string) string {
	var sb strings.Builder
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, _ := os.ReadFile(f)
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		for _, l := range lines[min(1, len(lines)):] {
			fs := strings.Fields(l)
			if len(fs) > 4 && fs[3] == "01" { // established
				fmt.Fprintf(&sb, "  linux %s: %s\n", f, strings.Join(fs[:12], " "))
			}
		}
	}
	for _, f := range []string{"/proc/net/netstat", "/proc/net/snmp"} {
		b, _ := os.ReadFile(f)
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		for i := 0; i+1 < len(lines); i += 2 {
			names, vals := strings.Fields(lines[i]), strings.Fields(lines[i+1])
			var nz []string
			for j := 1; j < len(names) && j < len(vals); j++ {
				if vals[j] != "0" {
					nz = append(nz, names[j]+"="+vals[j])
				}
			}
			fmt.Fprintf(&sb, "  linux %s\n", strings.Join(nz, " "))
		}
	}
	b, _ := os.ReadFile("/proc/net/snmp6")
	var nz []string
	for _, l := range strings.Split(string(b), "\n") {
		fs := strings.Fields(l)
		if len(fs) == 2 && fs[1] != "0" && (strings.HasPrefix(fs[0], "Ip6") || strings.HasPrefix(fs[0], "Tcp6") || strings.HasPrefix(fs[0], "Icmp6Out") || strings.HasPrefix(fs[0], "Icmp6In")) {
			nz = append(nz, fs[0]+"="+fs[1])
		}
	}
	fmt.Fprintf(&sb, "  linux snmp6: %s\n", strings.Join(nz, " "))
	if ifc != "" {
		ents, _ := os.ReadDir("/sys/class/net/" + ifc + "/statistics")
		nz = nz[:0]
		for _, e := range ents {
			b, _ := os.ReadFile("/sys/class/net/" + ifc + "/statistics/" + e.Name())
			if v := strings.TrimSpace(string(b)); v != "0" {
				nz = append(nz, e.Name()+"="+v)
			}
		}
		fmt.Fprintf(&sb, "  linux %s: %s\n", ifc, strings.Join(nz, " "))
	}
	return sb.String()
}
