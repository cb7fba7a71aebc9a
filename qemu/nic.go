package qemu

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// Configuration errors.
var (
	// ErrNICUnavailable means the installed QEMU does not offer a requested NIC model.
	ErrNICUnavailable = errors.New("qemu: NIC model not offered by this QEMU")
	// ErrBadConfig means a Config, NIC or NIC spec is invalid.
	ErrBadConfig = errors.New("qemu: bad configuration")
)

// NICModel is a QEMU -device name of an emulated NIC.
type NICModel string

// NIC models the drivers target. Any other PCI NIC model the installed QEMU
// offers may be used too.
const (
	// VirtioNet is a modern-only virtio-net device behind the vIOMMU.
	VirtioNet NICModel = "virtio-net-pci"
	// E1000E is the Intel 82574L.
	E1000E NICModel = "e1000e"
	// IGB is the Intel 82576 (QEMU 8.0 and later).
	IGB NICModel = "igb"
	// VMXNET3 is VMware's paravirtual NIC.
	VMXNET3 NICModel = "vmxnet3"
)

// Binding says who drives a NIC in the guest.
type Binding string

// Bindings.
const (
	// BindVFIO binds the NIC to vfio-pci for a userspace driver (the default).
	BindVFIO Binding = "vfio"
	// BindLinux leaves the NIC to the guest kernel's driver and configures an IPv4 address.
	BindLinux Binding = "linux"
	// BindNone leaves the NIC without a driver.
	BindNone Binding = "none"
)

// NetdevKind is the QEMU backend a NIC is wired to.
type NetdevKind string

// Netdev kinds.
const (
	// NetNone connects the NIC to nothing (QEMU warns "has no peer").
	NetNone NetdevKind = ""
	// NetDgram exchanges frames with the host as UDP datagrams on 127.0.0.1,
	// one datagram per Ethernet frame.
	NetDgram NetdevKind = "dgram"
	// NetHub plugs the NIC into a QEMU hub; NICs on the same hub share a wire.
	NetHub NetdevKind = "hub"
	// NetTap gives the NIC a tap device with virtio-net headers
	// (IFF_VNET_HDR) on a bridge, the wire, in a network namespace that
	// Run makes for the guest and removes after it (see TapWires). NICs
	// on the same wire share it. Unlike hub and dgram, a tap backend
	// carries per-frame offload metadata, so QEMU offers virtio-net's
	// checksum and segmentation offloads (CSUM, GUEST_CSUM, HOST_TSO4/6,
	// GUEST_TSO4/6) on it. No interface of the machine is touched.
	NetTap NetdevKind = "tap"
)

// Netdev is the backend of one NIC.
type Netdev struct {
	// Kind selects the backend.
	Kind NetdevKind
	// QEMUPort is the 127.0.0.1 UDP port QEMU receives frames on (dgram):
	// the host sends frames for the guest to this port.
	QEMUPort int
	// HostPort is the 127.0.0.1 UDP port QEMU sends the guest's frames to
	// (dgram): the host listens on it.
	HostPort int
	// Hub is the hub id (hub).
	Hub int
	// Wire names the bridge the NIC's tap is on (tap): 1 to 12 letters,
	// digits or '_'.
	Wire string

	// fd is the descriptor number QEMU finds the tap on (tap; set by
	// Run's plan, 3 upwards in NIC order: exec.Cmd.ExtraFiles).
	fd int
}

// Dgram returns a dgram backend: QEMU receives on qemuPort and sends to hostPort.
func Dgram(qemuPort, hostPort int) Netdev {
	return Netdev{Kind: NetDgram, QEMUPort: qemuPort, HostPort: hostPort}
}

// Hub returns a backend on hub id.
func Hub(id int) Netdev { return Netdev{Kind: NetHub, Hub: id} }

// Tap returns a tap backend on the wire named wire (NetTap).
func Tap(wire string) Netdev { return Netdev{Kind: NetTap, Wire: wire} }

var wireRe = regexp.MustCompile(`^[A-Za-z0-9_]{1,12}$`)

// NewDgram returns a dgram backend on two free loopback UDP ports.
func NewDgram() (Netdev, error) {
	p, err := FreeUDPPorts(2)
	if err != nil {
		return Netdev{}, err
	}
	return Dgram(p[0], p[1]), nil
}

// FreeUDPPorts returns n distinct UDP ports free on 127.0.0.1 at the time
// of the call. All n sockets are held open together so the ports differ;
// another process may still take a port before QEMU binds it.
func FreeUDPPorts(n int) ([]int, error) {
	if n < 0 || n > 1024 {
		return nil, fmt.Errorf("%w: FreeUDPPorts(%d)", ErrBadConfig, n)
	}
	ports := make([]int, 0, n)
	conns := make([]net.PacketConn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range n {
		c, err := net.ListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("qemu: pick a free UDP port on 127.0.0.1: %w", err)
		}
		conns = append(conns, c)
		ports = append(ports, c.LocalAddr().(*net.UDPAddr).Port)
	}
	return ports, nil
}

// NIC is one emulated NIC of the guest.
type NIC struct {
	// Model is the QEMU device (VirtioNet, E1000E, IGB, VMXNET3, ...).
	Model NICModel
	// Packed selects packed virtqueues (virtio-net only); false is split.
	Packed bool
	// Slot is the device number on the root bus pcie.0, so the guest address
	// is 0000:00:<Slot>.0. Zero assigns the lowest free slot from 4 upwards.
	Slot int
	// MAC is the NIC's address; empty means 52:54:00:12:34:<slot>.
	MAC string
	// Bind says who drives the NIC in the guest; empty means BindVFIO.
	Bind Binding
	// IPv4 is the address with prefix length ("10.0.0.2/24") for BindLinux.
	IPv4 string
	// Net is the backend the NIC is wired to.
	Net Netdev
	// Props are QEMU device properties of the model, as `-device
	// MODEL,help` lists them: {"event_idx": "off", "mrg_rxbuf": "off",
	// "rx_queue_size": "1024", "host_mtu": "9000"} for virtio-net. Run
	// checks each name and value against the installed QEMU. The properties
	// the harness sets itself (see ReservedProps) are refused.
	Props map[string]string
}

// ReservedProps are the device properties the harness sets on every NIC,
// with the NIC field or reason that governs each; NIC.Props may not set them.
var ReservedProps = map[string]string{
	"id":             "the harness names each NIC nic<index>",
	"bus":            "NICs sit on pcie.0",
	"addr":           "use Slot (slot=)",
	"mac":            "use MAC (mac=)",
	"netdev":         "use Net (net=)",
	"packed":         "use Packed (packed=)",
	"disable-legacy": "vfnic drives modern virtio only",
	"iommu_platform": "without it virtio bypasses the vIOMMU and VFIO cannot work",
}

var propNameRe = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_.-]*$`)

// checkProps checks the form of NIC properties: a QEMU property name, and a
// value that cannot add options to the -device argument or split a
// ParseNICs list.
func checkProps(props map[string]string) error {
	for _, k := range sortedKeys(props) {
		v := props[k]
		if why, ok := ReservedProps[k]; ok {
			return fmt.Errorf("property %q is set by the harness (%s)", k, why)
		}
		if !propNameRe.MatchString(k) {
			return fmt.Errorf("property name %q (want letters, digits, '_', '-', '.')", k)
		}
		if v == "" || strings.ContainsAny(v, ",; \t\n=") {
			return fmt.Errorf("property %s=%q (want a non-empty value without ',', ';', '=' or spaces)", k, v)
		}
	}
	return nil
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// GuestAddr is the NIC's PCI address in the guest ("0000:00:04.0"). It is
// only meaningful once Slot is set (see ResolveNICs).
func (n NIC) GuestAddr() string { return fmt.Sprintf("0000:00:%02x.0", n.Slot) }

// q35 keeps slot 0 for the host bridge and 0x1f for the ICH9 functions.
const (
	firstAutoSlot = 4
	maxSlot       = 0x1e
)

// ResolveNICs returns a copy of nics with defaults filled in: slots (lowest
// free from 4 upwards, in order), MACs and bindings. It checks each NIC.
func ResolveNICs(nics []NIC) ([]NIC, error) {
	out := make([]NIC, len(nics))
	copy(out, nics)
	used := map[int]int{}
	for i, n := range out {
		if n.Slot == 0 {
			continue
		}
		if n.Slot < 1 || n.Slot > maxSlot {
			return nil, fmt.Errorf("%w: NIC %d: slot %#x outside 0x01..%#x", ErrBadConfig, i, n.Slot, maxSlot)
		}
		if j, dup := used[n.Slot]; dup {
			return nil, fmt.Errorf("%w: NICs %d and %d both on slot %#x", ErrBadConfig, j, i, n.Slot)
		}
		used[n.Slot] = i
	}
	next := firstAutoSlot
	for i := range out {
		n := &out[i]
		if n.Slot == 0 {
			for {
				if _, taken := used[next]; !taken {
					break
				}
				next++
			}
			if next > maxSlot {
				return nil, fmt.Errorf("%w: too many NICs for pcie.0", ErrBadConfig)
			}
			n.Slot = next
			used[next] = i
		}
		if n.Bind == "" {
			n.Bind = BindVFIO
		}
		if n.MAC == "" {
			n.MAC = fmt.Sprintf("52:54:00:12:34:%02x", n.Slot)
		}
		if err := n.check(); err != nil {
			return nil, fmt.Errorf("NIC %d (%s): %w", i, n.Model, err)
		}
	}
	return out, nil
}

func (n NIC) check() error {
	if n.Model == "" || strings.ContainsAny(string(n.Model), ", =") {
		return fmt.Errorf("%w: model %q", ErrBadConfig, n.Model)
	}
	if n.Packed && n.Model != VirtioNet {
		return fmt.Errorf("%w: packed rings are a virtio-net option", ErrBadConfig)
	}
	if err := checkProps(n.Props); err != nil {
		return fmt.Errorf("%w: %v", ErrBadConfig, err)
	}
	if _, err := net.ParseMAC(n.MAC); err != nil || strings.Count(n.MAC, ":") != 5 {
		return fmt.Errorf("%w: MAC %q", ErrBadConfig, n.MAC)
	}
	switch n.Bind {
	case BindVFIO, BindNone:
		if n.IPv4 != "" {
			return fmt.Errorf("%w: IPv4 %q given for a NIC bound to %s", ErrBadConfig, n.IPv4, n.Bind)
		}
	case BindLinux:
		if n.IPv4 != "" {
			p, err := netip.ParsePrefix(n.IPv4)
			if err != nil || !p.Addr().Is4() {
				return fmt.Errorf("%w: IPv4 %q is not an address/prefix", ErrBadConfig, n.IPv4)
			}
		}
	default:
		return fmt.Errorf("%w: binding %q", ErrBadConfig, n.Bind)
	}
	switch n.Net.Kind {
	case NetNone:
	case NetDgram:
		for _, p := range []int{n.Net.QEMUPort, n.Net.HostPort} {
			if p < 1 || p > 65535 {
				return fmt.Errorf("%w: dgram port %d", ErrBadConfig, p)
			}
		}
		if n.Net.QEMUPort == n.Net.HostPort {
			return fmt.Errorf("%w: dgram QEMU and host ports are both %d", ErrBadConfig, n.Net.QEMUPort)
		}
	case NetHub:
		if n.Net.Hub < 0 {
			return fmt.Errorf("%w: hub id %d", ErrBadConfig, n.Net.Hub)
		}
	case NetTap:
		if !wireRe.MatchString(n.Net.Wire) {
			return fmt.Errorf("%w: tap wire %q (want 1 to 12 letters, digits or '_')", ErrBadConfig, n.Net.Wire)
		}
	default:
		return fmt.Errorf("%w: netdev kind %q", ErrBadConfig, n.Net.Kind)
	}
	return nil
}

// qemuArgs returns the -netdev (if any) and -device arguments of a resolved NIC.
func (n NIC) qemuArgs(index int) []string {
	id := fmt.Sprintf("n%d", index)
	var args []string
	switch n.Net.Kind {
	case NetDgram:
		args = append(args, "-netdev", fmt.Sprintf(
			"dgram,id=%s,local.type=inet,local.host=127.0.0.1,local.port=%d,remote.type=inet,remote.host=127.0.0.1,remote.port=%d",
			id, n.Net.QEMUPort, n.Net.HostPort))
	case NetHub:
		args = append(args, "-netdev", fmt.Sprintf("hubport,id=%s,hubid=%d", id, n.Net.Hub))
	case NetTap:
		// The tap is opened by Run in the wire's namespace and handed
		// over open: QEMU stays in the machine's namespace. QEMU finds
		// IFF_VNET_HDR on the descriptor itself (vnet_hdr= is refused
		// beside fd=).
		args = append(args, "-netdev", fmt.Sprintf("tap,id=%s,fd=%d", id, n.Net.fd))
	}
	dev := fmt.Sprintf("%s,id=nic%d,bus=pcie.0,addr=%#02x,mac=%s", n.Model, index, n.Slot, n.MAC)
	if n.Net.Kind != NetNone {
		dev += ",netdev=" + id
	}
	if n.Model == VirtioNet {
		// Modern only, translated by the vIOMMU (without iommu_platform
		// virtio bypasses it), ATS offered.
		dev += ",disable-legacy=on,iommu_platform=on,packed=" + onOff(n.Packed)
		if _, set := n.Props["ats"]; !set {
			dev += ",ats=on"
		}
	}
	for _, k := range sortedKeys(n.Props) {
		dev += "," + k + "=" + n.Props[k]
	}
	return append(args, "-device", dev)
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// LinuxModules lists the guest kernel modules that drive a model (loaded
// for BindLinux NICs, or by a caller that hands a NIC to Linux later).
func LinuxModules(m NICModel) []string {
	switch m {
	case VirtioNet:
		return []string{"virtio_pci", "virtio_net"}
	case E1000E:
		return []string{"e1000e"}
	case IGB:
		return []string{"igb"}
	case VMXNET3:
		return []string{"vmxnet3"}
	}
	return nil
}

var modelAliases = map[string]NICModel{
	"virtio": VirtioNet, "virtio-net": VirtioNet, "virtio-net-pci": VirtioNet,
	"e1000e": E1000E, "igb": IGB, "vmxnet3": VMXNET3,
}

// ParseNICs parses a NIC list such as
//
//	"virtio,packed=on,net=hub:0 e1000e,net=hub:0 igb,bind=linux,ip=10.0.0.2/24"
//
// NICs are separated by spaces or ';'; each is a model (virtio, e1000e, igb,
// vmxnet3 or any QEMU NIC device name) followed by ",key=value" options:
// packed=on|off, slot=N (0x.. for hex), mac=..., bind=vfio|linux|none,
// ip=A.B.C.D/N (implies bind=linux), net=none|hub:ID|dgram:QEMUPORT:HOSTPORT|tap:WIRE.
// Any other key=value is a QEMU device property of the model (NIC.Props),
// as on QEMU's own -device line: "virtio,event_idx=off,host_mtu=9000".
// FormatNICs writes the same syntax. A list ParseNICs accepts, ResolveNICs
// accepts too.
func ParseNICs(spec string) ([]NIC, error) {
	var out []NIC
	for _, item := range strings.FieldsFunc(spec, func(r rune) bool { return r == ';' || r == ' ' || r == '\t' || r == '\n' }) {
		n, err := parseNIC(item)
		if err != nil {
			return nil, fmt.Errorf("%w: NIC %q: %v", ErrBadConfig, item, err)
		}
		out = append(out, n)
	}
	// What ParseNICs accepts, ResolveNICs (and so a boot) accepts, and
	// FormatNICs writes back unchanged: a packed=on on a model that has no
	// packed ring would be dropped by FormatNICs, for one.
	if _, err := ResolveNICs(out); err != nil {
		return nil, err
	}
	return out, nil
}

func parseNIC(item string) (NIC, error) {
	parts := strings.Split(item, ",")
	var n NIC
	if parts[0] == "" || strings.Contains(parts[0], "=") {
		return n, errors.New("no model: a NIC starts with one (virtio, e1000e, igb, vmxnet3 or a QEMU NIC device name)")
	}
	n.Model = NICModel(parts[0])
	if m, ok := modelAliases[parts[0]]; ok {
		n.Model = m
	}
	for _, kv := range parts[1:] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return n, fmt.Errorf("option %q is not key=value", kv)
		}
		switch k {
		case "packed":
			switch v {
			case "on", "true", "1":
				n.Packed = true
			case "off", "false", "0":
				n.Packed = false
			default:
				return n, fmt.Errorf("packed=%q", v)
			}
		case "slot":
			s, err := strconv.ParseInt(v, 0, 0)
			if err != nil {
				return n, fmt.Errorf("slot=%q", v)
			}
			n.Slot = int(s)
		case "mac":
			n.MAC = v
		case "bind":
			n.Bind = Binding(v)
		case "ip":
			n.IPv4 = v
			if n.Bind == "" {
				n.Bind = BindLinux
			}
		case "net":
			nd, err := parseNetdev(v)
			if err != nil {
				return n, err
			}
			n.Net = nd
		default:
			if _, dup := n.Props[k]; dup {
				return n, fmt.Errorf("property %q given twice", k)
			}
			if n.Props == nil {
				n.Props = map[string]string{}
			}
			n.Props[k] = v
		}
	}
	if err := checkProps(n.Props); err != nil {
		return n, err
	}
	return n, nil
}

func parseNetdev(v string) (Netdev, error) {
	f := strings.Split(v, ":")
	switch {
	case v == "none" || v == "":
		return Netdev{}, nil
	case f[0] == "hub" && len(f) == 2:
		id, err := strconv.Atoi(f[1])
		if err != nil {
			return Netdev{}, fmt.Errorf("net=%q", v)
		}
		return Hub(id), nil
	case f[0] == "dgram" && len(f) == 3:
		a, err1 := strconv.Atoi(f[1])
		b, err2 := strconv.Atoi(f[2])
		if err1 != nil || err2 != nil {
			return Netdev{}, fmt.Errorf("net=%q", v)
		}
		return Dgram(a, b), nil
	case f[0] == "tap" && len(f) == 2:
		return Tap(f[1]), nil
	}
	return Netdev{}, fmt.Errorf("net=%q (want none, hub:ID, dgram:QEMUPORT:HOSTPORT or tap:WIRE)", v)
}

// FormatNICs writes NICs in the syntax ParseNICs reads, one per ';'.
func FormatNICs(nics []NIC) string {
	items := make([]string, len(nics))
	for i, n := range nics {
		s := string(n.Model)
		if n.Model == VirtioNet {
			s += ",packed=" + onOff(n.Packed)
		}
		if n.Slot != 0 {
			s += fmt.Sprintf(",slot=%#02x", n.Slot)
		}
		if n.MAC != "" {
			s += ",mac=" + n.MAC
		}
		if n.Bind != "" {
			s += ",bind=" + string(n.Bind)
		}
		if n.IPv4 != "" {
			s += ",ip=" + n.IPv4
		}
		switch n.Net.Kind {
		case NetHub:
			s += fmt.Sprintf(",net=hub:%d", n.Net.Hub)
		case NetDgram:
			s += fmt.Sprintf(",net=dgram:%d:%d", n.Net.QEMUPort, n.Net.HostPort)
		case NetTap:
			s += ",net=tap:" + n.Net.Wire
		}
		for _, k := range sortedKeys(n.Props) {
			s += "," + k + "=" + n.Props[k]
		}
		items[i] = s
	}
	return strings.Join(items, ";")
}
