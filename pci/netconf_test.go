package pci

import (
	"context"
	"encoding/binary"
	"errors"
	"net/netip"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// configuredNet is eth0 (ifindex 2 in standardTree) with an address, a
// route through a gateway and what the kernel makes by itself.
func configuredNet() *fixedNet {
	return &fixedNet{
		addrs: []IfAddr{{2, pfx("10.0.0.2/24")}, {2, pfx("fe80::1/64")}, {3, pfx("10.1.0.2/24")}},
		routes: []Route{{Index: 2, Dst: pfx("10.0.0.0/24")}, {Index: 2, Dst: pfx("10.9.0.0/16"), Gateway: netip.MustParseAddr("10.0.0.1")},
			{Index: 2, Dst: pfx("fe80::/64")}},
	}
}

func TestNetConfig(t *testing.T) {
	f := standardTree(t)
	f.write("class/net/eth0/flags", "0x1003\n")
	c, err := f.sys().NetConfig(Address{Device: 3}, configuredNet())
	if err != nil {
		t.Fatal(err)
	}
	want := &NetConfig{Address: Address{Device: 3}, Interfaces: []IfConfig{{Name: "eth0", Index: 2, Up: true,
		Addrs:  []netip.Prefix{pfx("10.0.0.2/24")},
		Routes: []Route{{Index: 2, Dst: pfx("10.0.0.0/24")}, {Index: 2, Dst: pfx("10.9.0.0/16"), Gateway: netip.MustParseAddr("10.0.0.1")}}}}}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("NetConfig =\n %+v\nwant\n %+v", c, want)
	}
	// Down, no address, no route: nothing to give back.
	if c, err := f.sys().NetConfig(Address{Bus: 2, Function: 1, Domain: 1}, &fixedNet{}); err != nil || c != nil {
		t.Errorf("NetConfig of unconfigured interfaces = %+v, %v; want nil", c, err)
	}
	// vfio-pci's device has no interface.
	if c, err := f.sys().NetConfig(Address{Device: 4}, &fixedNet{err: errors.New("must not be called")}); err != nil || c != nil {
		t.Errorf("NetConfig without interfaces = %+v, %v", c, err)
	}
}

// fakeWriter records the configuration given back; refuse maps what the
// kernel refuses to its errno.
type fakeWriter struct {
	calls  []string
	refuse map[string]error
}

func (w *fakeWriter) do(s string) error {
	w.calls = append(w.calls, s)
	return w.refuse[s]
}
func (w *fakeWriter) setUp(i int) error                   { return w.do("up " + itoa(i)) }
func (w *fakeWriter) setMTU(i, mtu int) error             { return w.do("mtu " + itoa(mtu) + " " + itoa(i)) }
func (w *fakeWriter) addAddr(i int, p netip.Prefix) error { return w.do(p.String() + " " + itoa(i)) }
func (w *fakeWriter) addRoute(i int, r Route) error       { return w.do(r.Dst.String() + " " + itoa(i)) }

func itoa(i int) string { return strconv.Itoa(i) }

// TestRestoreNet: once the driver has made the interface again (a new
// ifindex), it gets its state, address and routes back, in that order;
// the kernel's subnet route already there is no refusal, a refused route
// is named; an interface that never went away is left alone.
func TestRestoreNet(t *testing.T) {
	f := standardTree(t)
	f.write("class/net/eth0/flags", "0x1003\n")
	f.write("class/net/eth0/mtu", "9000\n")
	s := f.sys()
	c, err := s.NetConfig(Address{Device: 3}, configuredNet())
	if err != nil {
		t.Fatal(err)
	}
	w := &fakeWriter{}
	if done, err := s.restoreNet(t.Context(), c, w); err != nil || len(done) != 0 || len(w.calls) != 0 {
		t.Errorf("never taken: restore did %v %v, %v", done, w.calls, err)
	}

	f.write("class/net/eth0/ifindex", "7\n") // made again by the driver
	f.write("class/net/eth0/mtu", "1500\n")  // with the driver's default MTU
	w = &fakeWriter{refuse: map[string]error{"10.0.0.0/24 7": unix.EEXIST, "10.9.0.0/16 7": unix.ENETUNREACH}}
	done, err := s.restoreNet(t.Context(), c, w)
	if want := []string{"mtu 9000 7", "up 7", "10.0.0.2/24 7", "10.0.0.0/24 7", "10.9.0.0/16 7"}; !reflect.DeepEqual(w.calls, want) {
		t.Errorf("calls %v, want %v", w.calls, want)
	}
	if want := []string{"eth0: mtu 9000, up, 10.0.0.2/24"}; !reflect.DeepEqual(done, want) {
		t.Errorf("done %v, want %v", done, want)
	}
	if !errors.Is(err, ErrNetRestore) || !errors.Is(err, unix.ENETUNREACH) || !strings.Contains(err.Error(), "route to 10.9.0.0/16 on eth0") {
		t.Errorf("err = %v", err)
	}

	w = &fakeWriter{}
	f.write("class/net/eth0/mtu", "9000\n") // the same MTU is left alone
	done, err = s.restoreNet(t.Context(), c, w)
	if err != nil || !reflect.DeepEqual(done, []string{"eth0: up, 10.0.0.2/24, route to 10.0.0.0/24, route to 10.9.0.0/16 via 10.0.0.1"}) {
		t.Errorf("restore = %v, %v", done, err)
	}

	// A device that stays on vfio-pci: its interfaces never come back.
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	_, err = s.restoreNet(ctx, &NetConfig{Address: Address{Device: 4}, Interfaces: c.Interfaces}, &fakeWriter{})
	if !errors.Is(err, ErrNetRestore) || !strings.Contains(err.Error(), "did not come back") {
		t.Errorf("err = %v", err)
	}
}

// TestRtMessagesRoundTrip: the requests that give the configuration back
// decode, by the package's own dump parsers, to what they were made of.
func TestRtMessagesRoundTrip(t *testing.T) {
	for _, p := range []netip.Prefix{pfx("10.0.0.2/24"), pfx("2001:db8::5/64")} {
		got := parseAddrs([]syscall.NetlinkMessage{{Header: syscall.NlMsghdr{Type: unix.RTM_NEWADDR}, Data: newAddrMsg(7, p)}})
		if want := []IfAddr{{7, p}}; !reflect.DeepEqual(got, want) {
			t.Errorf("address %v: parsed %v", p, got)
		}
	}
	for _, r := range []Route{{Index: 7, Dst: pfx("10.9.0.0/16"), Gateway: netip.MustParseAddr("10.0.0.1")},
		{Index: 7, Dst: pfx("0.0.0.0/0"), Gateway: netip.MustParseAddr("10.0.0.1")}, {Index: 7, Dst: pfx("2001:db8::/32")}} {
		got := parseRoutes([]syscall.NetlinkMessage{{Header: syscall.NlMsghdr{Type: unix.RTM_NEWROUTE}, Data: newRouteMsg(7, r)}})
		if want := []Route{r}; !reflect.DeepEqual(got, want) {
			t.Errorf("route %+v: parsed %+v", r, got)
		}
	}
	if b := newLinkMTUMsg(7, 9000); len(b) != unix.SizeofIfInfomsg+8 || b[4] != 7 ||
		binary.NativeEndian.Uint16(b[unix.SizeofIfInfomsg+2:]) != unix.IFLA_MTU || binary.NativeEndian.Uint32(b[unix.SizeofIfInfomsg+4:]) != 9000 {
		t.Errorf("link MTU message % x", b)
	}
	b := newLinkUpMsg(7)
	if len(b) != unix.SizeofIfInfomsg || b[4] != 7 || b[8]&unix.IFF_UP == 0 || b[12]&unix.IFF_UP == 0 {
		t.Errorf("link up message % x", b)
	}
}
