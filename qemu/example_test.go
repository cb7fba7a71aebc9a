package qemu_test

import (
	"errors"
	"fmt"

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
