// Package igb drives the Intel 82576 family (igb) through VFIO, behind the
// nic interface: QEMU's -device igb, and the i350 and relatives once their
// row of the MAC table (macs) is filled in and checked on hardware.
//
// Bring-up follows the 82576 datasheet (sections 4.5 and 4.6, "Software
// initialization sequence") as Linux igb and DPDK's e1000/igb PMD do it:
// mask interrupts, stop RX/TX, CTRL.RST and wait for it to clear, read the
// MAC from RAL0/RAH0, set link up (CTRL.SLU) and read link state from STATUS,
// program MSI-X (GPIE, IVAR, IVAR_MISC), then each queue (ring base and
// length, SRRCTL advanced one-buffer descriptors, head and tail, RXDCTL or
// TXDCTL enable) and finally RCTL and TCTL.
//
// Both directions use 16-byte advanced descriptors (QEMU's model has no
// legacy ones). A queue's ring is both its posting ring and its completion
// ring: the device sets the DD status bit in the write-back form, the
// driver reads it through cq's ring reader (DescriptorDone convention, the
// descriptor position is the id) and re-posts by writing a fresh
// read-format descriptor, which clears DD. Transmit completions use DD on
// every descriptor (posted with RS) rather than head write-back (TDWBAL):
// that way both directions go through the same validating reader, and a
// completion is tied to the descriptor it completes, not to a head value
// the driver would have to trust. A context descriptor (SendChecksum's
// checksum offload), for which the device writes nothing back, is
// completed by the queue itself once the frame's descriptor after it is.
//
// Vector 0 takes link and other causes (one interrupt per link change;
// see Device.LinkInterrupt). Each receive and transmit queue has its own
// MSI-X vector while the device has enough (4 pairs on QEMU's model, which
// has 10); beyond that the receive and transmit queue of a pair share one,
// as Linux igb pairs them (up to 9 pairs there), and Config.NoQueueInterrupts
// gives the queues none, for polling, up to the MAC's 16 pairs. A blocking
// read arms by unmasking its vector (EIMS), polls once more and sleeps on
// the vector's eventfd; a read that returns completions masks it again
// (EIMC), a shared vector once neither queue of the pair is armed, and an
// interrupt one queue of such a pair takes is passed on to the other as a
// wake-up. Wake-ups are hints: QEMU's moderation timer has been known to
// interrupt with no cause, and a woken reader that finds nothing sleeps
// again.
package igb

// What the register values were checked against, and what is not tested
// here:
//
//   - Offsets and bits (regs.go) come from the 82576 datasheet's register
//     summary (section 8) with the names of Linux's e1000_regs.h,
//     e1000_defines.h and e1000_82575.h and DPDK's e1000 base code, and
//     were checked against QEMU 10's igb model (hw/net/igb_regs.h,
//     igb_core.c) by running on it: reset, MAC from RAL0/RAH0, MDIC and
//     PHY auto-negotiation, link from STATUS, SRRCTL one-buffer advanced
//     descriptors, RXDCTL/TXDCTL, GPIE, IVAR (82576 layout), IVAR_MISC,
//     EIMS/EIMC/EICR/EIAC, EITR, MRQC/RETA/RSSRK with RXCSUM.PCSD, RCTL,
//     TCTL, LPE/RLPML. QEMU raises an MSI-X message only for an EICR&EIMS
//     bit that newly rises, and an ICR cause only once it was cleared: the
//     other-causes vector is in EIAC and Link reads ICR (hw/net/igb_core.c,
//     igb_raise_interrupts; Linux igb_msix_other reads ICR too).
//   - Untested here: real 82576 and i350 silicon (the i350 row of the MAC
//     table, its IVAR layout and SYSTIM width are from the datasheet and
//     Linux, and Match refuses it); EIAM auto-masking (QEMU does not apply
//     it); EEPROM auto-read completion (EECD.AUTO_RD), which QEMU does not
//     model, so bring-up relies on RAH0.AV; copper PHY timing; flow
//     control; RXE on a device (QEMU never sets it; the refusal of such
//     a write-back is tested on the fake device).
//   - Checked on QEMU's model by the VM tests: VLAN stripping (CTRL.VME,
//     the tag in the write-back) and transmit checksum offload through
//     context descriptors (IXSM, TXSM; QEMU computes the L4 checksum
//     itself and ignores the pseudo-header seed real silicon adds to).
