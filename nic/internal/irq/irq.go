// Package irq is what the drivers' queues share about their MSI-X
// interrupt eventfd: counting the interrupts taken from it, and the wait
// of nic.Queue.WaitInterrupt with its errors.
package irq

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/vfnic/vfnic/eventfd"
	"github.com/vfnic/vfnic/nic"
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
