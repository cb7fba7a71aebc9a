// Package qemu boots a Linux guest under QEMU (TCG) with an emulated Intel
// IOMMU and emulated NICs, runs a binary in it (typically a `go test`
// binary) and returns its output and exit status. It is how vfnic, and
// servers built on it, test VFIO drivers without real hardware.
//
// The guest is a Debian kernel with an initramfs built in Go: a static
// busybox, the VFIO modules (plus drivers for NICs left to Linux and any
// modules asked for), the caller's files and a generated /init. /init
// mounts the usual filesystems, reserves hugepages, binds the NICs marked
// BindVFIO to vfio-pci (checking /dev/vfio/<group>), gives BindLinux NICs
// an IPv4 address, prints "VFNIC-KERNEL: <uname -r>", runs the payload
// between console markers with VFNIC_GUEST=1 in its environment, prints
// "VFNIC-EXIT: <status>" and powers off. A whole run takes about 5 to 8 s.
//
// Running a binary:
//
//	res, err := qemu.Run(ctx, qemu.Config{
//		NICs: []qemu.NIC{
//			{Model: qemu.VirtioNet, Packed: true}, // 0000:00:04.0, vfio-pci
//			{Model: qemu.E1000E, Net: qemu.Hub(0)}, // 0000:00:05.0, vfio-pci
//		},
//	}, qemu.Command{Path: "/path/to/static/binary", Args: []string{"-v"}})
//
// Running a package's tests in the guest from a host test, each guest test
// reported as a subtest:
//
//	func TestDriverInVM(t *testing.T) {
//		qemu.RunGoTestT(t, qemu.Config{NICs: nics}, qemu.GoTest{Package: "./nic/virtio", Run: "TestVM"})
//	}
//
// and in the package itself, tests that need the devices call
// qemu.SkipUnlessGuest(t) and find their NICs with qemu.GuestNICs(). The
// guest test binary runs with -test.v=test2json and its output is read
// through `go tool test2json`. The same tests run with `go test -exec
// vmexec` (see qemu/cmd/vmexec).
//
// Each NIC may carry QEMU device properties of its model (NIC.Props, or
// "virtio,event_idx=off,host_mtu=9000" in ParseNICs), checked against the
// installed QEMU before the guest boots. Config.Collect names guest files
// and directories (pcaps, profiles, coverage) that come back to the host
// when the payload exits: the guest writes them as a tar stream to a raw
// virtio-blk disk that the host reads after QEMU has exited.
//
// A NIC's backend (NIC.Net) is a QEMU hub (Hub: NICs on one hub share a
// wire), UDP datagrams to and from the host on 127.0.0.1 (Dgram), or a tap
// device on a bridge (Tap, "net=tap:WIRE"). Taps are the backend that
// carries virtio-net headers, the only one on which QEMU offers
// virtio-net's checksum and segmentation offloads. Run makes them, as
// root, in a network namespace of its own ("vfnic-tap-PID-N": a bridge per
// wire, a tap per NIC opened with IFF_VNET_HDR from a thread in that
// namespace, its descriptor passed to QEMU), and removes the namespace
// when the guest ends; one left by a killed run is removed by the next.
// No interface of the machine is touched.
//
// Environment: $VFNIC_QEMU overrides the qemu-system-x86_64 found in PATH;
// the kernel and modules come from the cache directory ($VFNIC_CACHE, else
// $XDG_CACHE_HOME/vfnic, else ~/.cache/vfnic) where `go run
// github.com/vfnic/vfnic/qemu/cmd/vmsetup` (or, in a checkout,
// scripts/setup.sh) puts them; $VFNIC_BUSYBOX overrides /bin/busybox. Host VM tests call
// RequireVM, which fails under CI=true and skips elsewhere when these are
// missing.
package qemu
