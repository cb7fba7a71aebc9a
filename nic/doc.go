// Package nic is the device-independent interface of vfnic's userspace NIC
// drivers: a Device opened by PCI address, with receive and transmit
// queues that exchange raw Ethernet frames through buffers in DMA memory,
// a caller context carried from each post to its completion, link state,
// MAC address and statistics.
//
// Drivers live in subpackages (nic/virtio, and later nic/igb, nic/e1000e,
// nic/vmxnet3) and register themselves; a program imports the drivers it
// wants and calls Open:
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
// A queue's completions can also feed a cq.CQ (Device.BindCQ): the CQ then
// reads the device's completion ring directly, with the fi_cq semantics of
// package cq, and the queue's interrupt signals the CQ's wait object.
//
// Queues are safe for concurrent use: each operation takes the queue's own
// lock, so one goroutine may post while another reads completions. Batching
// (several posts, then one Flush) is what keeps the cost per frame low:
// Flush publishes the posted descriptors and rings the device's doorbell
// only when the device asked to be told.
package nic
