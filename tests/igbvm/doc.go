// Package igbvm tests the igb driver (nic/igb) in a QEMU guest against
// QEMU's igb model (Intel 82576), with frames exchanged with the host
// through a dgram netdev.
//
// One guest runs every TestGuest* test. Each guest test opens the NIC,
// says hello to the host over the wire, and asks the host (with control
// frames) to send frames under a window of acknowledgements, to check the
// frames it receives, or to send one frame after a delay. TestVM, on the
// host, boots the guest and serves the netdev; it fails when a guest test
// fails or skips, or when the host saw a frame missing, reordered or
// damaged.
package igbvm
