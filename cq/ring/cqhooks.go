package ring

import (
	"errors"
	"fmt"

	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/cq/internal/provider"
	"github.com/vfnic/vfnic/eventfd"
)

// ErrFull means a posted-operation table has no free slot.
var ErrFull = errors.New("cq/ring: no free slot for a posted operation")

// AddSource attaches a device completion ring to c. Sources are polled in
// the order they were added. It fails with cq.ErrClosed on a closed CQ and
// cq.ErrInvalid for a nil source or one already attached.
func AddSource(c *cq.CQ, s Source) error {
	switch {
	case c == nil:
		return fmt.Errorf("%w: AddSource: nil CQ", cq.ErrInvalid)
	case s == nil:
		return fmt.Errorf("%w: AddSource: nil source", cq.ErrInvalid)
	}
	return provider.CQ.AddSource(c, s)
}

// Bind records an endpoint (a device queue) that reports to c; c.Close
// fails with cq.ErrBusy until it is unbound (fi_ep_bind).
func Bind(c *cq.CQ) error {
	if c == nil {
		return fmt.Errorf("%w: Bind(nil)", cq.ErrInvalid)
	}
	return provider.CQ.Bind(c)
}

// Unbind undoes one Bind.
func Unbind(c *cq.CQ) {
	if c != nil {
		provider.CQ.Unbind(c)
	}
}

// Bound returns the number of endpoints bound to c.
func Bound(c *cq.CQ) int {
	if c == nil {
		return 0
	}
	return provider.CQ.Bound(c)
}

// Interrupt returns the eventfd that the device's completion interrupts
// for c must signal (VFIO SET_IRQS, or the software device's Add); nil
// when c has no wait object or waits by yielding.
func Interrupt(c *cq.CQ) *eventfd.FD {
	if c == nil {
		return nil
	}
	return provider.CQ.Interrupt(c)
}

// Pending counts the completions c's sources hold, error entries
// included, up to max; an overrun or a closed CQ counts as max. It is for
// a provider that checks what a resize must keep.
func Pending(c *cq.CQ, max int) int {
	if c == nil || max <= 0 {
		return 0
	}
	return provider.CQ.Pending(c, max)
}
