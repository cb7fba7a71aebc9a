package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

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
	return "network controller"
}

func runList(_ context.Context, args []string, out io.Writer) error {
	fs := newFlags("list", "[-all]")
	all := fs.Bool("all", false, "list every PCI device, not only network controllers")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("%w: list takes no arguments", errUsage)
	}
	devs, err := pci.List(pci.ListOptions{NetworkOnly: !*all})
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ADDRESS\tID\tNAME\tDRIVER\tGROUP\tINTERFACES\tVFIO")
	for _, d := range devs {
		drv, grp, vf := d.Driver, fmt.Sprint(d.IOMMUGroup), "no"
		if drv == "" {
			drv = "-"
		}
		if d.IOMMUGroup < 0 {
			grp = "-"
		}
		if d.Driver == "vfio-pci" {
			vf = "bound"
		}
		ifs := strings.Join(d.NetInterfaces, ",")
		if ifs == "" {
			ifs = "-"
		}
		name := nicName(d)
		if !d.IsNetwork() {
			name = fmt.Sprintf("class %06x", d.Class)
		}
		fmt.Fprintf(tw, "%s\t%04x:%04x\t%s\t%s\t%s\t%s\t%s\n", d.Address, d.VendorID, d.DeviceID, name, drv, grp, ifs, vf)
	}
	if len(devs) == 0 {
		fmt.Fprintln(tw, "(no network controllers)")
	}
	return tw.Flush()
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

func runBind(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlags("bind", "[-force] ADDR...")
	force := fs.Bool("force", false, "take a NIC even if its interface is up, has addresses or routes")
	addrs, err := parseWithAddrs(fs, args)
	if err != nil {
		return err
	}
	sys := pci.Sysfs{}
	for _, a := range addrs {
		if err := sys.CheckInUse(a, nil, *force); err != nil {
			return fmt.Errorf("%w (use -force to take it anyway)", err)
		}
		if err := withTimeout(ctx, func(c context.Context) error { return sys.Bind(c, a, "vfio-pci") }); err != nil {
			return err
		}
		d, err := sys.Lookup(a)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "%s: bound to vfio-pci, IOMMU group %d (/dev/vfio/%d)\n", a, d.IOMMUGroup, d.IOMMUGroup)
	}
	return nil
}

func runUnbind(ctx context.Context, args []string, out io.Writer) error {
	addrs, err := parseWithAddrs(newFlags("unbind", "ADDR..."), args)
	if err != nil {
		return err
	}
	sys := pci.Sysfs{}
	for _, a := range addrs {
		if err := withTimeout(ctx, func(c context.Context) error { return sys.Unbind(c, a) }); err != nil {
			return err
		}
		if err := sys.ClearOverride(a); err != nil {
			return err
		}
		if err := sys.Reprobe(a); err != nil {
			return err
		}
		// Give the kernel's driver a moment to claim it before reporting.
		time.Sleep(200 * time.Millisecond)
		d, err := sys.Lookup(a)
		if err != nil {
			return err
		}
		drv := d.Driver
		if drv == "" {
			drv = "no driver"
		}
		fmt.Fprintf(out, "%s: unbound from vfio-pci, now %s\n", a, drv)
	}
	return nil
}
