package pci

import (
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"
)

// fixedNet is a NetState that returns fixtures and counts its calls.
type fixedNet struct {
	addrs  []IfAddr
	routes []Route
	err    error
	calls  int
}

func (n *fixedNet) Addrs() ([]IfAddr, error) { n.calls++; return n.addrs, n.err }
func (n *fixedNet) Routes() ([]Route, error) { n.calls++; return n.routes, n.err }

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }

func TestInUse(t *testing.T) {
	// In standardTree, eth0 (ifindex 2) is on 0000:00:03.0; enp2s0f1 (2)
	// and enp2s0f1d1 (3) are on 0001:02:00.1. Interfaces start down.
	eth0 := Address{Device: 3}
	cases := []struct {
		name   string
		up     bool
		oper   string
		net    fixedNet
		want   []string
		device Address
	}{
		{name: "free", net: fixedNet{}},
		{name: "up", up: true, want: []string{"interface eth0 is up"}},
		{name: "operstate up", oper: "up", want: []string{"interface eth0 is up"}},
		{name: "address", net: fixedNet{addrs: []IfAddr{{2, pfx("10.0.0.2/24")}}},
			want: []string{"interface eth0 has address 10.0.0.2/24"}},
		{name: "ipv6 global address", net: fixedNet{addrs: []IfAddr{{2, pfx("2001:db8::5/64")}}},
			want: []string{"interface eth0 has address 2001:db8::5/64"}},
		{name: "link-local only", net: fixedNet{
			addrs:  []IfAddr{{2, pfx("fe80::1/64")}},
			routes: []Route{{Index: 2, Dst: pfx("fe80::/64")}, {Index: 2, Dst: pfx("ff00::/8")}}}},
		{name: "route", net: fixedNet{routes: []Route{{Index: 2, Dst: pfx("10.1.0.0/16"), Gateway: netip.MustParseAddr("10.0.0.1")}}},
			want: []string{"route to 10.1.0.0/16 via eth0"}},
		{name: "default route", net: fixedNet{routes: []Route{{Index: 2, Dst: pfx("0.0.0.0/0")}}},
			want: []string{"route to 0.0.0.0/0 (default) via eth0"}},
		{name: "other interfaces", net: fixedNet{
			addrs:  []IfAddr{{1, pfx("127.0.0.1/8")}, {3, pfx("10.9.0.1/24")}},
			routes: []Route{{Index: 3, Dst: pfx("10.9.0.0/24")}}}},
		{name: "everything", up: true, net: fixedNet{
			addrs:  []IfAddr{{2, pfx("10.0.0.2/24")}, {2, pfx("fe80::1/64")}},
			routes: []Route{{Index: 2, Dst: pfx("10.0.0.0/24")}}},
			want: []string{"interface eth0 is up", "interface eth0 has address 10.0.0.2/24", "route to 10.0.0.0/24 via eth0"}},
		{name: "second interface of a device", device: Address{Domain: 1, Bus: 2, Function: 1},
			net:  fixedNet{addrs: []IfAddr{{3, pfx("192.168.7.1/24")}}},
			want: []string{"interface enp2s0f1d1 has address 192.168.7.1/24"}},
	}
	f := standardTree(t) // shared: each case sets the link state it needs
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f.setLink("eth0", "0x1002", "down")
			if tc.up {
				f.setLink("eth0", "0x1003", "up")
			}
			if tc.oper != "" {
				f.setLink("eth0", "0x1002", tc.oper)
			}
			a := eth0
			if tc.device != (Address{}) {
				a = tc.device
			}
			got, err := f.sys().InUse(a, &tc.net)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("InUse = %q, want %q", got, tc.want)
			}
			err = f.sys().CheckInUse(a, &tc.net, false)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("CheckInUse of a free device: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), a.String()) {
				t.Fatalf("CheckInUse: %v, want ErrInUse naming %s", err, a)
			}
			for _, r := range tc.want {
				if !strings.Contains(err.Error(), r) {
					t.Errorf("CheckInUse error %q lacks %q", err, r)
				}
			}
			// Forced: nothing is checked, nothing is asked.
			calls := tc.net.calls
			if err := f.sys().CheckInUse(a, &tc.net, true); err != nil {
				t.Errorf("forced CheckInUse: %v", err)
			}
			if tc.net.calls != calls {
				t.Error("forced CheckInUse still queried the network state")
			}
		})
	}
}

func TestInUseNoInterfaces(t *testing.T) {
	// A device bound to vfio-pci has no interface: free without asking.
	f := standardTree(t)
	n := &fixedNet{err: errors.New("must not be called")}
	if err := f.sys().CheckInUse(Address{Device: 4}, n, false); err != nil || n.calls != 0 {
		t.Errorf("CheckInUse without interfaces: %v, %d calls", err, n.calls)
	}
}

func TestInUseErrors(t *testing.T) {
	f := standardTree(t)
	s := f.sys()
	boom := errors.New("netlink refused")
	err := s.CheckInUse(Address{Device: 3}, &fixedNet{err: boom}, false)
	if !errors.Is(err, boom) || errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), "0000:00:03.0") {
		t.Errorf("NetState failure: %v", err)
	}
	if err := s.CheckInUse(Address{Bus: 7}, &fixedNet{}, false); !errors.Is(err, ErrNotFound) {
		t.Errorf("missing device: %v", err)
	}
	f.write("class/net/eth0/flags", "nonsense\n")
	if _, err := s.InUse(Address{Device: 3}, &fixedNet{}); err == nil || !strings.Contains(err.Error(), "eth0") {
		t.Errorf("bad flags: %v", err)
	}
}

// TestRealInUse runs the check with the real netlink source against this
// machine: a network device whose interface is up must be reported in use.
func TestRealInUse(t *testing.T) {
	ds, err := List(ListOptions{NetworkOnly: true})
	if err != nil {
		t.Skipf("no sysfs: %v", err)
	}
	checked := 0
	for _, d := range ds {
		for _, n := range d.NetInterfaces {
			up, err := linkUp("/sys/class/net/" + n)
			if err != nil || !up {
				continue
			}
			err = Sysfs{}.CheckInUse(d.Address, nil, false)
			if !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), "interface "+n+" is up") {
				t.Errorf("%s with %s up: %v", d.Address, n, err)
			}
			t.Log(err)
			checked++
		}
	}
	if checked == 0 {
		t.Skip("no PCI network interface is up on this machine")
	}
}
