package pci

import (
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
)

// ErrInUse reports a device that the kernel's network stack is using.
var ErrInUse = errors.New("pci: device in use")

// iffUp is IFF_UP in <sysfs>/class/net/<if>/flags.
const iffUp = 0x1

// IfAddr is an address assigned to a network interface.
type IfAddr struct {
	Index  int          // interface index
	Prefix netip.Prefix // address and prefix length, e.g. 10.0.0.2/24
}

// Route is a unicast route leaving through an interface.
type Route struct {
	Index   int          // output interface index
	Dst     netip.Prefix // destination; prefix length 0 is the default route
	Gateway netip.Addr   // next hop; invalid when directly connected
}

// NetState is where the in-use check learns the kernel's addresses and
// routes. Netlink() is the real source; tests supply fixtures.
type NetState interface {
	// Addrs returns every address on every interface.
	Addrs() ([]IfAddr, error)
	// Routes returns the unicast routes outside the kernel's local table.
	Routes() ([]Route, error)
}

// InUse returns why taking the device away from the kernel would disrupt
// the host: for each of its network interfaces, whether it is
// administratively up, which addresses it carries (IPv6 link-local ones are
// ignored: the kernel adds those by itself), and which routes leave through
// it. No reasons means the device is free. ns nil means Netlink().
func (s Sysfs) InUse(a Address, ns NetState) ([]string, error) {
	d, err := s.Lookup(a)
	if err != nil {
		return nil, err
	}
	if len(d.NetInterfaces) == 0 {
		return nil, nil
	}
	if ns == nil {
		ns = Netlink()
	}
	addrs, err := ns.Addrs()
	if err != nil {
		return nil, fmt.Errorf("pci: in-use check of %s: list addresses: %w", a, err)
	}
	routes, err := ns.Routes()
	if err != nil {
		return nil, fmt.Errorf("pci: in-use check of %s: list routes: %w", a, err)
	}
	var reasons []string
	for _, name := range d.NetInterfaces {
		dir := s.path("class", "net", name)
		up, err := linkUp(dir)
		if err != nil {
			return nil, fmt.Errorf("pci: in-use check of %s: interface %s: %w", a, name, err)
		}
		if up {
			reasons = append(reasons, fmt.Sprintf("interface %s is up", name))
		}
		txt, err := readAttr(filepath.Join(dir, "ifindex"))
		if err != nil {
			return nil, fmt.Errorf("pci: in-use check of %s: interface %s: %w", a, name, err)
		}
		idx, err := strconv.Atoi(txt)
		if err != nil {
			return nil, fmt.Errorf("pci: in-use check of %s: interface %s: bad ifindex %q", a, name, txt)
		}
		for _, ad := range addrs {
			if ad.Index != idx || ignoredAddr(ad.Prefix.Addr()) {
				continue
			}
			reasons = append(reasons, fmt.Sprintf("interface %s has address %s", name, ad.Prefix))
		}
		for _, r := range routes {
			if r.Index != idx || ignoredAddr(r.Dst.Addr()) {
				continue
			}
			dst := r.Dst.String()
			if r.Dst.Bits() == 0 {
				dst += " (default)"
			}
			reasons = append(reasons, fmt.Sprintf("route to %s via %s", dst, name))
		}
	}
	return reasons, nil
}

// CheckInUse returns nil when the device is free to take, or when force is
// set (nothing is then checked). Otherwise it returns an error wrapping
// ErrInUse that lists every reason InUse found. ns nil means Netlink().
func (s Sysfs) CheckInUse(a Address, ns NetState, force bool) error {
	if force {
		return nil
	}
	reasons, err := s.InUse(a, ns)
	if err != nil {
		return err
	}
	if len(reasons) > 0 {
		return fmt.Errorf("%w: %s: %s", ErrInUse, a, strings.Join(reasons, "; "))
	}
	return nil
}

// ignoredAddr reports addresses and destinations the kernel configures on
// any link by itself: IPv6 link-local (fe80::/10) and multicast.
func ignoredAddr(ip netip.Addr) bool {
	return ip.Is6() && (ip.IsLinkLocalUnicast() || ip.IsMulticast())
}

// linkUp reads <dir>/flags (IFF_UP) and <dir>/operstate.
func linkUp(dir string) (bool, error) {
	txt, err := readAttr(filepath.Join(dir, "flags"))
	if err != nil {
		return false, err
	}
	flags, err := strconv.ParseUint(txt, 0, 32)
	if err != nil {
		return false, fmt.Errorf("bad flags %q", txt)
	}
	if flags&iffUp != 0 {
		return true, nil
	}
	// Flags settle the question; operstate is read only to catch the odd
	// driver that reports "up" while IFF_UP is clear, and is optional.
	op, err := readAttr(filepath.Join(dir, "operstate"))
	return err == nil && op == "up", nil
}
