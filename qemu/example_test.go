package qemu_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/vfnic/vfnic/qemu"
)

// A NIC list as vmexec's VFNIC_NICS takes it: two NICs on one emulated
// wire, the first with QEMU device properties, the second given to the
// guest's Linux. ResolveNICs fills in slots, MACs and bindings.
func ExampleParseNICs() {
	nics, err := qemu.ParseNICs("virtio,packed=on,host_mtu=9000,rx_queue_size=1024,net=hub:0 e1000e,ip=10.0.0.2/24,net=hub:0")
	if err != nil {
		fmt.Println(err)
		return
	}
	nics, err = qemu.ResolveNICs(nics)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, n := range nics {
		fmt.Println(n.GuestAddr(), n.Model, n.Bind, n.MAC, n.Props)
	}
	_, err = qemu.ParseNICs("virtio,iommu_platform=off")
	fmt.Println(errors.Is(err, qemu.ErrBadConfig), err)
	// Output:
	// 0000:00:04.0 virtio-net-pci vfio 52:54:00:12:34:04 map[host_mtu:9000 rx_queue_size:1024]
	// 0000:00:05.0 e1000e linux 52:54:00:12:34:05 map[]
	// true qemu: bad configuration: NIC "virtio,iommu_platform=off": property "iommu_platform" is set by the harness (without it virtio bypasses the vIOMMU and VFIO cannot work)
}

// Run a static binary in a guest with a packed virtio-net NIC bound to
// vfio-pci and a second NIC on the same wire left to the guest's Linux,
// and bring its capture back to the host. Needs QEMU and the guest kernel
// (make setup), so it is compiled, not run, by go test.
func ExampleRun() {
	ctx := context.Background()
	out, err := os.MkdirTemp("", "guest-out")
	if err != nil {
		fmt.Println(err)
		return
	}
	res, err := qemu.Run(ctx, qemu.Config{
		NICs: []qemu.NIC{
			{Model: qemu.VirtioNet, Packed: true, Net: qemu.Hub(0), Props: map[string]string{"rx_queue_size": "1024"}},
			{Model: qemu.VirtioNet, Bind: qemu.BindLinux, IPv4: "10.0.0.2/24", Net: qemu.Hub(0)},
		},
		Collect: []qemu.Collect{{Guest: "/tmp/out/capture.pcap", Host: filepath.Join(out, "capture.pcap")}},
		Timeout: 2 * time.Minute,
	}, qemu.Command{Path: "./myserver", Args: []string{"-capture", "/tmp/out/capture.pcap"}})
	if err != nil {
		// ErrPayloadFailed: res.ExitCode says how; ErrCollect: a file did
		// not come back; the others: the guest never ran it.
		fmt.Fprintln(os.Stderr, err)
		if res != nil {
			fmt.Fprintln(os.Stderr, res.Console)
		}
		return
	}
	fmt.Print(res.Output)
	fmt.Println("brought back:", res.Collected)
}
