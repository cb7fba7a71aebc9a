// Package irq is what the drivers' queues share about their MSI-X
// interrupt: counting the interrupts taken from its eventfd, the wait of
// nic.Queue.WaitInterrupt with its errors, and steering it to a CPU
// (nic.InterruptSteerer).
package irq

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/vfnic/vfnic/eventfd"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/vfio"
)

// TakeLeft adds to taken the interrupts left on fd (a wait on a pinned
// thread leaves the one it woke on), so that the next wait sleeps until a
// new one. Arm calls it before arming and outside the queue's lock: it
// may make a system call.
func TakeLeft(fd *eventfd.FD, taken *atomic.Uint64) {
	if n, err := fd.TakeLeft(); err == nil {
		taken.Add(n)
	}
}

// Wait sleeps until fd signals, ctx ends or deadline passes (zero: none),
// and adds the interrupts it took to taken. Errors: nic.ErrTimeout at the
// deadline, nic.ErrClosed itself once fd is closed (the queue replaces it
// with its own reason), ctx's error.
func Wait(ctx context.Context, fd *eventfd.FD, deadline time.Time, taken *atomic.Uint64) error {
	n, err := fd.Await(ctx, deadline)
	taken.Add(n)
	return waitErr(err)
}

// WaitFor is Wait until ready says so, looked at after each event of fd
// (eventfd.FD.WaitFor), for an fd whose readiness can last with nothing
// new: it counts the one wake-up it returns for in taken.
func WaitFor(ctx context.Context, fd *eventfd.FD, deadline time.Time, ready func() bool, taken *atomic.Uint64) error {
	err := fd.WaitFor(ctx, deadline, ready)
	if err == nil {
		taken.Add(1)
	}
	return waitErr(err)
}

// waitErr is Wait's error for what the eventfd's wait returned.
func waitErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, eventfd.ErrTimeout):
		return nic.ErrTimeout
	case errors.Is(err, eventfd.ErrClosed):
		return nic.ErrClosed
	}
	return err
}

// Steer is nic.InterruptSteerer.SteerInterrupt for the queue named name
// whose interrupt is MSI-X vector of dev: ErrNotSupported without a vfio
// device (a driver under test) or a vector (-1).
func Steer(dev *vfio.Device, vector, cpu int, name string) error {
	if dev == nil || vector < 0 {
		return fmt.Errorf("%w: %s: no MSI-X vector to steer", nic.ErrNotSupported, name)
	}
	return dev.SteerMSIX(vector, cpu)
}
