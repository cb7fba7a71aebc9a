package eventfd

import (
	"context"
	"errors"
	"os"
	"time"
)

// Reader is one blocking read, as Block drives it: the reader's state for
// the call (its buffer, its threshold) lives in the value, so that Block,
// instantiated for the concrete type, keeps it off the heap.
type Reader interface {
	// Poll reads without blocking into the caller's buffer from offset n
	// (the entries read so far) and returns how many it added; done ends
	// the read with err (enough read, an error completion, a signal).
	Poll(n int) (k int, done bool, err error)
	// Arm asks the device for an interrupt for what is still missing
	// after n entries; token is handed to the Sleep that follows (what
	// the reader must know of the moment it armed).
	Arm(n int) (token uint64, err error)
	// Sleep waits for the interrupt, the deadline (zero: none) or ctx. A
	// wake-up may be spurious; a deadline that passed may be reported
	// with an error matching os.ErrDeadlineExceeded or as nil.
	Sleep(ctx context.Context, deadline time.Time, token uint64) error
	// Expire ends a read whose time ran out with n entries read.
	Expire(n int) (int, error)
	// Stop ends a read with n entries read that err interrupted (ctx, a
	// failed arm or sleep, a close).
	Stop(n int, err error) (int, error)
}

// Block is the arm-poll-sleep loop of every blocking read in vfnic (a
// cq.CQ's SRead, a NIC queue's SRead): poll; when the read is not done
// and time remains, arm the interrupt, poll once more (an entry written
// before the arm raises no interrupt, so this poll closes the race), then
// sleep; and again. A timeout below zero waits forever, zero polls once;
// the deadline holds across spurious wake-ups. The goroutine that sleeps
// is the one that reads.
func Block[R Reader](ctx context.Context, r R, timeout time.Duration) (int, error) {
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	n := 0
	for {
		k, done, err := r.Poll(n)
		if n += k; done {
			return n, err
		}
		if timeout == 0 || (!deadline.IsZero() && !time.Now().Before(deadline)) {
			return r.Expire(n)
		}
		if err := ctx.Err(); err != nil {
			return r.Stop(n, err)
		}
		token, err := r.Arm(n)
		if err != nil {
			return r.Stop(n, err)
		}
		k, done, err = r.Poll(n)
		if n += k; done {
			return n, err
		}
		if err := r.Sleep(ctx, deadline, token); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			return r.Stop(n, err)
		}
	}
}
