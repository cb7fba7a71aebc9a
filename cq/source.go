package cq

import (
	"fmt"

	"github.com/vfnic/vfnic/eventfd"
)

// SourceState is what a Source reports after a poll.
type SourceState uint8

// Source states.
const (
	// SourceOK: the batch ended because the caller's buffer is full or no
	// further entry is available.
	SourceOK SourceState = iota
	// SourceError: an error completion waits at the head; ReadErr takes it.
	SourceError
	// SourceOverrun: the device overran the ring and every valid entry has
	// been read.
	SourceOverrun
)

// Source is one device completion ring feeding a CQ, the interface a
// driver implements (package cq/ring has one for every ring convention it
// reads, RingSource and QueueSource). The CQ calls it once per batch,
// never per entry, and serialises the calls (one goroutine at a time,
// under the CQ's lock). Driver.AddSource attaches one to a CQ.
type Source interface {
	// Attach tells the source the format of the CQ it joins. It is called
	// once, by Driver.AddSource.
	Attach(f Format) error
	// Poll moves up to len(ents) successful completions into ents (and
	// their source addresses into addrs when addrs is not nil), stopping
	// before an error entry, and publishes the consumer index once.
	// With no ents it consumes nothing but reports an error entry at the
	// head (SourceError) or an overrun (SourceOverrun).
	Poll(ents []Entry, addrs []Addr) (int, SourceState)
	// Pending counts the entries ready to be polled, up to max, without
	// consuming them. An error entry counts; an overrun counts as max.
	Pending(max int) int
	// ReadErr takes the error completion at the head into e (all fields
	// but ErrData) and returns its error data, which stays valid until the
	// next Poll or ReadErr. ok is false when the head is not an error.
	ReadErr(e *ErrEntry) (data []byte, ok bool)
	// Arm asks the device to interrupt when threshold entries are queued
	// (solicitedOnly: only for solicited or error completions), at once
	// when they are queued already: the CQ arms each of several sources
	// for its share of a threshold, counted just before, which the
	// device may have reached meanwhile. One interrupt per Arm (a
	// spurious one is allowed, a lost one is not); arming again before
	// it fires has no more effect.
	// Threshold 0 asks for the next entry beyond those the ring holds now
	// (verbs' ibv_req_notify_cq: entries present at the arm raise no
	// interrupt).
	Arm(solicitedOnly bool, threshold int) error
	// StrError describes a provider error number (and error data) that this
	// source produced; ok is false when it does not know the number.
	StrError(provErrno ProvErrno, errData []byte) (s string, ok bool)
	// Close releases the ring; the CQ calls it from Close.
	Close() error
}

// Driver is the driver side of a CQ, the operations a device's queues and
// a provider layer (verbs) use on it; a consumer reading completions has
// no need of it. It is a separate small type, reached through CQ.Driver,
// as database/sql/driver keeps what a driver implements off sql.DB's page:
// CQ's own methods are the fi_cq API and nothing else. The zero Driver
// (of a nil CQ) refuses every operation.
type Driver struct{ c *CQ }

// Driver returns the driver side of c.
func (c *CQ) Driver() Driver { return Driver{c} }

// AddSource attaches a device completion ring to the CQ. Sources are
// polled in the order they were added. It fails with ErrClosed on a closed
// CQ and ErrInvalid for a nil source or CQ.
func (d Driver) AddSource(s Source) error {
	switch {
	case d.c == nil:
		return fmt.Errorf("%w: AddSource: nil CQ", ErrInvalid)
	case s == nil:
		return fmt.Errorf("%w: AddSource: nil source", ErrInvalid)
	}
	return d.c.addSource(s)
}

// Bind records an endpoint (a device queue) that reports to the CQ; Close
// fails with ErrBusy until it is unbound (fi_ep_bind).
func (d Driver) Bind() error {
	if d.c == nil {
		return fmt.Errorf("%w: Bind on a nil CQ", ErrInvalid)
	}
	return d.c.bind()
}

// Unbind undoes one Bind.
func (d Driver) Unbind() {
	if d.c != nil {
		d.c.unbind()
	}
}

// Bound returns the number of endpoints bound to the CQ.
func (d Driver) Bound() int {
	if d.c == nil {
		return 0
	}
	return d.c.boundCount()
}

// Interrupt returns the eventfd that the device's completion interrupts
// for the CQ must signal (VFIO SET_IRQS, or the software device's Add);
// nil when the CQ has no wait object or waits by yielding.
func (d Driver) Interrupt() *eventfd.FD {
	if d.c == nil {
		return nil
	}
	return d.c.wait
}

// Pending counts the completions the CQ's sources hold, error entries
// included, up to max; an overrun or a closed CQ counts as max. It is for
// a provider that checks what a resize must keep.
func (d Driver) Pending(max int) int {
	if d.c == nil || max <= 0 {
		return 0
	}
	return d.c.pending(max)
}
