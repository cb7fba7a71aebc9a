// Package netstack runs gVisor's TCP/IP stack (gvisor.dev/gvisor/pkg/tcpip)
// on a vfnic nic.Device, and gives Go programs the listen and dial
// functions of package net over it, in the shape of wireguard-go's
// tun/netstack: Listen, ListenTCP, ListenPacket, ListenUDP, Dial and
// DialContext return values that satisfy net.Listener, net.Conn and
// net.PacketConn, with deadlines and context cancellation, so that an
// unmodified net/http, DNS or QUIC server runs on a userspace NIC.
//
// The stack has static IPv4 and IPv6 addresses, on-link routes for their
// prefixes, further routes and default gateways (Config); ARP and NDP are
// the stack's own. There is no name resolution: addresses are IP literals.
//
// The link endpoint frames Ethernet itself. Its MTU is the device's
// longest frame less nic.FrameOverhead (the Ethernet header and two VLAN
// tags), capped by the device's MTU. Each queue pair has a receive loop on
// a polling core (package lcore; Adaptive by default): each received frame
// is copied into a buffer from gVisor's pool and its DMA buffer reposted
// at once, before the stack processes the frame (gVisor's buffers cannot
// wrap foreign memory). Transmit goes through gVisor's fifo queueing
// discipline with one dispatcher per transmit queue, which hands the
// endpoint batches of up to 47 packets; each batch is gathered frame by
// frame into the queue's DMA buffers (nic.TxQueue.Send) and handed to the
// device with one Flush. A write that finds half the ring outstanding
// flushes, waits briefly for completions, and sends on into the other
// half, so that each write after a stall posts and notifies the device.
// Neither path allocates per frame beyond gVisor's own buffer pool.
//
// Checksum offloads are used where the device has them (nic/igb, and
// nic/virtio where CSUM and GUEST_CSUM were negotiated: QEMU offers them
// on a tap backend, not behind its hub and socket backends): the stack
// leaves TCP and UDP checksums to the device and skips verifying those the
// device verified, or whose checksum a sender on a virtual wire left to an
// offload (virtio's NEEDS_CSUM: the endpoint asks the driver to keep
// those partial; with receive offload off the driver completes them
// before the stack checks them). gVisor's receive capability is one flag for the whole NIC,
// read as each packet comes in, so the endpoint withdraws it while it
// delivers a frame nobody verified: the stack then checks that frame
// itself, and carries the verdict through IP reassembly, so that
// fragments are verified too. Config.NoRxChecksumOffload and
// NoTxChecksumOffload turn them off; Stats counts what each did.
//
// Segmentation and receive offloads are in software, as Linux's GSO and
// GRO where a device has no TSO or LRO. With GRO (on by default), each
// receive queue coalesces the in-order TCP segments of a flow that arrive
// in one batch into one packet before the stack takes it in (gVisor's
// GRO). A coalesced packet keeps its first segment's checksums, so the
// endpoint verifies the checksums of every frame the device did not (IPv4
// headers, whole TCP and UDP segments): packets it or the device verified
// are delivered with the receive capability claimed, the rest (fragments,
// IPv6 extension headers, bad checksums) one at a time with it withdrawn,
// so that the stack checks and counts them. With GSO (Config.GSO, off by
// default), TCP sends, acknowledges and retransmits segments of up to
// 64 KiB, which the stack cuts into MSS-sized packets as it writes them
// (gVisor's software GSO): the link sees the same packets, and TCP's
// sender runs once per 64 KiB. It stays off by default because it makes
// a stall of gVisor's RACK loss recovery more frequent (below).
// Config.NoGRO turns GRO off.
//
// gVisor's TCP with RACK (its default, kept here) crawls after it loses a
// long burst of which less than two segments' worth got through: the
// receiver then holds too little out of order above the hole for the SACK
// scoreboard to call the hole lost (two segments' bytes or three blocks
// above it), so the hole counts as in flight (the pipe of RFC 6675)
// although RACK has marked it lost, and fills the congestion window.
// Nothing is sent until the 200 ms retransmission timeout, which sends one
// segment; its ACK carries the SACK block again, RACK enters recovery and
// retransmits one more, and the pipe is full again. Two segments per
// timeout: a hole of 400 segments takes 40 s (a capture shows it; Linux
// leaves packets it marked lost out of the count). So that a connection
// never loses such a burst to its own host, each transmit queue's qdisc
// holds by default a whole send buffer of one connection
// (Config.QueueLen). An 8 MiB echo each way between two stacks on a
// software pair, run with GOMAXPROCS=1 so that a receive ring overflows,
// took more than 20 s in 4 of 121 runs with the 1,000-packet qdisc of
// before and in none of 30 with this one; with GSO, in 3 of 30 and 1 of
// 30; with Config.DisableRACK, in none of 80.
//
// Config.Capture records every frame in pcap format, for debugging.
//
// TCP runs with SACK, RACK loss detection and receive buffer moderation on;
// buffer sizes are settable (Config.TCPSendBuffer, TCPReceiveBuffer).
//
// A Net stops on Close, or by itself when the kernel takes the device back
// (nic.ErrRemoved): blocked calls return, and the errors of its listeners
// and connections then match net.ErrClosed or nic.ErrRemoved (Net.Err says
// which). Every goroutine it started has ended when Close returns. The
// device is the caller's to close, after the Net.
package netstack
