package pci

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"os"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// attr encodes one rtattr, padded to 4 bytes.
func attr(typ uint16, val []byte) []byte {
	b := make([]byte, align4(unix.SizeofRtAttr+len(val)))
	binary.NativeEndian.PutUint16(b[0:], uint16(unix.SizeofRtAttr+len(val)))
	binary.NativeEndian.PutUint16(b[2:], typ)
	copy(b[unix.SizeofRtAttr:], val)
	return b
}

func u32b(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }

func addrMsg(family, plen uint8, index uint32, attrs ...[]byte) syscall.NetlinkMessage {
	d := []byte{family, plen, 0, 0}
	d = binary.NativeEndian.AppendUint32(d, index)
	for _, a := range attrs {
		d = append(d, a...)
	}
	return syscall.NetlinkMessage{Header: syscall.NlMsghdr{Type: unix.RTM_NEWADDR}, Data: d}
}

func routeMsg(family, dstLen, table, typ uint8, attrs ...[]byte) syscall.NetlinkMessage {
	d := []byte{family, dstLen, 0, 0, table, unix.RTPROT_BOOT, 0, typ, 0, 0, 0, 0}
	for _, a := range attrs {
		d = append(d, a...)
	}
	return syscall.NetlinkMessage{Header: syscall.NlMsghdr{Type: unix.RTM_NEWROUTE}, Data: d}
}

func nexthop(ifindex int32, attrs ...[]byte) []byte {
	var body []byte
	for _, a := range attrs {
		body = append(body, a...)
	}
	b := binary.NativeEndian.AppendUint16(nil, uint16(unix.SizeofRtNexthop+len(body)))
	b = append(b, 0, 0)
	b = binary.NativeEndian.AppendUint32(b, uint32(ifindex))
	return append(b, body...)
}

func TestParseAddrs(t *testing.T) {
	v4 := netip.MustParseAddr("10.0.0.2").AsSlice()
	peer := netip.MustParseAddr("10.0.0.1").AsSlice()
	v6 := netip.MustParseAddr("2001:db8::5").AsSlice()
	msgs := []syscall.NetlinkMessage{
		// Point-to-point: IFA_ADDRESS is the peer, IFA_LOCAL ours.
		addrMsg(unix.AF_INET, 24, 2, attr(unix.IFA_ADDRESS, peer), attr(unix.IFA_LOCAL, v4)),
		addrMsg(unix.AF_INET6, 64, 3, attr(unix.IFA_ADDRESS, v6)),
		addrMsg(unix.AF_INET, 99, 4, attr(unix.IFA_LOCAL, v4)),                 // bad prefix length
		addrMsg(unix.AF_INET, 8, 5, attr(unix.IFA_LOCAL, []byte{1})),           // bad address
		addrMsg(unix.AF_INET, 8, 6),                                            // no address
		addrMsg(unix.AF_INET6, 64, 7, attr(unix.IFA_ADDRESS, v4)),              // not the family's length
		addrMsg(unix.AF_INET, 24, 8, attr(unix.IFA_LOCAL, v6)),                 // not the family's length
		addrMsg(unix.AF_BRIDGE, 24, 9, attr(unix.IFA_LOCAL, v4)),               // not IP
		{Header: syscall.NlMsghdr{Type: unix.RTM_NEWADDR}, Data: []byte{1, 2}}, // truncated
		{Header: syscall.NlMsghdr{Type: unix.RTM_NEWLINK}, Data: make([]byte, 16)},
	}
	got := parseAddrs(msgs)
	want := []IfAddr{{2, pfx("10.0.0.2/24")}, {3, pfx("2001:db8::5/64")}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("parseAddrs = %v, want %v", got, want)
	}
}

func TestParseRoutes(t *testing.T) {
	dst := netip.MustParseAddr("10.1.0.0").AsSlice()
	gw := netip.MustParseAddr("10.0.0.1").AsSlice()
	gw2 := netip.MustParseAddr("10.0.0.9").AsSlice()
	msgs := []syscall.NetlinkMessage{
		routeMsg(unix.AF_INET, 16, unix.RT_TABLE_MAIN, unix.RTN_UNICAST,
			attr(unix.RTA_DST, dst), attr(unix.RTA_GATEWAY, gw), attr(unix.RTA_OIF, u32b(2))),
		routeMsg(unix.AF_INET, 0, unix.RT_TABLE_MAIN, unix.RTN_UNICAST, attr(unix.RTA_OIF, u32b(3))),
		// Local table, via the byte or via RTA_TABLE: skipped.
		routeMsg(unix.AF_INET, 32, unix.RT_TABLE_LOCAL, unix.RTN_LOCAL, attr(unix.RTA_DST, dst), attr(unix.RTA_OIF, u32b(2))),
		routeMsg(unix.AF_INET, 32, unix.RT_TABLE_COMPAT, unix.RTN_UNICAST, attr(unix.RTA_TABLE, u32b(unix.RT_TABLE_LOCAL)),
			attr(unix.RTA_DST, dst), attr(unix.RTA_OIF, u32b(2))),
		// Table 1000 via RTA_TABLE: kept.
		routeMsg(unix.AF_INET, 16, unix.RT_TABLE_COMPAT, unix.RTN_UNICAST, attr(unix.RTA_TABLE, u32b(1000)),
			attr(unix.RTA_DST, dst), attr(unix.RTA_OIF, u32b(7))),
		// Not unicast, or not IP: skipped.
		routeMsg(unix.AF_INET, 16, unix.RT_TABLE_MAIN, unix.RTN_BLACKHOLE, attr(unix.RTA_DST, dst)),
		routeMsg(unix.AF_BRIDGE, 0, unix.RT_TABLE_MAIN, unix.RTN_UNICAST, attr(unix.RTA_OIF, u32b(2))),
		// Multipath: one route per next hop; a truncated third entry is dropped.
		routeMsg(unix.AF_INET, 16, unix.RT_TABLE_MAIN, unix.RTN_UNICAST, attr(unix.RTA_DST, dst),
			attr(unix.RTA_MULTIPATH, append(append(nexthop(4, attr(unix.RTA_GATEWAY, gw)), nexthop(5, attr(unix.RTA_GATEWAY, gw2))...), 0xff, 0x00, 0, 0, 0, 0, 0, 0))),
		// Malformed destination or prefix length: skipped.
		routeMsg(unix.AF_INET, 16, unix.RT_TABLE_MAIN, unix.RTN_UNICAST, attr(unix.RTA_DST, []byte{1, 2, 3}), attr(unix.RTA_OIF, u32b(2))),
		routeMsg(unix.AF_INET, 40, unix.RT_TABLE_MAIN, unix.RTN_UNICAST, attr(unix.RTA_DST, dst), attr(unix.RTA_OIF, u32b(2))),
		// An IPv6 destination in an IPv4 route: skipped; an IPv6 gateway
		// of an IPv4 route: none.
		routeMsg(unix.AF_INET, 16, unix.RT_TABLE_MAIN, unix.RTN_UNICAST, attr(unix.RTA_DST, netip.MustParseAddr("2001:db8::").AsSlice()), attr(unix.RTA_OIF, u32b(2))),
		routeMsg(unix.AF_INET, 16, unix.RT_TABLE_MAIN, unix.RTN_UNICAST, attr(unix.RTA_DST, dst),
			attr(unix.RTA_GATEWAY, netip.MustParseAddr("2001:db8::1").AsSlice()), attr(unix.RTA_OIF, u32b(11))),
		{Header: syscall.NlMsghdr{Type: unix.RTM_NEWROUTE}, Data: []byte{2, 0}},
	}
	got := parseRoutes(msgs)
	want := []Route{
		{Index: 2, Dst: pfx("10.1.0.0/16"), Gateway: netip.MustParseAddr("10.0.0.1")},
		{Index: 3, Dst: pfx("0.0.0.0/0")},
		{Index: 7, Dst: pfx("10.1.0.0/16")},
		{Index: 4, Dst: pfx("10.1.0.0/16"), Gateway: netip.MustParseAddr("10.0.0.1")},
		{Index: 5, Dst: pfx("10.1.0.0/16"), Gateway: netip.MustParseAddr("10.0.0.9")},
		{Index: 11, Dst: pfx("10.1.0.0/16")},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("parseRoutes =\n %v\nwant\n %v", got, want)
	}
}

func TestParseAttrsMalformed(t *testing.T) {
	good := attr(unix.RTA_OIF, u32b(9))
	for _, tail := range [][]byte{{0xff, 0xff, 1, 0}, {2, 0, 1, 0}, {8, 0}} {
		m := parseAttrs(append(append([]byte(nil), good...), tail...))
		if len(m) != 1 || binary.NativeEndian.Uint32(m[unix.RTA_OIF]) != 9 {
			t.Errorf("tail %v: %v", tail, m)
		}
	}
}

// TestNetlinkReal asks this machine's kernel: loopback carries 127.0.0.1/8
// and no route from the local table comes back.
func TestNetlinkReal(t *testing.T) {
	addrs, err := Netlink().Addrs()
	if errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EAFNOSUPPORT) {
		t.Skipf("netlink not available: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("/sys/class/net/lo/ifindex")
	if err != nil {
		t.Skip("no /sys/class/net/lo")
	}
	lo, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	found := false
	for _, a := range addrs {
		found = found || (a.Index == lo && a.Prefix == pfx("127.0.0.1/8"))
	}
	if !found {
		t.Errorf("127.0.0.1/8 on lo (%d) not among %v", lo, addrs)
	}
	routes, err := Netlink().Routes()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range routes {
		if r.Dst == pfx("127.0.0.1/32") || r.Dst == pfx("127.0.0.0/8") {
			t.Errorf("local-table route %v returned", r)
		}
	}
	t.Logf("addresses %v routes %v", addrs, routes)
}
