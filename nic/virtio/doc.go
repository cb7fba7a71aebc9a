// Package virtio drives a modern (VIRTIO 1.x) virtio-net PCI device from
// user space through VFIO: QEMU's virtio-net-pci behind an emulated IOMMU,
// or any device that speaks the same interface.
//
// Open binds the device to vfio-pci, finds the common, notify, ISR and
// device configuration structures through the vendor capabilities, resets
// the device (status 0: it has no VFIO reset), negotiates features and
// sets up the queues in hugepage DMA memory at IOVAs taken from the ranges
// the IOMMU reports. Packed rings are preferred; split rings are used when
// the device does not offer packed ones (or Config.Split asks). Each queue
// has its own MSI-X vector wired to an eventfd, vector 0 reports
// configuration changes (the ISR structure, needed only without MSI-X, is
// not used), and the control queue (when offered) sets the receive mode
// and the number of queue pairs.
//
// The used side of each ring is a completion source. On a packed ring a
// descriptor is used when its AVAIL and USED bits both equal the driver's
// used wrap counter, which starts at 1 and flips on every lap; on a split
// ring the used index says how many entries the device wrote. The word
// that carries that ownership is loaded atomically before the rest of the
// entry is read, and every field the device wrote is checked against what
// was posted: a buffer id that is not outstanding, a length beyond the
// posted buffer, a descriptor whose flags are out of phase or a used index
// beyond the outstanding buffers become error completions, never a panic
// or an access outside the ring.
//
// Doorbells are batched: Send and PostRecv only write descriptors; Flush
// publishes the batch with one release store and notifies the device only
// when its event suppression (flags, or the event index with EVENT_IDX)
// asks for it; a packed ring's event behind the batch counts as asking,
// as QEMU leaves it there while it goes on reading. Used-buffer notifications are off while a queue is polled
// and armed only by a blocking read (with the packed ring's descriptor
// event, or the split ring's used_event, aimed at the threshold).
//
// Checksum offloads are negotiated where the device offers them (QEMU
// does on a tap backend, whose frames carry the virtio-net header; not on
// its hub or socket backends), unless nic.Config turns them off: with
// CSUM, TxQueue.SendL4Checksum posts a TCP or UDP frame with NEEDS_CSUM
// and the device fills in its checksum; with GUEST_CSUM, the read pass
// checks each received header once (flags and gso_type it negotiated,
// csum_start and csum_offset within the frame: anything else is an error
// completion) and RxQueue.ChecksumVerified reports DATA_VALID and
// NEEDS_CSUM frames checked. A NEEDS_CSUM frame's checksum field holds
// only the pseudo-header sum (its sender on the virtual wire left the
// checksum to an offload): the read pass completes it before the
// consumer sees the frame, so that no program forwards or records a
// partial checksum, unless the consumer trusts the device's verdict and
// says so with RxQueue.KeepPartialChecksums (package netstack does, with
// its receive offload on); FillChecksum then completes one on demand. Segmentation offloads (HOST_TSO4/6, GUEST_TSO4/6)
// are not negotiated. Device.OffloadStats counts what each did.
//
// The package stores ring fields in the machine's byte order and refuses to
// open a device on big-endian machines.
package virtio
