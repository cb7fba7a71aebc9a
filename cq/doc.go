// Package cq is a completion queue with the semantics of libfabric's
// fi_cq(3), over the completion rings a device writes into DMA memory.
//
// A CQ comes from a device (cq/qpsim's OpenCQ) or from New and a device's
// BindCQ. Read, ReadFrom and ReadErr take completions without blocking and
// without allocating; SRead and SReadFrom block, arming the device's
// interrupt, polling again and parking the goroutine on an eventfd through
// Go's runtime poller; Signal wakes a blocked SRead; WaitFD and TryWait
// hand the wait object to an epoll loop; StrError describes a provider
// error; Close releases the CQ and its device rings.
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
// Errors: a closed CQ returns errors matching os.ErrClosed, an expired
// SRead one matching both ErrAgain and os.ErrDeadlineExceeded, a bad
// argument os.ErrInvalid, as in Go's os and net packages.
//
// Drivers feed a CQ by implementing Source (package cq/ring has one for
// each ring convention) and attaching it through the CQ's Driver side;
// package cq/ring describes and reads their completion rings.
package cq
