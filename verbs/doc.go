// Package verbs gives Go programs that think in libibverbs its completion
// queues (ibv_create_cq_ex(3), ibv_req_notify_cq), over the same device
// rings and the same completion path as package cq's fi_cq API.
//
//   - CreateCQ (ibv_create_cq_ex): minimum entries, the actual size
//     reported by CQ.CQE; a caller context returned with events; an
//     optional completion channel; a completion vector checked against
//     the device's; the completion fields wanted, a field the device
//     cannot give, or that this package has no data path for (the
//     timestamps, VLAN, flow tag, SLID, SL, DLID path bits, checksum),
//     failing with errors.ErrUnsupported; SingleThreaded and
//     IgnoreOverrun. QueryDevice answers before creation, with what the
//     device and this package can both do.
//   - The iterator: StartPoll, NextPoll, EndPoll and the accessors of the
//     current completion (WRID, Status, Opcode, VendorErr, ByteLen, ...).
//     Poll (ibv_poll_cq) fills an array of WC on the same path. Error
//     completions come in completion order, with their status.
//   - ReqNotify (ibv_req_notify_cq), CompChannel (ibv_comp_channel) with
//     GetEvent and AckEvents, Destroy that waits for unacknowledged events.
//   - Resize (ibv_resize_cq) on devices that implement Resizer: never below
//     the completions held, which stay in order.
//
// The iterator reads the ring through cq.CQ.Read in batches of up to 32
// entries (DPDK's burst: larger batches share a ring read's fixed cost
// among more completions, but their buffer falls out of L1). The consumer
// index goes to the device once per such batch, never per entry, and the completions of a
// batch stay in the CQ's buffer until the caller has iterated over them.
// Unlike mlx5, where ibv_end_poll writes the consumer index, here it is
// written when the batch is read from the ring (at StartPoll, or at a
// NextPoll that reads the next batch); EndPoll only ends the caller's
// batch.
//
// Notification: ReqNotify arms the device for the next completion beyond
// those in the CQ, so entries present at the arm raise no event; it
// reports them (like rxe's missed events) so that the caller polls
// instead of sleeping. The loop "GetEvent, AckEvents, ReqNotify, poll
// until empty" loses no wake-up; a spurious one, with an empty CQ, may
// happen. A device interrupt reaches the channel through a goroutine per
// CQ parked on the CQ's eventfd (the kernel's completion handler in
// rdma-core), which queues one event per arm. Every ReqNotify writes the
// device's arm, even while one is pending (as rdma-core's providers do),
// so a lost device interrupt costs one event, not all later ones.
//
// Solicited-only arms: without a messaging layer that carries a solicited
// bit, error completions are the solicited ones (the spec's "any
// unsuccessful work completion"), plus, on the software device, a send
// that asked for it. A device that interrupts on every completion (a NIC)
// leaves the filtering to this package: while such an arm is pending,
// each interrupt makes the CQ take the ring's completions into a queue of
// its own (each read once, kept in order, read by the iterator before the
// ring's), and the event fires when one is an error. A flushed completion
// is an error, so closing a device fires a solicited-only arm on the CQs
// its queues feed. A SingleThreaded CQ refuses such an arm, since the
// interrupt handler would read its ring beside the caller.
//
// Providers: a device plugs in through Provider; verbs/simverbs adapts the
// software device (cq/qpsim), verbs/nicverbs a NIC (virtio, igb).
package verbs
