// Package virtiovm tests the virtio-net driver (nic/virtio) in a QEMU guest
// against QEMU's virtio-net-pci, packed and split rings, with frames
// exchanged with the host through dgram netdevs.
//
// The TestGuest* tests run in the guest and drive everything: they open the
// NIC, say hello to the host side over the wire, and ask it (with control
// frames) to send frames, to expect frames, or to blast frames for a rate
// measurement. TestVM, on the host, boots the guest and serves one netdev
// per NIC; it fails when a guest test fails or when the host saw a frame
// missing, reordered or damaged.
//
// TestGuestConformance* run the fi_cq conformance suite (tests/conformance)
// on CQs fed by virtio queues: two pairs of NICs on QEMU hubs, a send on
// one NIC received by the other, with the host on a hub port for the
// frames no vfnic queue sends (longer than the MTU). TestGuestRateComparison
// sets vfnic's 64-byte frame rates beside the guest Linux driver's.
package virtiovm
