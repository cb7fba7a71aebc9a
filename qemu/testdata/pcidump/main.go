// Command pcidump is the payload of the qemu package's VM smoke test. In the
// guest it lists every PCI device with its driver and IOMMU group (through
// pci.List, so the smoke test also reads a real sysfs with it), checks that
// each NIC the host bound to vfio-pci is bound and has its /dev/vfio/<group>
// node, and exits non-zero if not.
package main

import (
	"fmt"
	"os"
	"strconv"

	"github.com/vfnic/vfnic/pci"
	"github.com/vfnic/vfnic/qemu"
)

func main() {
	if !qemu.InGuest() {
		fmt.Fprintln(os.Stderr, "pcidump: not in a vfnic guest")
		os.Exit(2)
	}
	devs, err := pci.List(pci.ListOptions{})
	if err != nil || len(devs) == 0 {
		fmt.Fprintf(os.Stderr, "pcidump: no PCI devices: %v\n", err)
		os.Exit(1)
	}
	type dev struct{ driver, group string }
	seen := map[string]dev{}
	for _, d := range devs {
		driver, group := "none", "none"
		if d.Driver != "" {
			driver = d.Driver
		}
		if d.IOMMUGroup >= 0 {
			group = strconv.Itoa(d.IOMMUGroup)
		}
		seen[d.Address.String()] = dev{driver, group}
		fmt.Printf("PCI %s %04x:%04x driver=%s group=%s\n", d.Address, d.VendorID, d.DeviceID, driver, group)
	}
	nics, err := qemu.GuestNICs()
	if err != nil {
		fmt.Fprintf(os.Stderr, "pcidump: %v\n", err)
		os.Exit(1)
	}
	failed := false
	for _, n := range nics {
		d, ok := seen[n.GuestAddr()]
		switch {
		case !ok:
			fmt.Printf("NIC %s %s: missing\n", n.GuestAddr(), n.Model)
			failed = true
		case n.Bind != qemu.BindVFIO:
			fmt.Printf("NIC %s %s: bound to %s (wanted %s)\n", n.GuestAddr(), n.Model, d.driver, n.Bind)
		case d.driver != "vfio-pci":
			fmt.Printf("NIC %s %s: driver %s, not vfio-pci\n", n.GuestAddr(), n.Model, d.driver)
			failed = true
		default:
			node := "/dev/vfio/" + d.group
			st, err := os.Stat(node)
			if err != nil || st.Mode()&os.ModeCharDevice == 0 {
				fmt.Printf("NIC %s %s: %s missing: %v\n", n.GuestAddr(), n.Model, node, err)
				failed = true
				continue
			}
			fmt.Printf("NIC %s %s: vfio-pci %s ok\n", n.GuestAddr(), n.Model, node)
		}
	}
	if failed {
		os.Exit(1)
	}
	fmt.Println("pcidump: all NICs ok")
}
