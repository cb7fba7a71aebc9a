package nic

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Waitable is the part of a queue that a blocking read uses.
type Waitable interface {
	Poll(out []Completion) int
	Arm(threshold int) error
	WaitInterrupt(ctx context.Context, deadline time.Time) error
}

// SRead implements Queue.SRead for drivers: poll; when fewer than threshold
// completions were read, arm the interrupt for the rest, poll once more
// (an entry written before the arm raises no interrupt), then sleep on the
// interrupt; repeat until threshold completions, an error completion, the
// timeout, ctx or Close. The timeout counts down across spurious wake-ups.
// Completions already read are always returned (with a nil error), even
// when ctx ends or the queue closes meanwhile; the next call reports that.
func SRead(ctx context.Context, q Waitable, out []Completion, threshold int, timeout time.Duration) (int, error) {
	if ctx == nil {
		return 0, fmt.Errorf("%w: nil context", ErrInvalid)
	}
	if len(out) == 0 {
		return 0, nil
	}
	thr := min(max(threshold, 1), len(out))
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	n := 0
	done := func() bool { return n >= thr || (n > 0 && out[n-1].Err != nil) }
	for {
		n += q.Poll(out[n:])
		if done() {
			return n, nil
		}
		if timeout == 0 || (!deadline.IsZero() && !time.Now().Before(deadline)) {
			break
		}
		if err := ctx.Err(); err != nil {
			return finish(n, err)
		}
		if err := q.Arm(thr - n); err != nil {
			return finish(n, err)
		}
		n += q.Poll(out[n:])
		if done() {
			return n, nil
		}
		err := q.WaitInterrupt(ctx, deadline)
		if errors.Is(err, ErrClosed) {
			// A queue closed under the reader may still report what
			// happened to its operations (ErrCanceled completions).
			n += q.Poll(out[n:])
		}
		if err != nil && !errors.Is(err, ErrTimeout) {
			return finish(n, err)
		}
	}
	return finish(n, ErrTimeout)
}

// finish returns what was read, or err when nothing was.
func finish(n int, err error) (int, error) {
	if n > 0 {
		return n, nil
	}
	return 0, err
}
