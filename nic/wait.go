package nic

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/vfnic/vfnic/eventfd"
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
// A nil ctx or q is refused with ErrInvalid.
func SRead(ctx context.Context, q Waitable, out []Completion, threshold int, timeout time.Duration) (int, error) {
	if ctx == nil {
		return 0, fmt.Errorf("%w: nil context", ErrInvalid)
	}
	if q == nil {
		return 0, fmt.Errorf("%w: nil queue", ErrInvalid)
	}
	if len(out) == 0 {
		return 0, nil
	}
	return eventfd.Block(ctx, queueRead{q: q, out: out, thr: min(max(threshold, 1), len(out))}, timeout)
}

// queueRead is one SRead on a queue, for eventfd.Block (the loop a cq.CQ's
// SRead runs too).
type queueRead struct {
	q   Waitable
	out []Completion
	thr int
}

// Poll implements eventfd.Reader: done at the threshold or after an error
// completion (always the last of a Poll).
func (r queueRead) Poll(n int) (int, bool, error) {
	k := r.q.Poll(r.out[n:])
	n += k
	return k, n >= r.thr || (k > 0 && r.out[n-1].Err != nil), nil
}

// Arm implements eventfd.Reader.
func (r queueRead) Arm(n int) (uint64, error) { return 0, r.q.Arm(r.thr - n) }

// Sleep implements eventfd.Reader.
func (r queueRead) Sleep(ctx context.Context, deadline time.Time, _ uint64) error {
	return r.q.WaitInterrupt(ctx, deadline)
}

// Expire implements eventfd.Reader.
func (r queueRead) Expire(n int) (int, error) { return finish(n, ErrTimeout) }

// Stop implements eventfd.Reader: a queue closed under the reader may still
// report what happened to its operations (ErrCanceled completions).
func (r queueRead) Stop(n int, err error) (int, error) {
	if errors.Is(err, ErrClosed) {
		n += r.q.Poll(r.out[n:])
	}
	return finish(n, err)
}

// finish returns what was read, or err when nothing was.
func finish(n int, err error) (int, error) {
	if n > 0 {
		return n, nil
	}
	return 0, err
}
