package pci

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ErrNetRestore wraps what the kernel refused when RestoreNetConfig gave
// interfaces their configuration back.
var ErrNetRestore = errors.New("pci: interface configuration not restored")

// NetConfig is what the kernel had configured on a device's network
// interfaces: what a driver unbind takes away with them, and what
// RestoreNetConfig gives back once the kernel's driver has made them again.
type NetConfig struct {
	Address    Address
	Interfaces []IfConfig
}

// IfConfig is one interface's configuration.
type IfConfig struct {
	Name string
	// Index is the kernel's ifindex: a new one means the driver made the
	// interface again.
	Index int
	Up    bool
	// MTU is its MTU; 0 when sysfs does not say.
	MTU int
	// Addrs are its addresses, IPv6 link-local ones left out (the kernel
	// makes those by itself).
	Addrs []netip.Prefix
	// Routes leave through it, outside the local table; the kernel's own
	// routes of its addresses' subnets are among them.
	Routes []Route
}

// NetConfig reads the configuration of a's network interfaces. It returns
// nil when there is nothing to give back: no interface, or all down and
// without addresses or routes. ns nil means Netlink().
func (s Sysfs) NetConfig(a Address, ns NetState) (*NetConfig, error) {
	d, err := s.Lookup(a)
	if err != nil || len(d.NetInterfaces) == 0 {
		return nil, err
	}
	if ns == nil {
		ns = Netlink()
	}
	addrs, err := ns.Addrs()
	if err != nil {
		return nil, fmt.Errorf("pci: configuration of %s: list addresses: %w", a, err)
	}
	routes, err := ns.Routes()
	if err != nil {
		return nil, fmt.Errorf("pci: configuration of %s: list routes: %w", a, err)
	}
	c := &NetConfig{Address: a}
	for _, name := range d.NetInterfaces {
		ic, err := s.ifConfig(name, addrs, routes)
		if err != nil {
			return nil, fmt.Errorf("pci: configuration of %s: interface %s: %w", a, name, err)
		}
		if ic.Up || len(ic.Addrs) > 0 || len(ic.Routes) > 0 {
			c.Interfaces = append(c.Interfaces, ic)
		}
	}
	if len(c.Interfaces) == 0 {
		return nil, nil
	}
	return c, nil
}

func (s Sysfs) ifConfig(name string, addrs []IfAddr, routes []Route) (IfConfig, error) {
	dir := s.path("class", "net", name)
	idx, err := ifIndex(dir)
	if err != nil {
		return IfConfig{}, err
	}
	up, err := linkUp(dir)
	if err != nil {
		return IfConfig{}, err
	}
	ic := IfConfig{Name: name, Index: idx, Up: up, MTU: ifMTU(dir)}
	for _, ad := range addrs {
		if ad.Index == idx && !ignoredAddr(ad.Prefix.Addr()) {
			ic.Addrs = append(ic.Addrs, ad.Prefix)
		}
	}
	for _, r := range routes {
		if r.Index == idx && !ignoredAddr(r.Dst.Addr()) {
			ic.Routes = append(ic.Routes, r)
		}
	}
	return ic, nil
}

func ifIndex(dir string) (int, error) {
	txt, err := readAttr(filepath.Join(dir, "ifindex"))
	if err != nil {
		return 0, err
	}
	idx, err := strconv.Atoi(txt)
	if err != nil {
		return 0, fmt.Errorf("bad ifindex %q", txt)
	}
	return idx, nil
}

// ifMTU is the interface's MTU, 0 when it cannot be read.
func ifMTU(dir string) int {
	txt, err := readAttr(filepath.Join(dir, "mtu"))
	if err != nil {
		return 0
	}
	mtu, err := strconv.Atoi(txt)
	if err != nil || mtu < 0 {
		return 0
	}
	return mtu
}

// netWriter changes the kernel's interface configuration; rtnetlink, or a
// fake in tests.
type netWriter interface {
	setUp(index int) error
	setMTU(index, mtu int) error
	addAddr(index int, p netip.Prefix) error
	addRoute(index int, r Route) error
}

// RestoreNetConfig waits, until ctx ends, for the kernel's driver to make
// c's device's interfaces again, then gives each back its configuration:
// its MTU (a driver makes an interface with its default), up, then its addresses, then its routes (a gateway needs its subnet
// first). An interface whose ifindex did not change never went away and
// is left alone; one the driver named anew is matched by its place among
// the device's interfaces. It returns what it set, per interface, and an
// error wrapping ErrNetRestore that names each thing the kernel refused.
func (s Sysfs) RestoreNetConfig(ctx context.Context, c *NetConfig) ([]string, error) {
	return s.restoreNet(ctx, c, rtnetlink{})
}

func (s Sysfs) restoreNet(ctx context.Context, c *NetConfig, w netWriter) ([]string, error) {
	var names []string
	for {
		d, err := s.Lookup(c.Address)
		if err == nil && d.Driver != "" && d.Driver != VFIODriver && len(d.NetInterfaces) > 0 {
			names = d.NetInterfaces
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: %s: its interfaces did not come back: %w", ErrNetRestore, c.Address, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	var done []string
	var refused []error
	for i, ic := range c.Interfaces {
		name := ic.Name
		if !slices.Contains(names, name) {
			if i >= len(names) {
				refused = append(refused, fmt.Errorf("interface %s: not made again", ic.Name))
				continue
			}
			name = names[i]
		}
		idx, err := ifIndex(s.path("class", "net", name))
		if err != nil {
			refused = append(refused, fmt.Errorf("interface %s: %w", name, err))
			continue
		}
		if idx == ic.Index {
			continue // never went away
		}
		what := ""
		add := func(s string) {
			if what != "" {
				what += ", "
			}
			what += s
		}
		if cur := ifMTU(s.path("class", "net", name)); ic.MTU > 0 && cur != ic.MTU {
			if err := w.setMTU(idx, ic.MTU); err != nil {
				refused = append(refused, fmt.Errorf("MTU %d on %s: %w", ic.MTU, name, err))
			} else {
				add(fmt.Sprintf("mtu %d", ic.MTU))
			}
		}
		if ic.Up {
			if err := w.setUp(idx); err != nil {
				refused = append(refused, fmt.Errorf("%s up: %w", name, err))
			} else {
				add("up")
			}
		}
		for _, p := range ic.Addrs {
			if err := w.addAddr(idx, p); err != nil && !errors.Is(err, unix.EEXIST) {
				refused = append(refused, fmt.Errorf("address %s on %s: %w", p, name, err))
			} else {
				add(p.String())
			}
		}
		for _, r := range ic.Routes {
			err := w.addRoute(idx, r)
			switch {
			case errors.Is(err, unix.EEXIST):
				// The kernel's own route of an address's subnet, back with it.
			case err != nil:
				refused = append(refused, fmt.Errorf("route to %s on %s: %w", r.Dst, name, err))
			default:
				rs := "route to " + r.Dst.String()
				if r.Gateway.IsValid() {
					rs += " via " + r.Gateway.String()
				}
				add(rs)
			}
		}
		if what != "" {
			done = append(done, name+": "+what)
		}
	}
	if len(refused) > 0 {
		return done, fmt.Errorf("%w: %w", ErrNetRestore, errors.Join(refused...))
	}
	return done, nil
}

// rtnetlink writes through an rtnetlink socket in the caller's network
// namespace.
type rtnetlink struct{}

func (rtnetlink) setUp(index int) error { return rtRequest(unix.RTM_NEWLINK, newLinkUpMsg(index)) }
func (rtnetlink) setMTU(index, mtu int) error {
	return rtRequest(unix.RTM_NEWLINK, newLinkMTUMsg(index, mtu))
}
func (rtnetlink) addAddr(index int, p netip.Prefix) error {
	return rtRequest(unix.RTM_NEWADDR, newAddrMsg(index, p))
}
func (rtnetlink) addRoute(index int, r Route) error {
	return rtRequest(unix.RTM_NEWROUTE, newRouteMsg(index, r))
}

// rtRequest sends one rtnetlink request and waits for its acknowledgement.
func rtRequest(typ uint16, body []byte) error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	const seq = 1
	flags := uint16(unix.NLM_F_REQUEST | unix.NLM_F_ACK)
	if typ != unix.RTM_NEWLINK {
		flags |= unix.NLM_F_CREATE | unix.NLM_F_EXCL
	}
	msg := make([]byte, unix.SizeofNlMsghdr, unix.SizeofNlMsghdr+len(body))
	binary.NativeEndian.PutUint32(msg[0:4], uint32(unix.SizeofNlMsghdr+len(body)))
	binary.NativeEndian.PutUint16(msg[4:6], typ)
	binary.NativeEndian.PutUint16(msg[6:8], flags)
	binary.NativeEndian.PutUint32(msg[8:12], seq)
	msg = append(msg, body...)
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	buf := make([]byte, 8192)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return err
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Header.Seq != seq || m.Header.Type != unix.NLMSG_ERROR {
				continue
			}
			if len(m.Data) < 4 {
				return errors.New("short netlink acknowledgement")
			}
			if code := int32(binary.NativeEndian.Uint32(m.Data[0:4])); code != 0 {
				return syscall.Errno(-code)
			}
			return nil
		}
	}
}

// rtAttr appends one rtnetlink attribute, padded to 4 bytes.
func rtAttr(b []byte, typ uint16, v []byte) []byte {
	l := unix.SizeofRtAttr + len(v)
	b = binary.NativeEndian.AppendUint16(b, uint16(l))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, v...)
	return append(b, make([]byte, (4-l%4)%4)...)
}

// newLinkUpMsg is an ifinfomsg that sets IFF_UP on interface index.
func newLinkUpMsg(index int) []byte {
	b := make([]byte, unix.SizeofIfInfomsg)
	b[0] = unix.AF_UNSPEC
	binary.NativeEndian.PutUint32(b[4:8], uint32(index))
	binary.NativeEndian.PutUint32(b[8:12], unix.IFF_UP)  // flags
	binary.NativeEndian.PutUint32(b[12:16], unix.IFF_UP) // change
	return b
}

// newLinkMTUMsg is an ifinfomsg that sets interface index's MTU.
func newLinkMTUMsg(index, mtu int) []byte {
	b := make([]byte, unix.SizeofIfInfomsg)
	b[0] = unix.AF_UNSPEC
	binary.NativeEndian.PutUint32(b[4:8], uint32(index))
	return rtAttr(b, unix.IFLA_MTU, binary.NativeEndian.AppendUint32(nil, uint32(mtu)))
}

func addrFamily(a netip.Addr) byte {
	if a.Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

// newAddrMsg is an ifaddrmsg adding p to interface index.
func newAddrMsg(index int, p netip.Prefix) []byte {
	b := make([]byte, unix.SizeofIfAddrmsg)
	b[0], b[1] = addrFamily(p.Addr()), byte(p.Bits())
	binary.NativeEndian.PutUint32(b[4:8], uint32(index))
	ip := p.Addr().AsSlice()
	b = rtAttr(b, unix.IFA_LOCAL, ip)
	return rtAttr(b, unix.IFA_ADDRESS, ip)
}

// newRouteMsg is an rtmsg adding r through interface index to the main table.
func newRouteMsg(index int, r Route) []byte {
	b := make([]byte, unix.SizeofRtMsg)
	b[0], b[1] = addrFamily(r.Dst.Addr()), byte(r.Dst.Bits())
	b[4] = unix.RT_TABLE_MAIN
	b[5] = unix.RTPROT_BOOT
	b[6] = unix.RT_SCOPE_LINK
	if r.Gateway.IsValid() {
		b[6] = unix.RT_SCOPE_UNIVERSE
	}
	b[7] = unix.RTN_UNICAST
	if r.Dst.Bits() > 0 {
		b = rtAttr(b, unix.RTA_DST, r.Dst.Masked().Addr().AsSlice())
	}
	if r.Gateway.IsValid() {
		b = rtAttr(b, unix.RTA_GATEWAY, r.Gateway.AsSlice())
	}
	return rtAttr(b, unix.RTA_OIF, binary.NativeEndian.AppendUint32(nil, uint32(index)))
}
