package main

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

// textWriter prints one line per frame, as tcpdump -n does: the time,
// the VLAN tags, then the protocol, addresses, ports and length of what
// the frame carries. It decodes each frame, which allocates: it is for a
// person reading, not for line rate (write a pcap with -w for that).
type textWriter struct {
	w *bufio.Writer
}

func (t *textWriter) write(ts time.Time, data []byte, length int) error {
	line := frameLine(data, length)
	_, err := fmt.Fprintf(t.w, "%s %s\n", ts.Format("15:04:05.000000"), line)
	return err
}

// frameLine describes a frame (data, cut at the snap length, of a frame
// of length bytes) in tcpdump's words.
func frameLine(data []byte, length int) string {
	p := gopacket.NewPacket(data, layers.LayerTypeEthernet, gopacket.DecodeOptions{NoCopy: true})
	eth, _ := p.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
	if eth == nil {
		return fmt.Sprintf("[|ether], length %d", length)
	}
	var b strings.Builder
	hdr := 14 // link-layer header bytes, tags included
	for _, l := range p.Layers() {
		if tag, ok := l.(*layers.Dot1Q); ok {
			fmt.Fprintf(&b, "vlan %d, p %d, ", tag.VLANIdentifier, tag.Priority)
			hdr += 4
		}
	}
	var src, dst string
	switch ip := p.NetworkLayer().(type) {
	case *layers.IPv4:
		b.WriteString("IP ")
		src, dst = ip.SrcIP.String(), ip.DstIP.String()
		if ip.FragOffset != 0 {
			fmt.Fprintf(&b, "%s > %s: ip-proto-%d, fragment offset %d, length %d", src, dst, ip.Protocol, int(ip.FragOffset)*8, len(ip.Payload))
			return b.String()
		}
	case *layers.IPv6:
		b.WriteString("IP6 ")
		src, dst = ip.SrcIP.String(), ip.DstIP.String()
	default:
		if arp, ok := p.Layer(layers.LayerTypeARP).(*layers.ARP); ok {
			sender, target := net.IP(arp.SourceProtAddress), net.IP(arp.DstProtAddress)
			switch arp.Operation {
			case layers.ARPRequest:
				fmt.Fprintf(&b, "ARP, Request who-has %s tell %s, length %d", target, sender, length-hdr)
			case layers.ARPReply:
				fmt.Fprintf(&b, "ARP, Reply %s is-at %s, length %d", sender, net.HardwareAddr(arp.SourceHwAddress), length-hdr)
			default:
				fmt.Fprintf(&b, "ARP, operation %d, length %d", arp.Operation, length-hdr)
			}
			return b.String()
		}
		et := eth.EthernetType
		if tag, ok := p.Layer(layers.LayerTypeDot1Q).(*layers.Dot1Q); ok {
			et = tag.Type
		}
		fmt.Fprintf(&b, "%s > %s, ethertype 0x%04x, length %d", eth.SrcMAC, eth.DstMAC, uint16(et), length)
		return b.String()
	}
	switch l4 := p.TransportLayer().(type) {
	case *layers.TCP:
		fmt.Fprintf(&b, "%s.%d > %s.%d: Flags [%s], seq %d", src, l4.SrcPort, dst, l4.DstPort, tcpFlags(l4), l4.Seq)
		if n := len(l4.Payload); n > 0 {
			fmt.Fprintf(&b, ":%d", l4.Seq+uint32(n))
		}
		if l4.ACK {
			fmt.Fprintf(&b, ", ack %d", l4.Ack)
		}
		fmt.Fprintf(&b, ", win %d, length %d", l4.Window, len(l4.Payload))
		return b.String()
	case *layers.UDP:
		fmt.Fprintf(&b, "%s.%d > %s.%d: UDP, length %d", src, l4.SrcPort, dst, l4.DstPort, max(int(l4.Length)-8, 0))
		return b.String()
	case *layers.SCTP:
		fmt.Fprintf(&b, "%s.%d > %s.%d: sctp", src, l4.SrcPort, dst, l4.DstPort)
		return b.String()
	}
	fmt.Fprintf(&b, "%s > %s: ", src, dst)
	if ic, ok := p.Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4); ok {
		fmt.Fprintf(&b, "ICMP %s", icmpName(ic.TypeCode.String()))
		if t := ic.TypeCode.Type(); t == layers.ICMPv4TypeEchoRequest || t == layers.ICMPv4TypeEchoReply {
			fmt.Fprintf(&b, ", id %d, seq %d", ic.Id, ic.Seq)
		}
		fmt.Fprintf(&b, ", length %d", len(ic.Contents)+len(ic.Payload))
		return b.String()
	}
	if ic, ok := p.Layer(layers.LayerTypeICMPv6).(*layers.ICMPv6); ok {
		fmt.Fprintf(&b, "ICMP6, %s, length %d", icmpName(ic.TypeCode.String()), len(ic.Contents)+len(ic.Payload))
		return b.String()
	}
	var proto uint8
	var plen int
	switch ip := p.NetworkLayer().(type) {
	case *layers.IPv4:
		proto, plen = uint8(ip.Protocol), len(ip.Payload)
	case *layers.IPv6:
		proto, plen = uint8(ip.NextHeader), len(ip.Payload)
	}
	fmt.Fprintf(&b, "ip-proto-%d, length %d", proto, plen)
	return b.String()
}

// tcpFlags are tcpdump's letters for a segment's flags, in its order.
func tcpFlags(t *layers.TCP) string {
	var s []byte
	for _, f := range []struct {
		on bool
		c  byte
	}{{t.FIN, 'F'}, {t.SYN, 'S'}, {t.RST, 'R'}, {t.PSH, 'P'}, {t.ACK, '.'}, {t.URG, 'U'}, {t.ECE, 'E'}, {t.CWR, 'W'}} {
		if f.on {
			s = append(s, f.c)
		}
	}
	if len(s) == 0 {
		return "none"
	}
	return string(s)
}

// icmpName turns gopacket's "EchoRequest" (or "DestinationUnreachable(Port)")
// into tcpdump's "echo request".
func icmpName(s string) string {
	var b strings.Builder
	for i, r := range s {
		if r >= 'A' && r <= 'Z' {
			if i > 0 && s[i-1] != '(' {
				b.WriteByte(' ')
			}
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return b.String()
}
