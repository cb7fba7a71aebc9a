package pci

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"
)

// Netlink returns the NetState that asks the kernel over an rtnetlink
// socket (RTM_GETADDR and RTM_GETROUTE dumps) in the caller's network
// namespace.
func Netlink() NetState { return netlinkState{} }

type netlinkState struct{}

// Addrs dumps the addresses of all interfaces.
func (netlinkState) Addrs() ([]IfAddr, error) {
	msgs, err := dump(unix.RTM_GETADDR)
	if err != nil {
		return nil, err
	}
	return parseAddrs(msgs), nil
}

// parseAddrs decodes RTM_NEWADDR messages; others are skipped.
func parseAddrs(msgs []syscall.NetlinkMessage) []IfAddr {
	var out []IfAddr
	for _, m := range msgs {
		if m.Header.Type != unix.RTM_NEWADDR || len(m.Data) < unix.SizeofIfAddrmsg {
			continue
		}
		prefixLen := int(m.Data[1])
		index := int(binary.NativeEndian.Uint32(m.Data[4:8]))
		attrs := parseAttrs(m.Data[unix.SizeofIfAddrmsg:])
		// IFA_LOCAL is the interface's own address; on point-to-point links
		// IFA_ADDRESS is the peer, so it is only the fallback (IPv6).
		raw, ok := attrs[unix.IFA_LOCAL]
		if !ok {
			raw, ok = attrs[unix.IFA_ADDRESS]
		}
		ip, ipok := familyAddr(m.Data[0], raw)
		if !ok || !ipok {
			continue
		}
		// Keep the host bits: the check reports the address as configured.
		pfx := netip.PrefixFrom(ip, prefixLen)
		if !pfx.IsValid() {
			continue
		}
		out = append(out, IfAddr{Index: index, Prefix: pfx})
	}
	return out
}

// Routes dumps IPv4 and IPv6 unicast routes outside the local table,
// splitting multipath routes into one Route per next hop.
func (netlinkState) Routes() ([]Route, error) {
	msgs, err := dump(unix.RTM_GETROUTE)
	if err != nil {
		return nil, err
	}
	return parseRoutes(msgs), nil
}

// parseRoutes decodes RTM_NEWROUTE messages, keeping IPv4 and IPv6 unicast
// routes outside the local table.
func parseRoutes(msgs []syscall.NetlinkMessage) []Route {
	var out []Route
	for _, m := range msgs {
		if m.Header.Type != unix.RTM_NEWROUTE || len(m.Data) < unix.SizeofRtMsg {
			continue
		}
		family, dstLen, table, typ := m.Data[0], int(m.Data[1]), uint32(m.Data[4]), m.Data[7]
		if (family != unix.AF_INET && family != unix.AF_INET6) || typ != unix.RTN_UNICAST {
			continue
		}
		attrs := parseAttrs(m.Data[unix.SizeofRtMsg:])
		if t, ok := attrs[unix.RTA_TABLE]; ok && len(t) == 4 {
			table = binary.NativeEndian.Uint32(t)
		}
		if table == unix.RT_TABLE_LOCAL {
			continue
		}
		dst := netip.IPv4Unspecified()
		if family == unix.AF_INET6 {
			dst = netip.IPv6Unspecified()
		}
		if raw, ok := attrs[unix.RTA_DST]; ok {
			ip, ok := familyAddr(family, raw)
			if !ok {
				continue
			}
			dst = ip
		}
		pfx := netip.PrefixFrom(dst, dstLen)
		if !pfx.IsValid() {
			continue
		}
		if oif, ok := attrs[unix.RTA_OIF]; ok && len(oif) == 4 {
			gw, _ := familyAddr(family, attrs[unix.RTA_GATEWAY])
			out = append(out, Route{Index: int(binary.NativeEndian.Uint32(oif)), Dst: pfx, Gateway: gw})
		}
		out = append(out, nexthops(family, attrs[unix.RTA_MULTIPATH], pfx)...)
	}
	return out
}

// nexthops splits an RTA_MULTIPATH payload (struct rtnexthop entries, each
// followed by its own attributes) into routes.
func nexthops(family byte, b []byte, dst netip.Prefix) []Route {
	var out []Route
	for len(b) >= unix.SizeofRtNexthop {
		n := int(binary.NativeEndian.Uint16(b[0:2]))
		if n < unix.SizeofRtNexthop || n > len(b) {
			break
		}
		idx := int(int32(binary.NativeEndian.Uint32(b[4:8])))
		gw, _ := familyAddr(family, parseAttrs(b[unix.SizeofRtNexthop:n])[unix.RTA_GATEWAY])
		out = append(out, Route{Index: idx, Dst: dst, Gateway: gw})
		b = b[min(align4(n), len(b)):]
	}
	return out
}

// MaxMTU reads the largest MTU the kernel's driver allows on the
// interface with the given index (IFLA_MAX_MTU, from an RTM_GETLINK dump in
// the caller's network namespace); 0 when the kernel sets no limit or is
// older than 4.19 and does not say.
func MaxMTU(index int) (int, error) {
	msgs, err := dump(unix.RTM_GETLINK)
	if err != nil {
		return 0, err
	}
	mtu, ok := parseMaxMTU(msgs, index)
	if !ok {
		return 0, fmt.Errorf("pci: interface index %d not found", index)
	}
	return mtu, nil
}

// parseMaxMTU finds the RTM_NEWLINK message of interface index and its
// IFLA_MAX_MTU (0 when absent); ok is false when no message is for index.
func parseMaxMTU(msgs []syscall.NetlinkMessage, index int) (mtu int, ok bool) {
	for _, m := range msgs {
		// struct ifinfomsg: family, pad, type (2), index (4), flags, change.
		if m.Header.Type != unix.RTM_NEWLINK || len(m.Data) < unix.SizeofIfInfomsg ||
			int(int32(binary.NativeEndian.Uint32(m.Data[4:8]))) != index {
			continue
		}
		if v := parseAttrs(m.Data[unix.SizeofIfInfomsg:])[unix.IFLA_MAX_MTU]; len(v) >= 4 {
			return int(binary.NativeEndian.Uint32(v)), true
		}
		return 0, true
	}
	return 0, false
}

// dump sends one rtnetlink dump request for all address families.
func dump(typ int) ([]syscall.NetlinkMessage, error) {
	// golang.org/x/sys/unix has no netlink dump helper; the standard
	// library's does exactly what is needed.
	b, err := syscall.NetlinkRIB(typ, unix.AF_UNSPEC)
	if err != nil {
		return nil, fmt.Errorf("pci: netlink dump %d: %w", typ, err)
	}
	msgs, err := syscall.ParseNetlinkMessage(b)
	if err != nil {
		return nil, fmt.Errorf("pci: parse netlink dump %d: %w", typ, err)
	}
	return msgs, nil
}

// familyAddr decodes an address attribute of a message of address family
// fam: 4 bytes for AF_INET, 16 for AF_INET6. Anything else, an IPv4
// address in an AF_INET6 message for one, is refused (false).
func familyAddr(fam byte, raw []byte) (netip.Addr, bool) {
	switch {
	case fam == unix.AF_INET && len(raw) == 4:
		return netip.AddrFrom4([4]byte(raw)), true
	case fam == unix.AF_INET6 && len(raw) == 16:
		return netip.AddrFrom16([16]byte(raw)), true
	}
	return netip.Addr{}, false
}

// parseAttrs splits rtnetlink attributes (struct rtattr, 4-byte aligned)
// into a map by type; a malformed tail is dropped.
func parseAttrs(b []byte) map[uint16][]byte {
	m := make(map[uint16][]byte)
	for len(b) >= unix.SizeofRtAttr {
		n := int(binary.NativeEndian.Uint16(b[0:2]))
		typ := binary.NativeEndian.Uint16(b[2:4]) &^ unix.NLA_F_NESTED
		if n < unix.SizeofRtAttr || n > len(b) {
			break
		}
		m[typ] = b[unix.SizeofRtAttr:n]
		b = b[min(align4(n), len(b)):]
	}
	return m
}

func align4(n int) int { return (n + 3) &^ 3 }
