package nic

import (
	"fmt"

	"github.com/vfnic/vfnic/cq"
)

// The helpers below are for drivers: checks every driver makes the same
// way, with the same errors.

// QueueAt returns qs[i], a driver's typed queue accessor's answer; an
// index out of range is an error matching ErrInvalid that names the device
// (dev) and the kind of queue ("receive", "transmit").
func QueueAt[Q any](qs []Q, i int, dev, kind string) (Q, error) {
	if i < 0 || i >= len(qs) {
		var zero Q
		return zero, fmt.Errorf("%w: %s: %s queue %d of %d", ErrInvalid, dev, kind, i, len(qs))
	}
	return qs[i], nil
}

// CheckBind checks the arguments of Device.BindCQ for a device named dev
// with pairs queue pairs, closed or not: ErrClosed, or an error matching
// ErrInvalid for a nil CQ, a pair out of range or an unknown direction.
func CheckBind(dev string, closed bool, c *cq.CQ, i, pairs int, dir Direction) error {
	switch {
	case closed:
		return ErrClosed
	case c == nil:
		return fmt.Errorf("%w: %s: nil CQ", ErrInvalid, dev)
	case i < 0 || i >= pairs:
		return fmt.Errorf("%w: %s: queue pair %d of %d", ErrInvalid, dev, i, pairs)
	case dir == 0 || dir&^(Recv|Send) != 0:
		return fmt.Errorf("%w: %s: direction %#x", ErrInvalid, dev, uint8(dir))
	}
	return nil
}
