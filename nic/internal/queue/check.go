package queue

import (
	"fmt"
	"github.com/vfnic/vfnic/nic"

	"github.com/vfnic/vfnic/cq"
)

// Checks every driver makes the same way, with the same errors.

// QueueAt returns qs[i], a driver's typed queue accessor's answer; an
// index out of range is an error matching nic.ErrInvalid that names the device
// (dev) and the kind of queue ("receive", "transmit").
func QueueAt[Q any](qs []Q, i int, dev, kind string) (Q, error) {
	if i < 0 || i >= len(qs) {
		var zero Q
		return zero, fmt.Errorf("%w: %s: %s queue %d of %d", nic.ErrInvalid, dev, kind, i, len(qs))
	}
	return qs[i], nil
}

// CheckBind checks the arguments of Device.BindCQ for a device named dev
// with pairs queue pairs, closed or not: nic.ErrClosed, or an error matching
// nic.ErrInvalid for a nil CQ, a pair out of range or an unknown direction.
func CheckBind(dev string, closed bool, c *cq.CQ, i, pairs int, dir nic.Direction) error {
	switch {
	case closed:
		return nic.ErrClosed
	case c == nil:
		return fmt.Errorf("%w: %s: nil CQ", nic.ErrInvalid, dev)
	case i < 0 || i >= pairs:
		return fmt.Errorf("%w: %s: queue pair %d of %d", nic.ErrInvalid, dev, i, pairs)
	case dir == 0 || dir&^(nic.Recv|nic.Send) != 0:
		return fmt.Errorf("%w: %s: direction %#x", nic.ErrInvalid, dev, uint8(dir))
	}
	return nil
}
