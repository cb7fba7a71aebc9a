// Package netstackvm tests package netstack in a QEMU guest with two NICs
// of one kind on one emulated wire (a QEMU hub): vfnic and the netstack on
// one, the guest's Linux on the other. Unmodified servers run on vfnic
// (net/http, github.com/miekg/dns, quic-go) and the guest's Linux side is
// the client (busybox wget and nslookup, Go programs on Linux sockets).
//
// TestVM, on the host, boots one guest per NIC kind (igb; virtio packed
// with VFNIC_NETSTACK_PACKED=1 and split with VFNIC_NETSTACK_SPLIT=1, kept
// out of make test for its time budget, where TestTapOffloads runs netstack
// on virtio); in each, TestGuestNetstack runs every check on one
// stack. Beside vfnic's packed rings the Linux NIC has split rings:
// TestVMPeerStall (VFNIC_NETSTACK_PEERSTALL=1) shows why, a packed-ring
// Linux NIC that QEMU stalls for good once vfnic's NIC has taken no frame
// for a moment (VFNIC_NETSTACK_PACKED_PEER=1 puts it back in TestVM). A
// fetch still running after 15 s logs the stack's TCP endpoints and
// counters, Linux's, the rings' unread completions and the last frames
// (netstack.Config.Capture), and asks the host for QEMU's view of the
// virtio queues (internal/qmpask). VFNIC_NETSTACK_REPEAT=N fetches each
// URL N times: a soak for stalls.
//
// TestTapOffloads boots one guest whose two virtio-net NICs are on a tap
// wire (qemu.Tap), where QEMU offers virtio-net's checksum offloads, and
// fetches the 16 MiB body with the offloads on, off in nic.Config and off
// in netstack.Config only, checking from the driver's and the stack's
// counters that they were used exactly when on.
package netstackvm
