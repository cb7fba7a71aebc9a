package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/vfnic/vfnic/doctor"
	"github.com/vfnic/vfnic/pci"
)

// nicNames names the NICs vfnic knows, by vendor and device ID.
var nicNames = map[[2]uint16]string{
	{0x1af4, 0x1041}: "virtio-net (modern)",
	{0x1af4, 0x1000}: "virtio-net (transitional)",
	{0x8086, 0x10d3}: "Intel 82574L (e1000e)",
	{0x8086, 0x10c9}: "Intel 82576 (igb)",
	{0x8086, 0x100e}: "Intel 82540EM (e1000)",
	{0x15ad, 0x07b0}: "VMware VMXNET3",
}

func nicName(d pci.Device) string {
	if n, ok := nicNames[[2]uint16{d.VendorID, d.DeviceID}]; ok {
		return n
	}
	if !d.IsNetwork() {
		return fmt.Sprintf("class %06x", d.Class)
	}
	return "network controller"
}

// listedDevice is one row of 'vfnic list', and its -json form.
type listedDevice struct {
	Address    string   `json:"address"`
	VendorID   string   `json:"vendor_id"`
	DeviceID   string   `json:"device_id"`
	Name       string   `json:"name"`
	Driver     string   `json:"driver"`
	IOMMUGroup int      `json:"iommu_group"` // -1: none
	Interfaces []string `json:"interfaces"`
	// MAC is the first interface's address, "" when the device has no
	// kernel interface (on vfio-pci or no driver, the MAC is the device's
	// to tell: 'vfnic info').
	MAC string `json:"mac"`
	// Active lists why the kernel is using the device (interface up,
	// addresses, routes): binding it would take that away.
	Active []string `json:"active"`
	VFIO   bool     `json:"vfio_bound"`
}

// listOutput is 'vfnic list -json'.
type listOutput struct {
	Devices []listedDevice `json:"devices"`
	// VFIOReady is false when VFIO cannot work on the machine; Warnings
	// then says why, and names devices that could not be read.
	VFIOReady bool     `json:"vfio_ready"`
	Warnings  []string `json:"warnings"`
	// Host are the interfaces of this network namespace that afxdp: and
	// afpacket: open (no VFIO needed).
	Host []hostIface `json:"host_interfaces"`
}

func runList(_ context.Context, args []string, o stdio) error {
	fs := newFlags("list", "[-all] [-json]")
	all := fs.Bool("all", false, "list every PCI device, not only network controllers")
	asJSON := fs.Bool("json", false, "print JSON for scripts")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("%w: list takes no arguments", errUsage)
	}
	lo := listOutput{Devices: []listedDevice{}, Warnings: []string{}}
	sys := pci.Sysfs{}
	devs, err := sys.List(pci.ListOptions{NetworkOnly: !*all})
	if err != nil && len(devs) == 0 && !errors.Is(err, pci.ErrUnreadable) {
		return err
	}
	if err != nil {
		lo.Warnings = append(lo.Warnings, strings.Split(err.Error(), "\n")...)
	}
	for _, d := range devs {
		ld := listedDevice{Address: d.Address.String(), VendorID: fmt.Sprintf("%04x", d.VendorID), DeviceID: fmt.Sprintf("%04x", d.DeviceID),
			Name: nicName(d), Driver: d.Driver, IOMMUGroup: d.IOMMUGroup, Interfaces: d.NetInterfaces, Active: []string{},
			VFIO: d.Driver == pci.VFIODriver}
		if ld.Interfaces == nil {
			ld.Interfaces = []string{}
		}
		for _, ifn := range d.NetInterfaces {
			if mac, err := os.ReadFile(filepath.Join(sysRoot(sys), "class/net", ifn, "address")); err == nil {
				ld.MAC = strings.TrimSpace(string(mac))
				break
			}
		}
		if len(d.NetInterfaces) > 0 {
			reasons, err := sys.InUse(d.Address, nil)
			if err != nil {
				lo.Warnings = append(lo.Warnings, fmt.Sprintf("%s: in-use check: %v", d.Address, err))
			}
			ld.Active = append(ld.Active, reasons...)
		}
		lo.Devices = append(lo.Devices, ld)
	}
	host, herr := hostIfaces()
	if herr != nil {
		lo.Warnings = append(lo.Warnings, "host interfaces: "+herr.Error())
	}
	lo.Host = host
	if lo.Host == nil {
		lo.Host = []hostIface{}
	}
	if rerr := doctor.Run(doctor.Env{}).Err(); rerr != nil {
		lo.Warnings = append(lo.Warnings, strings.TrimPrefix(rerr.Error(), "doctor: "))
	} else {
		lo.VFIOReady = true
	}
	if *asJSON {
		enc := json.NewEncoder(o.out)
		enc.SetIndent("", "  ")
		return enc.Encode(lo)
	}
	return printList(o, lo)
}

// sysRoot is where s reads sysfs.
func sysRoot(s pci.Sysfs) string {
	if s.Root == "" {
		return pci.DefaultRoot
	}
	return s.Root
}

// printList prints the table on stdout, and its legend and the warnings
// on stderr, so that the table alone can go through a pipe.
func printList(o stdio, lo listOutput) error {
	tw := tabwriter.NewWriter(o.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ADDRESS\tID\tNAME\tDRIVER\tGROUP\tINTERFACES\tMAC\tVFIO")
	active, xdpSeen := false, false
	for _, d := range lo.Devices {
		drv, grp, vf := d.Driver, fmt.Sprint(d.IOMMUGroup), "no"
		if drv == "" {
			drv = "-"
		}
		if d.IOMMUGroup < 0 {
			grp = "-"
		}
		if d.VFIO {
			vf = "bound"
		}
		ifs := strings.Join(d.Interfaces, ",")
		if ifs == "" {
			ifs = "-"
		}
		if len(d.Active) > 0 {
			// dpdk-devbind's mark: binding this NIC takes it from the kernel.
			ifs += " *Active*"
			active = true
		}
		mac := d.MAC
		if mac == "" {
			mac = "-"
		}
		fmt.Fprintf(tw, "%s\t%s:%s\t%s\t%s\t%s\t%s\t%s\t%s\n", d.Address, d.VendorID, d.DeviceID, d.Name, drv, grp, ifs, mac, vf)
	}
	if len(lo.Devices) == 0 {
		fmt.Fprintln(tw, "(no network controllers)")
	}
	fmt.Fprintln(tw, "\nHOST INTERFACE\tDRIVER\tMAC\tSTATE\tXDP\tOPEN AS")
	for _, h := range lo.Host {
		state, xdp := "down", "-"
		if h.Up {
			state = "up"
		}
		if h.XDP != "" {
			xdp = h.XDP + " *XDP*"
			xdpSeen = true
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", h.Name, h.Driver, h.MAC, state, xdp, strings.Join(h.Names, " "))
	}
	if len(lo.Host) == 0 {
		fmt.Fprintln(tw, "(no Ethernet interfaces in this network namespace)")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(o.err, "host interfaces: vfnic drives them through AF_XDP or AF_PACKET sockets while the kernel keeps them (no VFIO); 'vfnic doctor' says which works here")
	if xdpSeen {
		fmt.Fprintln(o.err, "*XDP*: someone else's XDP program is attached; afxdp: refuses the interface without -force")
	}
	if active {
		fmt.Fprintln(o.err, "*Active*: the kernel uses this NIC (interface up, addresses or routes); 'vfnic bind' refuses it without -force")
	}
	for _, w := range lo.Warnings {
		fmt.Fprintln(o.err, "warning:", w)
	}
	return nil
}

// parseWithAddrs parses flags and then the PCI addresses that follow them.
func parseWithAddrs(fs *flag.FlagSet, args []string) ([]pci.Address, error) {
	if err := parse(fs, args); err != nil {
		return nil, err
	}
	return parseAddrs(fs.Args())
}

// withTimeout runs op under a deadline: sysfs binds wait for the kernel.
func withTimeout(ctx context.Context, op func(context.Context) error) error {
	c, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return op(c)
}

func parseAddrs(args []string) ([]pci.Address, error) {
	if len(args) == 0 {
		return nil, fmt.Errorf("%w: name at least one PCI address (see 'vfnic list')", errUsage)
	}
	var as []pci.Address
	for _, s := range args {
		a, err := pci.ParseAddress(s)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", errUsage, err)
		}
		as = append(as, a)
	}
	return as, nil
}

// machine is where bind finds devices and checks them: the host's sysfs,
// /proc, /dev and netlink when zero; tests point it at fake trees.
type machine struct {
	sys    pci.Sysfs
	doctor doctor.Env
	net    pci.NetState // nil: netlink
}

// bindReadiness explains, before a bind, why vfio-pci could not take the
// device (doctor.CheckBind).
func (m machine) bindReadiness(a pci.Address) error {
	if err := doctor.CheckBind(m.doctor, a); err != nil {
		return fmt.Errorf("cannot bind %s: %s", a, strings.TrimPrefix(err.Error(), "doctor: "))
	}
	return nil
}

func runBind(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlags("bind", "[-force] ADDR...")
	force := fs.Bool("force", false, "take a NIC even if its interface is up, has addresses or routes")
	addrs, err := parseWithAddrs(fs, args)
	if err != nil {
		return err
	}
	return machine{}.bind(ctx, addrs, *force, out)
}

// bind binds the devices at addrs to vfio-pci. Every one is looked up and
// checked (present, not used by the kernel's network stack unless force,
// VFIO ready for it) before the first is taken, so that a mistyped or busy
// address binds none.
func (m machine) bind(ctx context.Context, addrs []pci.Address, force bool, out io.Writer) error {
	var todo []pci.Address
	for _, a := range addrs {
		if slices.Contains(todo, a) {
			continue
		}
		d, err := m.sys.Lookup(a)
		if err != nil {
			return err
		}
		if d.Driver != pci.VFIODriver {
			if err := m.sys.CheckInUse(a, m.net, force); err != nil {
				return inUseHint(err)
			}
		}
		if err := m.bindReadiness(a); err != nil {
			return err
		}
		todo = append(todo, a)
	}
	for _, a := range todo {
		var c pci.Claim
		err := withTimeout(ctx, func(ctx context.Context) error {
			var err error
			c, err = m.sys.Take(ctx, a, pci.TakeOptions{Force: force, Net: m.net})
			return err
		})
		if err != nil {
			return inUseHint(err)
		}
		d, err := m.sys.Lookup(a)
		if err != nil {
			return err
		}
		if !c.Bound {
			fmt.Fprintf(out, "%s: already bound to vfio-pci, IOMMU group %d (/dev/vfio/%d)\n", a, d.IOMMUGroup, d.IOMMUGroup)
			continue
		}
		fmt.Fprintf(out, "bound %s to vfio-pci (was %s), IOMMU group %d (/dev/vfio/%d)\n", a, driverName(c.Previous), d.IOMMUGroup, d.IOMMUGroup)
	}
	return nil
}

// inUseHint adds how to take a device that the kernel uses anyway.
func inUseHint(err error) error {
	if errors.Is(err, pci.ErrInUse) {
		return fmt.Errorf("%w (use -force to take it anyway)", err)
	}
	return err
}

func driverName(d string) string {
	if d == "" {
		return "no driver"
	}
	return d
}

func runUnbind(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlags("unbind", "[-force] ADDR...")
	force := fs.Bool("force", false, "unbind a NIC even from a kernel driver other than vfio-pci (the in-use check still applies)")
	addrs, err := parseWithAddrs(fs, args)
	if err != nil {
		return err
	}
	sys := pci.Sysfs{}
	for _, a := range addrs {
		d, err := sys.Lookup(a)
		if err != nil {
			return err
		}
		if d.Driver == "" && d.DriverOverride == "" {
			fmt.Fprintf(out, "%s: has no driver; nothing to unbind\n", a)
			continue
		}
		var now string
		err = withTimeout(ctx, func(ctx context.Context) error {
			var err error
			now, err = sys.GiveBack(ctx, a, pci.GiveBackOptions{Force: *force})
			return err
		})
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "unbound %s from %s, now %s\n", a, driverName(d.Driver), driverName(now))
	}
	return nil
}
