// Package nic is the device-independent interface of vfnic's userspace NIC
// drivers: a Device opened by PCI address, with receive and transmit
// queues that exchange raw Ethernet frames through buffers in DMA memory,
// a caller context carried from each post to its completion, link state,
// MAC address and statistics.
//
// Drivers live in subpackages (nic/virtio, nic/igb, and the software
// device cq/qpsim) and register themselves; a program imports the drivers
// it wants and calls Open:
//
//	import _ "github.com/vfnic/vfnic/nic/virtio"
//
//	dev, err := nic.Open(ctx, "0000:00:04.0", nic.Config{})
//	rx, _ := dev.Rx(0)
//	for rx.PostRecv(nil) == nil {
//	}
//	rx.Flush()
//	var comps [32]nic.Completion
//	n, err := rx.SRead(ctx, comps[:], 1, time.Second)
//	for _, c := range comps[:n] {
//		if c.Err == nil {
//			handle(c.Data)
//		}
//		rx.Repost(c.Buf, nil) // or Release, then PostRecv later
//	}
//	rx.Flush()
//
// Completions are read in batches into caller-supplied records, with no
// allocation on the data path. A completion whose device-written fields do
// not match what was posted (an unknown buffer id, a length beyond the
// buffer, a descriptor out of phase) comes back with Err set, never as a
// panic; an error completion is always the last of a batch.
//
// A transmit queue takes a frame either copied (Send) or written in place
// into its DMA buffer (SendFunc, the zero-copy send, as a DPDK program
// writes an mbuf from its pool). A transmit buffer keeps what the last
// frame sent from it left there, so a sender whose frames differ only in
// their headers writes only those (vfnic pktgen does):
//
//	err := tx.SendFunc(len(tmpl), nil, func(b []byte) { copy(b, hdr) })
//
// A queue's completions can also feed a cq.CQ (Device.BindCQ): the CQ then
// reads the device's completion ring directly, with the fi_cq semantics of
// package cq, and the queue's interrupt signals the CQ's wait object.
//
// Queues are safe for concurrent use: each operation takes the queue's own
// lock, so one goroutine may post while another reads completions. Batching
// (several posts, then one Flush) is what keeps the cost per frame low:
// Flush publishes the posted descriptors and rings the device's doorbell
// only when the device asked to be told.
//
// Writing a driver: the drivers of this module share one queue core
// (nic/internal/queue), which does everything a queue does besides its
// ring: the lock and closed state, Poll into Completion records, the
// reader a bound cq.CQ calls, the buffers lent to the caller (Release,
// Frame, Repost), the operations still posted when the device closes
// (canceled or flushed), BindCQ's interrupt wiring, Stats. A driver
// supplies its ring (queue.Ring): a batch read (cq/ring's
// RingSource.NextBatch over its Layout, then one pass of its own checks),
// Publish, Pending, Notify, Arm and Disarm, and how it posts. cq/ring's
// Example_driverRead is the read a new driver starts from.
package nic
