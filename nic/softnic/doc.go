// Package softnic is a pair of software NICs joined by an in-process wire,
// each end a full nic.Device: receive and transmit queues in DMA memory,
// several queue pairs with RSS-like steering, MAC, MTU, link state,
// statistics, an interrupt eventfd per queue (so SRead and lcore's
// adaptive and sleeping modes really sleep), BindCQ. Everything built on
// nic.Device (the CLI, lcore, netstack, the fi_cq conformance suite) runs
// on it on any host, at full speed, with faults on demand:
//
//   - on the wire (Wire.SetFaults): frames dropped, corrupted, reordered,
//     duplicated, each with a probability, repeatable from a seed; the link
//     taken down (Wire.SetLink);
//   - in a queue's completion ring (Device.InjectRing): an entry with an id
//     never posted, a repeated id, a length beyond the buffer, an entry out
//     of phase before a valid one, an id rewritten after the hand-over;
//   - the kernel taking the device back (Device.Remove).
//
// # Names
//
// Importing the package registers the scheme "softnic" with nic.Register:
//
//	dev, err := nic.Open(ctx, "softnic:lab/0", cfg) // end 0 of wire "lab"
//	peer, err := nic.Open(ctx, "softnic:lab/1", cfg) // its other end
//
// A name is NAME/0 or NAME/1, NAME of letters, digits, '.', '_' and '-'.
// The first open of a NAME makes the wire with the default Options; it
// lasts while an end is open. NewWire makes one with other Options (MTU,
// queue pairs) that lasts until its Close, and gives the handle for its
// faults. The wire lives in the process: both ends must be opened by the
// same program. Pair opens both ends of an unnamed wire at once.
//
// # How it works
//
// A queue is driven as a NIC's is: PostRecv and Send write a descriptor
// (the buffer's device address, length, and the id cq/ring's table gave
// the operation), Flush publishes the tail. A transmit queue's Flush then
// runs the device in the caller's goroutine: each frame is copied out of
// the transmit buffer onto the wire, which applies its faults and copies it
// into the next posted buffers of the peer's receive queue (chosen by a
// hash of the IP addresses and TCP/UDP ports, so a flow stays in order on
// one queue), and both queues' completions are written. A frame that finds
// too few buffers posted is dropped, as a NIC drops it.
//
// Completions are read by cq/ring from a completion ring in DMA memory,
// as a real device's are, so the ring reader's checks are what the faults
// test. An entry is 16 bytes, little-endian:
//
//	off size field
//	  0  u32  id      the id the driver posted (cq/ring Table id)
//	  4  u32  len     bytes sent or received
//	  8  u8   status  0 OK, 1 MORE (a frame longer than the buffer goes on
//	                  in the next one)
//	 12  u32  owner   bit 31 = phase, 1 on the first lap, flipping on each
//
// The device writes bytes 0..11, then the owner word with a release
// store; entries are written strictly in order (an entry out of phase
// before a valid one is a hole: cq.ProvBadPhase). The ring has twice as
// many entries as the queue has descriptors, room for the entries faults
// add. The consumer count goes back to the device through a doorbell once
// per batch.
//
// Above the ring the queues are the drivers' own (nic/internal/queue):
// Poll and the CQ's reader over the same batch read, receive buffers lent
// and reposted, BindCQ (each queue's interrupt is a vector, routed to its
// eventfd or the CQ's), the operations a close still owes. The package
// supplies the ring and the device behind it.
//
// Arm asks for one interrupt once threshold completions beyond those read
// are written, counting only completions written after the arm, as the
// strictest hardware does: a reader polls again after arming. The
// interrupt is raised after the writer unlocks the ring.
//
// Receive buffers hold nic.Config.BufferSize bytes (default 2048, or the
// MTU plus nic.FrameOverhead when larger); a longer frame (only Receive
// delivers one: transmit queues take MTU+nic.FrameOverhead bytes at most)
// fills several, each completing with an error matching
// cq.ProvMultiBuffer. Memory comes from 4 KiB pages unless
// nic.Config.Memory asks for others.
package softnic
