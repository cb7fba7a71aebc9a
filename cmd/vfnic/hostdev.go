package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/vfnic/vfnic/nic"
	_ "github.com/vfnic/vfnic/nic/afpacket" // registers the afpacket scheme: host interfaces through AF_PACKET
	"github.com/vfnic/vfnic/nic/afxdp"      // registers the afxdp scheme: host interfaces through AF_XDP
	"github.com/vfnic/vfnic/pci"
)

// hostNames is what the help of every traffic command says about device
// names that are not PCI functions.
const hostNames = `A device is a PCI address of a NIC bound to vfio-pci ("0000:00:04.0"), or a host interface:
  afxdp:IF       queue 0 of interface IF through AF_XDP sockets (queues 0.. with -queues)
  afxdp:IF@Q     queue Q (and up) of IF
  afpacket:IF    IF through AF_PACKET sockets (-queues N: N sockets sharing its frames by flow), where AF_XDP is missing
The kernel keeps a host interface: frames the program does not take go on to its stack.
With afxdp, -force detaches an XDP program someone else attached through netlink (as
'ip link set dev IF xdp off'; without -force it is refused, never replaced); one held by
another process's bpf_link stays. -force means nothing to afpacket. A softnic: pair has
no peer in one vfnic process: it is for programs and tests that open both ends.`

// devName is a checked device argument: a PCI address, or a name of a
// registered scheme ("afxdp:eth1").
type devName struct {
	arg  string
	addr pci.Address
	pci  bool // addr is set
}

// String is the device's name: a PCI address in its full form.
func (d devName) String() string {
	if d.pci {
		return d.addr.String()
	}
	return d.arg
}

// parseDevice checks a device argument before anything is opened: a
// malformed PCI address or host name is a usage error.
func parseDevice(s string) (devName, error) {
	scheme, rest, ok := strings.Cut(s, ":")
	if ok && slices.Contains(nic.Schemes(), scheme) {
		if err := checkSchemeName(scheme, rest); err != nil {
			// "usage: afxdp: ...", not "usage: invalid argument: afxdp: ...".
			return devName{}, fmt.Errorf("%w: %s", errUsage, strings.TrimPrefix(err.Error(), nic.ErrInvalid.Error()+": "))
		}
		return devName{arg: s}, nil
	}
	a, err := pci.ParseAddress(s)
	if err != nil {
		hint := ""
		if ok && !strings.ContainsAny(scheme, "0123456789") {
			hint = " (a host interface is named afxdp:IF, afxdp:IF@QUEUE or afpacket:IF)"
		}
		if scheme == "softnic" {
			hint = " (softnic is not in this binary: a pair has no peer in one vfnic process)"
		}
		return devName{}, fmt.Errorf("%w: %v%s", errUsage, err, hint)
	}
	return devName{arg: s, addr: a, pci: true}, nil
}

// parseDevices is parseDevice for each argument; at least one.
func parseDevices(args []string) ([]devName, error) {
	if len(args) == 0 {
		return nil, fmt.Errorf("%w: name at least one PCI address or host interface (afxdp:IF, afpacket:IF; see 'vfnic list')", errUsage)
	}
	ds := make([]devName, len(args))
	for i, s := range args {
		var err error
		if ds[i], err = parseDevice(s); err != nil {
			return nil, err
		}
	}
	return ds, nil
}

// checkSchemeName checks what follows "scheme:" as the driver would, so
// that a malformed name is a usage error and not a failed open.
func checkSchemeName(scheme, rest string) error {
	switch scheme {
	case "afxdp":
		_, _, err := afxdp.ParseName(rest)
		return err
	case "afpacket":
		// As afpacket.Open checks it.
		if rest == "" || len(rest) >= unix.IFNAMSIZ || strings.ContainsAny(rest, "/:@ \t") {
			return fmt.Errorf("afpacket: interface name %q (want afpacket:IFNAME)", rest)
		}
	}
	return nil
}

// hostIface is one row of 'vfnic list”s host interface section.
type hostIface struct {
	Name   string `json:"name"`
	Driver string `json:"driver"`
	MAC    string `json:"mac"`
	Up     bool   `json:"up"`
	// XDP is the attach mode of an XDP program on the interface ("native",
	// "generic", "offload", "multi"), "" for none: afxdp refuses an
	// interface with someone else's program unless -force.
	XDP string `json:"xdp"`
	// Names are the device names vfnic opens it by.
	Names []string `json:"names"`
}

// hostIfaces lists the Ethernet interfaces of this network namespace (not
// loopback): what afxdp: and afpacket: open. It only reads.
func hostIfaces() ([]hostIface, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	xdp, xerr := xdpModes()
	out := []hostIface{}
	for _, ifc := range ifs {
		if ifc.Flags&net.FlagLoopback != 0 || len(ifc.HardwareAddr) != 6 {
			continue
		}
		h := hostIface{Name: ifc.Name, Driver: ifaceDriver(ifc.Name), MAC: ifc.HardwareAddr.String(),
			Up: ifc.Flags&net.FlagUp != 0, XDP: xdp[ifc.Index], Names: []string{}}
		for _, s := range nic.Schemes() {
			if s == "afxdp" || s == "afpacket" {
				h.Names = append(h.Names, s+":"+ifc.Name)
			}
		}
		out = append(out, h)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	if xerr != nil {
		return out, fmt.Errorf("XDP programs not read: %w", xerr)
	}
	return out, nil
}

// ifaceDriver is the interface's kernel driver as ethtool names it
// ("veth", "virtio_net"), or its sysfs driver link, or "-".
func ifaceDriver(name string) string {
	if fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0); err == nil {
		info, err := unix.IoctlGetEthtoolDrvinfo(fd, name)
		unix.Close(fd)
		if err == nil {
			if s := unix.ByteSliceToString(info.Driver[:]); s != "" {
				return s
			}
		}
	}
	if l, err := os.Readlink(filepath.Join("/sys/class/net", name, "device/driver")); err == nil {
		return filepath.Base(l)
	}
	return "-"
}

// Netlink attributes of an XDP program on a link (linux/if_link.h).
const (
	iflaXDP         = 43
	iflaXDPAttached = 2
)

// xdpModes reads, through one netlink link dump, the attach mode of the
// XDP program on each interface index that has one.
func xdpModes() (map[int]string, error) {
	b, err := syscall.NetlinkRIB(unix.RTM_GETLINK, unix.AF_UNSPEC)
	if err != nil {
		return nil, err
	}
	msgs, err := syscall.ParseNetlinkMessage(b)
	if err != nil {
		return nil, err
	}
	modes := map[int]string{}
	for i := range msgs {
		m := &msgs[i]
		if m.Header.Type != unix.RTM_NEWLINK || len(m.Data) < unix.SizeofIfInfomsg {
			continue
		}
		index := int(int32(binary.NativeEndian.Uint32(m.Data[4:8])))
		attrs, err := syscall.ParseNetlinkRouteAttr(m)
		if err != nil {
			continue
		}
		for _, a := range attrs {
			if a.Attr.Type&^unix.NLA_F_NESTED != iflaXDP {
				continue
			}
			if mode := xdpAttached(a.Value); mode != "" {
				modes[index] = mode
			}
		}
	}
	return modes, nil
}

// xdpAttached reads IFLA_XDP_ATTACHED from IFLA_XDP's nested attributes,
// checking each length against what is left.
func xdpAttached(b []byte) string {
	for len(b) >= 4 {
		l, typ := int(binary.NativeEndian.Uint16(b[0:2])), binary.NativeEndian.Uint16(b[2:4])&^unix.NLA_F_NESTED
		if l < 4 || l > len(b) {
			return ""
		}
		if typ == iflaXDPAttached && l >= 5 {
			switch b[4] {
			case 0:
				return ""
			case 1:
				return "native"
			case 2:
				return "generic"
			case 3:
				return "offload"
			case 4:
				return "multi"
			default:
				return "mode " + strconv.Itoa(int(b[4]))
			}
		}
		b = b[min((l+3)&^3, len(b)):]
	}
	return ""
}

// hostCheck is one line of doctor's host device section: whether the
// afxdp or afpacket driver can work here, and why not.
type hostCheck struct {
	Driver string `json:"driver"`
	Works  bool   `json:"works"`
	Detail string `json:"detail"`
}

// Capability bits of /proc/self/status's CapEff (linux/capability.h).
const (
	capNetAdmin = 12
	capNetRaw   = 13
	capSysAdmin = 21
	capBPF      = 39
)

// effectiveCaps reads this process's effective capabilities.
func effectiveCaps() (uint64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		}
	}
	return 0, errors.New("no CapEff in /proc/self/status")
}

// hostChecks says whether AF_XDP and AF_PACKET work here. They only make
// and close sockets and an XSKMAP: no interface is touched.
func hostChecks() []hostCheck {
	var uts unix.Utsname
	kernel := "?"
	if unix.Uname(&uts) == nil {
		kernel = unix.ByteSliceToString(uts.Release[:])
	}
	caps, cerr := effectiveCaps()
	has := func(bit uint) bool { return cerr == nil && caps&(1<<bit) != 0 }
	capText := func(names ...string) string {
		if cerr != nil {
			return "capabilities unread: " + cerr.Error()
		}
		return "has " + strings.Join(names, ", ")
	}
	var missing []string
	for _, c := range []struct {
		bit  uint
		name string
	}{{capNetRaw, "CAP_NET_RAW"}, {capNetAdmin, "CAP_NET_ADMIN"}} {
		if !has(c.bit) {
			missing = append(missing, c.name)
		}
	}
	if !has(capBPF) && !has(capSysAdmin) {
		missing = append(missing, "CAP_BPF (or CAP_SYS_ADMIN)")
	}

	xdp := hostCheck{Driver: "afxdp"}
	switch fd, err := unix.Socket(unix.AF_XDP, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0); {
	case errors.Is(err, unix.EAFNOSUPPORT):
		xdp.Detail = fmt.Sprintf("kernel %s has no AF_XDP sockets (CONFIG_XDP_SOCKETS off, or older than 4.18)", kernel)
	case err != nil:
		xdp.Detail = fmt.Sprintf("an AF_XDP socket is refused: %v (needs root, or CAP_NET_RAW)", err)
	default:
		unix.Close(fd)
		m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.XSKMap, KeySize: 4, ValueSize: 4, MaxEntries: 1})
		switch {
		case err != nil:
			xdp.Detail = fmt.Sprintf("the bpf syscall refuses an XSKMAP: %v (needs CAP_BPF and CAP_NET_ADMIN, or root; kernel %s)", err, kernel)
		case len(missing) > 0:
			m.Close()
			xdp.Detail = "missing " + strings.Join(missing, ", ") + " to attach the XDP program"
		default:
			m.Close()
			xdp.Works = true
			xdp.Detail = fmt.Sprintf("kernel %s: AF_XDP sockets and the bpf syscall work; %s", kernel, capText("CAP_NET_RAW", "CAP_NET_ADMIN", "CAP_BPF"))
		}
	}

	pkt := hostCheck{Driver: "afpacket"}
	if fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0); err != nil {
		pkt.Detail = fmt.Sprintf("an AF_PACKET socket is refused: %v (needs root, or CAP_NET_RAW; CONFIG_PACKET)", err)
	} else {
		unix.Close(fd)
		pkt.Works = true
		pkt.Detail = fmt.Sprintf("kernel %s: AF_PACKET sockets work; %s", kernel, capText("CAP_NET_RAW"))
	}
	return []hostCheck{xdp, pkt}
}
