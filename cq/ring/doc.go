// Package ring is the driver kit behind package cq: it describes a
// device's completion ring, reads it by its ownership bits and feeds the
// entries to a cq.CQ.
//
// The layers, bottom up:
//
//   - Layout and Ring: a declarative description of a device's completion
//     entry (size, ownership word and convention, field offsets) and a
//     reader that decides ownership by the phase, owner, wrap, generation
//     or DD bit, loading the ownership word atomically before the rest of
//     the entry, and publishes the consumer index once per batch.
//   - Table: the operations a driver posted, so that every id, length,
//     status and opcode a device writes is checked before use (an opcode
//     must report the kind of operation posted); a bad entry becomes an
//     error completion (cq.ProvBadID, cq.ProvBadLen, cq.ProvBadOp, ...),
//     never a panic.
//   - RingSource: a Ring plus its Tables and the device's status and
//     opcode codes, converting entries to the CQ's format in one pass with
//     no call per entry. A layout whose fields are byte-aligned is read by
//     a loop compiled for the CQ's format and the fields' widths, chosen
//     once (fast.go); any other by a generic loop.
//   - NextBatch: a NIC driver's read of its own ring, a batch at a time,
//     into Completion, a lean record (no cq.Entry: what a NIC reports):
//     a loop for the layouts of one queue per ring (an id, a length, a
//     status, the driver's Meta words), with copies whose geometry is
//     constant for virtio's packed ring and split used ring and igb's
//     write-back descriptors, every other entry read by the generic path;
//     the driver then makes one pass of its own over the batch
//     (Example_driverRead). batch.go holds the loops and everything they
//     call per entry.
//   - QueueSource: the cq.Source of a NIC driver's queue that reads its
//     own ring.
//
// RingSource and QueueSource implement cq.Source, the interface package
// cq declares for its sources; a driver attaches one with the CQ's
// Driver().AddSource (once per batch, never per entry, the CQ calls it),
// records the device queues bound to it (Driver().Bind) and wires its
// interrupts to the CQ's eventfd (Driver().Interrupt).
package ring
