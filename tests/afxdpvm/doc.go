// Package afxdpvm tests nic/afxdp's zero-copy binding in a QEMU guest
// whose kernel's drivers offer AF_XDP zero-copy: virtio_net from Linux
// 6.13, igb from 6.14 (the guest boots qemu.FindBackportsKernel,
// trixie-backports' kernel, which scripts/setup.sh fetches; the default
// bookworm kernels, 6.1 and bookworm-backports' 6.12, refuse
// XDP_ZEROCOPY on virtio_net). On the host no driver offers it to these
// tests (veth refuses it), so this is where the zero-copy path runs.
//
// TestVM, on the host, boots one guest with two pairs of NICs, each pair
// on a QEMU hub of its own: a virtio-net NIC with a virtio-net peer, and
// an igb (82576) NIC with a virtio-net peer, all left to the guest
// kernel's drivers. TestGuestZeroCopy, in the guest, runs the same checks
// on each pair: vfnic's "afxdp:IF" on the first NIC, a Linux AF_PACKET
// socket on its peer; the socket bound in zero-copy mode
// (Info.Features), frames sent each way with none lost, duplicated or
// corrupted, and Close leaving no socket, ring mapping or XDP program
// behind. The kernel's own listing of AF_XDP sockets (sock_diag, module
// xsk_diag, as ss -0 reads it) confirms both the zero-copy UMEM while
// open and the socket's release after Close.
//
// igb's zero-copy needs two settings, each the answer to a failure
// measured here (see pairQueues and the igb case in TestGuestZeroCopy):
// its queues paired on shared interrupt vectors (ethtool -L combined 8),
// and 4 KiB UMEM chunks (Config.BufferSize).
package afxdpvm
