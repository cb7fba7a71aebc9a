// Package afxdpvm tests nic/afxdp's zero-copy binding in a QEMU guest
// whose kernel's virtio_net offers AF_XDP zero-copy (Linux 6.13 and
// later: the guest boots qemu.FindBackportsKernel, trixie-backports'
// kernel, which scripts/setup.sh fetches; the default bookworm kernels,
// 6.1 and bookworm-backports' 6.12, refuse XDP_ZEROCOPY on virtio_net).
// On the host no driver offers it to these tests (veth refuses it), so
// this is where the zero-copy path runs.
//
// TestVM, on the host, boots one guest with two virtio-net NICs on one
// QEMU hub, both left to the guest kernel's virtio_net. TestGuestZeroCopy,
// in the guest, opens vfnic's "afxdp:IF" on the first and a Linux
// AF_PACKET socket on the second, checks that the socket is bound in
// zero-copy mode (Info.Features), sends frames each way with none lost,
// duplicated or corrupted, and checks that Close leaves no socket, ring
// mapping or XDP program behind. The kernel's own listing of AF_XDP
// sockets (sock_diag, module xsk_diag, as ss -0 reads it) confirms both
// the zero-copy UMEM while open and the socket's release after Close.
package afxdpvm
