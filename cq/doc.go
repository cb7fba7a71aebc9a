// Package cq reads completion rings that a device writes into DMA memory
// and offers them through a completion-queue API with the semantics of
// libfabric's fi_cq(3).
//
// The layers, bottom up:
//
//   - Layout and Ring: a declarative description of a device's completion
//     entry (size, ownership word and convention, field offsets) and a
//     reader that decides ownership by the phase, owner, wrap, generation
//     or DD bit, loading the ownership word atomically before the rest of
//     the entry, and publishes the consumer index once per batch.
//   - Table: the operations a driver posted, so that every id, length and
//     status a device writes is checked before use; a bad entry becomes an
//     error completion (ProvBadID, ProvBadLen, ...), never a panic.
//   - RingSource: a Ring plus its Tables and the device's status and
//     opcode codes, converting entries to the CQ's format in one pass with
//     no call per entry. A layout whose fields are byte-aligned is read by
//     a loop compiled for the CQ's format and the fields' widths, chosen
//     once (fast.go); any other by a generic loop. Source is the small
//     interface (called once per batch) through which a CQ reaches it.
//   - CQ: one or more Sources behind Read, ReadFrom, ReadErr, SRead,
//     SReadFrom, Signal, StrError, WaitFD/TryWait and Close. Blocking
//     reads arm the device's interrupt, poll again and park the goroutine
//     on an eventfd through Go's runtime poller.
//
// Decisions where the references disagree: errors stay in completion
// order (a read returns the successes before the first error entry; a
// read whose head is an error returns ErrAvail); an overrun CQ returns its
// valid entries, then ErrOverrun for good; Signal wakes SRead with an error
// matching ErrAgain, and a Signal sent before SRead is remembered; the
// threshold is a count passed by value; SRead without a wait object
// returns ErrNoWait; the timeout counts down across spurious wake-ups,
// negative waits forever, zero tries once.
//
// Read, ReadFrom and ReadErr do not allocate.
package cq
