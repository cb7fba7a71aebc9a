// Package afxdp is a nic.Device on a Linux network interface through
// AF_XDP sockets: vfnic on any Linux host, no IOMMU or vfio-pci needed,
// as DPDK's net_af_xdp driver is.
//
// Open it by name through nic.Open, after importing the package:
//
//	import _ "github.com/vfnic/vfnic/nic/afxdp"
//
//	dev, err := nic.Open(ctx, "afxdp:eth1", nic.Config{})   // queue 0 of eth1
//	dev, err := nic.Open(ctx, "afxdp:eth1@2", nic.Config{}) // queue 2 (and up, with QueuePairs > 1)
//
// Queue pair i of the device is an AF_XDP socket bound to the interface's
// queue q+i, where q is the number after "@" (0 without one). Each socket
// has its own UMEM, memory this package maps itself (locked 4 KiB pages,
// no hugepages or IOVAs): transmit buffers first, then receive buffers,
// one chunk of Config.BufferSize bytes (2048 or 4096) each. Its four
// rings (fill, completion, receive, transmit) are mapped at the offsets
// the kernel reports. An XDP program, assembled here (no clang), sends
// the frames of each bound queue to its socket through an XSKMAP and
// passes the others to the kernel's stack; Close detaches it (it is a
// bpf_link, which the kernel also removes if the process dies).
//
// The receive and completion rings are producer/consumer-index rings,
// read by cq/ring's UsedIndex reader like virtio's split used ring: every
// address, length and options word the kernel writes is read once into
// a copy and checked against the posted-buffer table (cq/ring.Table,
// posted by slot: a buffer's UMEM chunk is its id), then the frame's
// offset and length against the buffer. A bad entry becomes an error
// completion, never a panic.
//
// The kernel is asked to wake up only when it says so
// (XDP_USE_NEED_WAKEUP): Flush publishes the ring and makes a system call
// only when the ring's flag asks for one (Stats: Notifies, Suppressed).
// Zero-copy binding is tried first and copy mode used when the driver
// refuses it (veth does, and virtio_net before Linux 6.13; tests/afxdpvm
// runs the zero-copy path on a later virtio_net and on igb in a guest);
// Info.Features says "zero-copy" or "copy", and "xdp-native" or
// "xdp-generic" for the XDP attach mode. On igb (Linux 6.14 and later)
// zero-copy receives only with the interface's queues paired on shared
// interrupt vectors (an 82576 pairs them when more than 4 are in use:
// ethtool -L IF combined 8) and with 4096-byte chunks (Config.BufferSize):
// of a 2048-byte chunk igb gives the hardware 1 KiB, and its zero-copy
// path delivers a longer frame as pieces.
//
// Frames arrive as the interface received them. A veth peer's own TCP/IP
// stack leaves transport checksums to the "device" (CHECKSUM_PARTIAL),
// and through XDP such a frame arrives with the checksum unfinished: turn
// the peer's transmit checksumming off (ethtool -K PEER tx off) when a
// stack on vfnic's end verifies checksums, as netstack does.
//
// A queue's interrupt (nic.Queue.Interrupt) is the socket's readiness,
// so SRead and adaptive lcore cores sleep on it through the same wait
// path as on an MSI-X eventfd. A receive queue's is the read readiness
// (eventfd.Readable): readable while the receive ring holds frames. A
// transmit queue's Arm kicks the kernel to send what is posted; in copy
// mode its interrupt is the write readiness (eventfd.Writable): the
// kernel writes a send's completion when it frees the send's skb
// (xsk_destruct_skb), then wakes the socket's write-space waiters
// (sock_wfree), and the wait, edge-triggered, looks at the completion
// ring after each such event (the socket stays writable with nothing
// new while its transmit ring has room). On veth the kernel completes a
// send within the kick that sent it, so a sleeper is woken by the kick of
// another thread's Flush; and as the kernel's poll of the socket sends
// on in copy mode (xsk_poll), each batch's events have the epoll that
// waits send the next, with no kick from the sleeper. Zero-copy drivers write completions with no
// wake-up (xsk_tx_completed; the write readiness is raised only as the
// transmit ring is consumed): there the transmit queue sleeps on the
// pair's read readiness, and while sends are owed its WaitInterrupt
// returns after at most TxOwedWait (a spurious wake-up, which SRead
// allows) so that their completions are read.
//
// Errors: ErrNoInterface, ErrPermission (not root, or without CAP_NET_RAW
// and CAP_BPF), ErrBusy (the queue is bound by another socket, after
// retrying for BindRetry while the kernel releases a socket closed just
// before), ErrXDPInUse (an XDP program that this package did not attach
// is on the interface: it is never replaced silently; Config.Force
// detaches one attached through netlink, as "ip link set dev IF xdp off"
// does, while one held by another process's bpf_link stays and is still
// refused), nic.ErrNotSupported (a kernel without AF_XDP). One Device per
// interface per process: its queue pairs are Config.QueuePairs.
//
// BindCQ feeds a cq.CQ from a queue's ring through cq/ring's QueueSource
// (Entry.Queue is 2i for receive queue i, 2i+1 for transmit queue i). A
// socket's readiness cannot be wired to the CQ's eventfd as an MSI-X
// vector is: an armed bound queue has a goroutine parked on the socket's
// readiness (the same eventfd.FD wait) that signals the CQ's eventfd.
package afxdp
