package verbs

import (
	"context"
	"fmt"
	"os"
	"syscall"

	"github.com/vfnic/vfnic/cq"
)

// The errors of this package are those of package cq where one exists, so
// that one errors.Is test covers both: closed is os.ErrClosed, a bad
// argument os.ErrInvalid (EINVAL), not supported errors.ErrUnsupported,
// busy cq.ErrBusy (and syscall.EBUSY), overrun cq.ErrOverrun.
var (
	// ErrEmpty is StartPoll's and NextPoll's ENOENT: no completion is
	// available; the CQ stays valid. It matches syscall.ENOENT and
	// cq.ErrAgain.
	ErrEmpty error = &errnoError{"verbs: no completion available", syscall.ENOENT, cq.ErrAgain}
	// ErrNoEvent is TryGetEvent's EAGAIN: no event is queued on the
	// channel. It matches syscall.EAGAIN and cq.ErrAgain.
	ErrNoEvent error = &errnoError{"verbs: no completion event queued", syscall.EAGAIN, cq.ErrAgain}
)

// errnoError is a preallocated error that matches an errno and a cq
// sentinel, so the iterator returns it without allocating.
type errnoError struct {
	msg   string
	errno syscall.Errno
	alias error
}

// Error returns the message.
func (e *errnoError) Error() string { return e.msg }

// Is matches the errno and the cq sentinel.
func (e *errnoError) Is(target error) bool { return target == e.errno || target == e.alias }

// busyError is a resource still in use: it matches cq.ErrBusy, the busy
// sentinel of this package, and syscall.EBUSY, the errno verbs returns,
// with a message of its own (cq.ErrBusy's says "endpoints still bound").
type busyError struct{ msg string }

// Error returns the message.
func (e *busyError) Error() string { return e.msg }

// Is matches cq.ErrBusy and syscall.EBUSY.
func (e *busyError) Is(target error) bool { return target == cq.ErrBusy || target == syscall.EBUSY }

// invalid wraps a message as an error matching os.ErrInvalid (EINVAL).
func invalid(format string, args ...any) error {
	return fmt.Errorf("verbs: %w: %s", os.ErrInvalid, fmt.Sprintf(format, args...))
}

// unsupported wraps a message as an error matching errors.ErrUnsupported.
func unsupported(format string, args ...any) error {
	return fmt.Errorf("verbs: %w: %s", cq.ErrNotSupported, fmt.Sprintf(format, args...))
}

// deadlineError is a context that ended while waiting: it matches
// ctx.Err() and, for an expired deadline, os.ErrDeadlineExceeded as Go's
// own deadlines do.
type deadlineError struct {
	msg   string
	cause error
}

// Error returns the message.
func (e *deadlineError) Error() string { return e.msg + ": " + e.cause.Error() }

// Unwrap returns the context's error.
func (e *deadlineError) Unwrap() error { return e.cause }

// Is matches os.ErrDeadlineExceeded when the context's deadline passed.
func (e *deadlineError) Is(target error) bool {
	return target == os.ErrDeadlineExceeded && e.cause == context.DeadlineExceeded
}

// Timeout reports whether the deadline passed (the net.Error convention).
func (e *deadlineError) Timeout() bool { return e.cause == context.DeadlineExceeded }

func ctxError(msg string, ctx context.Context) error {
	return &deadlineError{msg: msg, cause: ctx.Err()}
}
