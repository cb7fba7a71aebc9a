package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vfnic/vfnic/pci"
	"golang.org/x/sys/unix"
)

// netSnapshot is what the kernel had configured on a NIC's interfaces
// when -force took the NIC: vfnic gives it back when the NIC returns to
// its kernel driver, as the driver's unbind took it away.
type netSnapshot struct {
	addr   pci.Address
	ifaces []ifaceSnapshot
}

// ifaceSnapshot is one interface's state.
type ifaceSnapshot struct {
	name   string
	index  int // the kernel's ifindex: a new one means the driver made it again
	up     bool
	addrs  []netip.Prefix // without IPv6 link-local ones: the kernel makes those
	routes []pci.Route    // leaving through it, outside the local table
}

// snapshotNet reads the state of a's interfaces; nil when it has none
// worth restoring (no interface, down, no address, no route).
func snapshotNet(sys pci.Sysfs, ns pci.NetState, a pci.Address) (*netSnapshot, error) {
	d, err := sys.Lookup(a)
	if err != nil || len(d.NetInterfaces) == 0 {
		return nil, err
	}
	if ns == nil {
		ns = pci.Netlink()
	}
	addrs, err := ns.Addrs()
	if err != nil {
		return nil, err
	}
	routes, err := ns.Routes()
	if err != nil {
		return nil, err
	}
	s := &netSnapshot{addr: a}
	for _, name := range d.NetInterfaces {
		dir := filepath.Join(sysRoot(sys), "class", "net", name)
		idx, err := readInt(filepath.Join(dir, "ifindex"))
		if err != nil {
			return nil, err
		}
		flags, err := readInt(filepath.Join(dir, "flags"))
		if err != nil {
			return nil, err
		}
		is := ifaceSnapshot{name: name, index: idx, up: flags&unix.IFF_UP != 0}
		for _, ad := range addrs {
			if ad.Index == idx && !ad.Prefix.Addr().IsLinkLocalUnicast() {
				is.addrs = append(is.addrs, ad.Prefix)
			}
		}
		for _, r := range routes {
			if r.Index == idx && !r.Dst.Addr().IsLinkLocalUnicast() && !r.Dst.Addr().IsMulticast() {
				is.routes = append(is.routes, r)
			}
		}
		if is.up || len(is.addrs) > 0 || len(is.routes) > 0 {
			s.ifaces = append(s.ifaces, is)
		}
	}
	if len(s.ifaces) == 0 {
		return nil, nil
	}
	return s, nil
}

// kernelState is what -force took from the kernel, to give back.
type kernelState struct {
	snaps []*netSnapshot
}

// take warns on warn what -force takes from the kernel (forceWarning) and
// remembers the interfaces' state.
func (k *kernelState) take(a pci.Address, warn io.Writer) {
	w := forceWarning(pci.Sysfs{}, nil, a)
	if w == "" {
		return
	}
	fmt.Fprintln(warn, w)
	s, err := snapshotNet(pci.Sysfs{}, nil, a)
	if err != nil {
		fmt.Fprintf(warn, "warning: %s: its interfaces' state not read (%v): configure them again by hand on exit\n", a, err)
		return
	}
	if s != nil {
		k.snaps = append(k.snaps, s)
	}
}

// giveBack restores what take remembered, once the devices are closed,
// saying what it did on out.
func (k *kernelState) giveBack(out io.Writer) {
	for _, s := range k.snaps {
		if m := s.restore(context.Background(), pci.Sysfs{}); m != "" {
			fmt.Fprintln(out, m)
		}
	}
	k.snaps = nil
}

func readInt(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 0, 64)
	return int(v), err
}

// restoreWait bounds how long restore waits for the kernel driver to make
// the interfaces again.
const restoreWait = 5 * time.Second

// restore gives the NIC's interfaces, made again by its kernel driver,
// their state back: up, addresses, then routes (a gateway needs its
// subnet first). It returns a line saying what it did, or why not: the
// kernel may refuse some (the driver took another name, a route's gateway
// is gone), which is reported, never fatal.
func (s *netSnapshot) restore(ctx context.Context, sys pci.Sysfs) string {
	ctx, cancel := context.WithTimeout(ctx, restoreWait)
	defer cancel()
	var names []string
	for {
		d, err := sys.Lookup(s.addr)
		if err == nil && d.Driver != "" && d.Driver != pci.VFIODriver && len(d.NetInterfaces) > 0 {
			names = d.NetInterfaces
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Sprintf("%s: its interfaces did not come back within %v: configure them again by hand", s.addr, restoreWait)
		case <-time.After(50 * time.Millisecond):
		}
	}
	var done, failed []string
	for i, is := range s.ifaces {
		name := is.name
		if !slices.Contains(names, name) {
			// The driver named it anew (the old name taken meanwhile): the
			// interfaces come back in the same order.
			if i >= len(names) {
				failed = append(failed, fmt.Sprintf("%s: not found", is.name))
				continue
			}
			name = names[i]
		}
		idx, err := readInt(filepath.Join(sysRoot(sys), "class", "net", name, "ifindex"))
		if err != nil {
			failed = append(failed, fmt.Sprintf("%s: %v", name, err))
			continue
		}
		if idx == is.index {
			continue // never went away: the NIC was not taken
		}
		var what []string
		if is.up {
			if err := rtRequest(unix.RTM_NEWLINK, linkUpMsg(idx)); err != nil {
				failed = append(failed, fmt.Sprintf("%s up: %v", name, err))
			} else {
				what = append(what, "up")
			}
		}
		for _, p := range is.addrs {
			if err := rtRequest(unix.RTM_NEWADDR, addrMsg(idx, p)); err != nil && !errors.Is(err, unix.EEXIST) {
				failed = append(failed, fmt.Sprintf("address %s on %s: %v", p, name, err))
			} else {
				what = append(what, p.String())
			}
		}
		for _, r := range is.routes {
			err := rtRequest(unix.RTM_NEWROUTE, routeMsg(idx, r))
			switch {
			case errors.Is(err, unix.EEXIST):
				// The kernel's own route of an address's subnet, back with it.
			case err != nil:
				failed = append(failed, fmt.Sprintf("route to %s on %s: %v", r.Dst, name, err))
			default:
				w := "route to " + r.Dst.String()
				if r.Gateway.IsValid() {
					w += " via " + r.Gateway.String()
				}
				what = append(what, w)
			}
		}
		if len(what) > 0 {
			done = append(done, name+": "+strings.Join(what, ", "))
		}
	}
	if len(done) == 0 && len(failed) == 0 {
		return ""
	}
	msg := fmt.Sprintf("gave %s's interfaces back what they had: %s", s.addr, strings.Join(done, "; "))
	if len(done) == 0 {
		msg = fmt.Sprintf("gave %s's interfaces back nothing", s.addr)
	}
	if len(failed) > 0 {
		msg += "; the kernel refused " + strings.Join(failed, "; ") + " (configure those again by hand)"
	}
	return msg
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
	msg := make([]byte, unix.SizeofNlMsghdr, unix.SizeofNlMsghdr+len(body))
	binary.NativeEndian.PutUint32(msg[0:4], uint32(unix.SizeofNlMsghdr+len(body)))
	binary.NativeEndian.PutUint16(msg[4:6], typ)
	flags := uint16(unix.NLM_F_REQUEST | unix.NLM_F_ACK)
	if typ != unix.RTM_NEWLINK {
		flags |= unix.NLM_F_CREATE | unix.NLM_F_EXCL
	}
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

// linkUpMsg is an ifinfomsg that sets IFF_UP on interface idx.
func linkUpMsg(idx int) []byte {
	b := make([]byte, unix.SizeofIfInfomsg)
	b[0] = unix.AF_UNSPEC
	binary.NativeEndian.PutUint32(b[4:8], uint32(idx))
	binary.NativeEndian.PutUint32(b[8:12], unix.IFF_UP)  // flags
	binary.NativeEndian.PutUint32(b[12:16], unix.IFF_UP) // change
	return b
}

func family(a netip.Addr) byte {
	if a.Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

// addrMsg is an ifaddrmsg adding p to interface idx.
func addrMsg(idx int, p netip.Prefix) []byte {
	b := make([]byte, unix.SizeofIfAddrmsg)
	b[0], b[1] = family(p.Addr()), byte(p.Bits())
	binary.NativeEndian.PutUint32(b[4:8], uint32(idx))
	ip := p.Addr().AsSlice()
	b = rtAttr(b, unix.IFA_LOCAL, ip)
	return rtAttr(b, unix.IFA_ADDRESS, ip)
}

// routeMsg is an rtmsg adding r through interface idx to the main table.
func routeMsg(idx int, r pci.Route) []byte {
	b := make([]byte, unix.SizeofRtMsg)
	b[0], b[1] = family(r.Dst.Addr()), byte(r.Dst.Bits())
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
	return rtAttr(b, unix.RTA_OIF, binary.NativeEndian.AppendUint32(nil, uint32(idx)))
}
