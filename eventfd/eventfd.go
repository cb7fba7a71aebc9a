// Package eventfd wraps a Linux eventfd so that a goroutine can sleep on it
// through Go's runtime poller instead of pinning an OS thread. vfnic uses
// eventfds for MSI-X interrupts (VFIO writes them), for the software device's
// interrupts and for completion-queue wait objects.
package eventfd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// ErrTimeout is returned by Wait when its deadline passes with no event. It
// is os.ErrDeadlineExceeded, as for Go's own deadlines.
var ErrTimeout = os.ErrDeadlineExceeded

// ErrClosed is returned by operations on a closed FD. It is os.ErrClosed.
var ErrClosed = os.ErrClosed

// FD is an eventfd counter. Add and Take may be called from any goroutine;
// Wait parks the calling goroutine on the runtime poller. Concurrent Waits
// are serialised by the poller's read lock, so callers that need several
// sleepers on one source arrange for one of them to wait on the FD.
type FD struct {
	f  *os.File
	fd int

	mu     sync.Mutex // guards closed against Close racing Add/Take
	closed bool
}

// New creates a non-blocking, close-on-exec eventfd with a zero counter.
func New() (*FD, error) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("eventfd: eventfd2: %w", err)
	}
	// A non-blocking fd handed to os.NewFile is registered with the poller,
	// which is what lets Wait sleep without holding a thread.
	return &FD{f: os.NewFile(uintptr(fd), "eventfd"), fd: fd}, nil
}

// Fd returns the descriptor, for epoll/poll or for VFIO's SET_IRQS. It stays
// owned by the FD: do not close it. It is -1 after Close.
func (e *FD) Fd() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return -1
	}
	return e.fd
}

// Add adds n to the counter, waking a waiter. It never blocks: a counter
// that would overflow reports unix.EAGAIN.
func (e *FD) Add(n uint64) error {
	var b [8]byte
	putU64(b[:], n)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return ErrClosed
	}
	if _, err := unix.Write(e.fd, b[:]); err != nil {
		return fmt.Errorf("eventfd: write: %w", err)
	}
	return nil
}

// Take reads and resets the counter without blocking; it returns 0 when no
// event is pending.
func (e *FD) Take() (uint64, error) {
	var b [8]byte
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return 0, ErrClosed
	}
	n, err := unix.Read(e.fd, b[:])
	if err == unix.EAGAIN {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("eventfd: read: %w", err)
	}
	if n != 8 {
		return 0, fmt.Errorf("eventfd: short read of %d bytes", n)
	}
	return getU64(b[:]), nil
}

// Wait sleeps until the counter is non-zero, then reads and resets it. It
// returns ErrTimeout when deadline (if not zero) passes first, ctx.Err() when
// ctx is cancelled, and ErrClosed when the FD is closed, including by a Close
// that happens while it waits.
func (e *FD) Wait(ctx context.Context, deadline time.Time) (uint64, error) {
	if ctx == nil {
		return 0, fmt.Errorf("eventfd: nil context: %w", os.ErrInvalid)
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if err := e.f.SetReadDeadline(deadline); err != nil {
		return 0, e.mapErr(ctx, err)
	}
	var stop func() bool
	if ctx.Done() != nil {
		// Cancellation expires the deadline, which wakes the poller.
		stop = context.AfterFunc(ctx, func() { _ = e.f.SetReadDeadline(time.Unix(1, 0)) })
	}
	var b [8]byte
	n, err := e.f.Read(b[:])
	if stop != nil && !stop() {
		return 0, ctx.Err()
	}
	if err != nil {
		return 0, e.mapErr(ctx, err)
	}
	if n != 8 {
		return 0, fmt.Errorf("eventfd: short read of %d bytes", n)
	}
	return getU64(b[:]), nil
}

func (e *FD) mapErr(ctx context.Context, err error) error {
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return ErrTimeout
	case errors.Is(err, os.ErrClosed):
		return ErrClosed
	}
	return fmt.Errorf("eventfd: wait: %w", err)
}

// Close releases the descriptor and wakes a goroutine blocked in Wait.
// It is safe to call more than once.
func (e *FD) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil
	}
	e.closed = true
	return e.f.Close()
}

func putU64(b []byte, v uint64) {
	for i := 0; i < 8; i++ {
		b[i] = byte(v >> (8 * i))
	}
}

func getU64(b []byte) uint64 {
	var v uint64
	for i := 0; i < 8; i++ {
		v |= uint64(b[i]) << (8 * i)
	}
	return v
}
