package pci

import (
	"encoding/binary"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// netlinkSeed is a dump of the messages the decoders' unit tests use, as
// the kernel sends them (headers included).
func netlinkSeed(msgs ...syscall.NetlinkMessage) []byte {
	var b []byte
	for _, m := range msgs {
		n := unix.SizeofNlMsghdr + len(m.Data)
		h := make([]byte, unix.SizeofNlMsghdr)
		binary.NativeEndian.PutUint32(h[0:], uint32(n))
		binary.NativeEndian.PutUint16(h[4:], m.Header.Type)
		b = append(b, h...)
		b = append(b, m.Data...)
		b = append(b, make([]byte, align4(n)-n)...)
	}
	return b
}

// FuzzNetlink decodes an arbitrary rtnetlink dump (parsed into messages as
// dump does) with the address and route decoders. Nothing panics, and
// what they return is valid: an address or route of the message's family
// (AF_INET gives IPv4, AF_INET6 IPv6), a prefix length within the
// address's bits, a gateway of the route's family or none.
func FuzzNetlink(f *testing.F) {
	v4 := []byte{10, 0, 0, 2}
	v6 := make([]byte, 16)
	v6[0], v6[1], v6[15] = 0x20, 0x01, 5
	dst, gw := []byte{10, 1, 0, 0}, []byte{10, 0, 0, 1}
	f.Add(netlinkSeed(
		addrMsg(unix.AF_INET, 24, 2, attr(unix.IFA_ADDRESS, gw), attr(unix.IFA_LOCAL, v4)),
		addrMsg(unix.AF_INET6, 64, 3, attr(unix.IFA_ADDRESS, v6)),
		addrMsg(unix.AF_INET, 99, 4, attr(unix.IFA_LOCAL, v4))))
	f.Add(netlinkSeed(
		routeMsg(unix.AF_INET, 16, unix.RT_TABLE_MAIN, unix.RTN_UNICAST,
			attr(unix.RTA_DST, dst), attr(unix.RTA_GATEWAY, gw), attr(unix.RTA_OIF, u32b(2))),
		routeMsg(unix.AF_INET, 16, unix.RT_TABLE_COMPAT, unix.RTN_UNICAST, attr(unix.RTA_TABLE, u32b(1000)),
			attr(unix.RTA_DST, dst), attr(unix.RTA_OIF, u32b(7))),
		routeMsg(unix.AF_INET, 16, unix.RT_TABLE_MAIN, unix.RTN_UNICAST, attr(unix.RTA_DST, dst),
			attr(unix.RTA_MULTIPATH, append(nexthop(4, attr(unix.RTA_GATEWAY, gw)), nexthop(5, attr(unix.RTA_GATEWAY, gw))...))),
		routeMsg(unix.AF_INET6, 0, unix.RT_TABLE_MAIN, unix.RTN_UNICAST, attr(unix.RTA_OIF, u32b(3)))))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		msgs, err := syscall.ParseNetlinkMessage(data)
		if err != nil {
			return // dump refuses it before the decoders see it
		}
		for _, a := range parseAddrs(msgs) {
			if !a.Prefix.IsValid() || a.Prefix.Bits() > a.Prefix.Addr().BitLen() || a.Prefix.Addr().Zone() != "" {
				t.Fatalf("address %v from %x", a, data)
			}
		}
		// Each message alone, so that its family is known.
		for i := range msgs {
			if len(msgs[i].Data) == 0 {
				continue
			}
			fam := msgs[i].Data[0]
			one := msgs[i : i+1]
			for _, a := range parseAddrs(one) {
				if !familyOf(a.Prefix.Addr().Is4(), fam) {
					t.Fatalf("family %d message gave address %v", fam, a)
				}
			}
			if mtu, ok := parseMaxMTU(one, 2); ok && (mtu < 0 || msgs[i].Header.Type != unix.RTM_NEWLINK) {
				t.Fatalf("max MTU %d from a message of type %d", mtu, msgs[i].Header.Type)
			}
			for _, r := range parseRoutes(one) {
				if !r.Dst.IsValid() || !familyOf(r.Dst.Addr().Is4(), fam) {
					t.Fatalf("family %d message gave route to %v", fam, r.Dst)
				}
				if r.Gateway.IsValid() && r.Gateway.Is4() != r.Dst.Addr().Is4() {
					t.Fatalf("route to %v through gateway %v", r.Dst, r.Gateway)
				}
			}
		}
	})
}

// familyOf reports whether an address (IPv4 when is4) belongs to the
// address family fam.
func familyOf(is4 bool, fam byte) bool {
	switch fam {
	case unix.AF_INET:
		return is4
	case unix.AF_INET6:
		return !is4
	}
	return true // the decoders do not use the family for addresses
}

// FuzzParseAddress: a PCI address ParseAddress accepts prints (String) as
// the canonical dddd:bb:dd.f form, which parses back to it; a refused one
// is ErrBadAddress and quotes the input.
func FuzzParseAddress(f *testing.F) {
	for _, s := range []string{"0000:00:04.0", "00:04.0", "0000:3B:00.1", "ffff:ff:1f.7", "0000:00:20.0", "0000:00:04.8",
		"0000:00:04.00", "10000:00:04.0", ":.", "0:0:0.0", "0000:0g:04.0", " 0000:00:04.0", "+0:00:04.0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, err := ParseAddress(s)
		if err != nil {
			if !strings.Contains(err.Error(), ErrBadAddress.Error()) {
				t.Fatalf("%q: %v", s, err)
			}
			return
		}
		if a.Device > 31 || a.Function > 7 {
			t.Fatalf("%q gave %+v", s, a)
		}
		str := a.String()
		if len(str) != len("0000:00:00.0") || strings.ToLower(str) != str {
			t.Fatalf("%q prints as %q", s, str)
		}
		b, err := ParseAddress(str)
		if err != nil || b != a {
			t.Fatalf("%q -> %q -> %+v, %v", s, str, b, err)
		}
	})
}
