// Package afpacket is a nic.Device on a Linux network interface through
// an AF_PACKET socket with a PACKET_MMAP receive ring: the fallback where
// AF_XDP (nic/afxdp) is missing or refused, as DPDK's net_af_packet is.
//
//	import _ "github.com/vfnic/vfnic/nic/afpacket"
//
//	dev, err := nic.Open(ctx, "afpacket:eth1", nic.Config{})
//
// Receive: a TPACKET_V2 ring, one fixed slot of Config.BufferSize bytes
// per frame (2048 or 4096), read by cq/ring's descriptor-done reader: the
// kernel sets TP_STATUS_USER in a slot's status word when it has written a
// frame there, and the reader, which loads that word before the rest,
// clears the bit on consuming it and sets Held (bit 28, which the kernel
// does not use) so that the kernel, which takes back any slot whose status
// reads zero, leaves the frame alone while it is lent to the caller;
// Repost and PostRecv write zero, handing the slot back. V2 was chosen
// over V3 because a fixed slot per frame is exactly a descriptor of that
// convention, while V3's blocks hold a variable number of frames that the
// kernel hands over a block at a time (one status for many frames). The
// kernel fills slots in ring order, so a buffer held by the caller stops
// reception at its slot until it is handed back; PostRecv posts slots in
// the order they came back (first in ring order). Every lent frame starts
// at the same place in its slot (66 bytes in, where the kernel puts an
// Ethernet frame; one put elsewhere is moved there).
//
// Every field of a slot's header the kernel wrote (status, snap length,
// frame length, MAC offset) is read once into a copy and checked: the
// frame must lie inside the slot, be whole (tp_len equal to the snap
// length) and hold an Ethernet header.
//
// Transmit: frames are sent at Flush with one sendmmsg(2) on a socket with
// PACKET_QDISC_BYPASS; the kernel has taken each frame when the call
// returns, so each send completes then: the queue writes a completion
// (the posting's id and length) into a ring of its own, read by cq/ring's
// used-index reader as the kernel's rings are, in order.
//
// Both queues run on the queue core the VFIO drivers share (Poll, the CQ
// a queue feeds through BindCQ, buffer lending, flushed completions at
// Close). The CQ's eventfd cannot be wired to the socket's readiness: an
// armed receive queue has a goroutine wait on the readiness and signal
// the CQ; a transmit queue signals it when its Flush writes completions.
//
// The socket's readiness is the queues' interrupt (eventfd.Readable).
// AF_PACKET reports the socket readable while the slot before the
// kernel's position is not the kernel's: with nothing new to read when
// the caller keeps that buffer (neither Repost nor Release). A queue's
// SRead and an armed CQ's forwarder therefore look at the ring after
// each event the socket raises (eventfd.FD.WaitFor) and sleep on until a
// frame is there; an lcore core registers the socket edge-triggered in
// its epoll set and polls after each wake-up.
//
// AF_PACKET hands a received frame's outer VLAN tag (802.1Q or 802.1ad)
// over in the slot header (tp_vlan_tci, tp_vlan_tpid) with the tag taken
// out of the frame; the driver puts it back after the MAC addresses,
// moving the rest of the frame 4 bytes on inside its slot, so frames
// arrive as they were on the wire. A tagged frame whose tag does not fit
// in the slot completes with cq.ProvMultiBuffer.
//
// Queue pairs: Config.QueuePairs sockets (default 1, at most 64), each
// with its own receive ring, joined in one PACKET_FANOUT group with a
// kernel-chosen unique id. The mode is PACKET_FANOUT_HASH with
// PACKET_FANOUT_FLAG_DEFRAG: a flow stays on one queue, in order, as with
// RSS and as DPDK's net_af_packet spreads its queue pairs; IP fragments
// are reassembled first so that they follow their flow. PACKET_FANOUT_QM
// would follow the NIC's own receive queues, which a veth or a
// single-queue NIC does not spread, and PACKET_FANOUT_CPU the receiving
// CPU, which splits a flow whenever the kernel moves it. Queue pair i
// sends on socket i.
package afpacket
