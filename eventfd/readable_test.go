package eventfd

import (
	"context"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestReadable: an FD over a pipe's read end wakes its waiters, on the
// runtime poller and on a pinned thread, when the pipe holds data, without
// reading it; it times out, and Close ends a wait, once it is drained.
func TestReadable(t *testing.T) {
	for _, pinned := range []bool{false, true} {
		name := map[bool]string{false: "poller", true: "thread"}[pinned]
		t.Run(name, func(t *testing.T) {
			var p [2]int
			require.NoError(t, unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK))
			defer unix.Close(p[0])
			defer unix.Close(p[1])
			e, err := Readable(p[0])
			require.NoError(t, err)
			require.NotEqual(t, p[0], e.Fd(), "a duplicate is held")
			require.ErrorIs(t, e.Add(1), os.ErrInvalid)

			run := func(f func() error) error { return <-onGoroutine(t, pinned, f) }
			// Nothing to read: the deadline passes.
			require.ErrorIs(t, run(func() error {
				_, err := e.Wait(context.Background(), time.Now().Add(20*time.Millisecond))
				return err
			}), ErrTimeout)
			// Data written while waiting wakes the wait, which reads nothing.
			require.NoError(t, run(func() error {
				go func() { time.Sleep(10 * time.Millisecond); _, _ = unix.Write(p[1], []byte{7}) }()
				n, err := e.Await(context.Background(), time.Now().Add(5*time.Second))
				if err == nil && n != 1 {
					t.Errorf("Await gave %d, want 1", n)
				}
				return err
			}))
			n, err := e.Take()
			require.NoError(t, err)
			require.Zero(t, n, "a readiness FD has no counter")
			// Still readable: a second wait returns at once.
			require.NoError(t, run(func() error {
				_, err := e.Wait(context.Background(), time.Now().Add(5*time.Second))
				return err
			}))
			var b [1]byte
			_, err = unix.Read(p[0], b[:])
			require.NoError(t, err)
			// Drained: Close ends a wait.
			require.ErrorIs(t, run(func() error {
				go func() { time.Sleep(20 * time.Millisecond); _ = e.Close() }()
				_, err := e.Wait(context.Background(), time.Time{})
				return err
			}), ErrClosed)
			var st unix.Stat_t
			require.NoError(t, unix.Fstat(p[0], &st), "the caller's descriptor stays open")
		})
	}
}

// TestWritable: an FD over a socket's write readiness sleeps while the
// socket's send buffer is full and wakes, on the poller and on a pinned
// thread, when the peer reads and frees it, writing nothing itself; once
// writable for good, WaitFor still sleeps until the next event (a write
// the peer then reads: the socket's write-space callback, which is how
// AF_XDP reports a completed send), and Close ends a wait.
func TestWritable(t *testing.T) {
	for _, pinned := range []bool{false, true} {
		t.Run(map[bool]string{false: "poller", true: "thread"}[pinned], func(t *testing.T) {
			p, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
			require.NoError(t, err)
			defer unix.Close(p[0])
			defer unix.Close(p[1])
			chunk := make([]byte, 4096)
			for {
				if _, err := unix.Write(p[0], chunk); err != nil {
					require.ErrorIs(t, err, unix.EAGAIN)
					break
				}
			}
			e, err := Writable(p[0])
			require.NoError(t, err)
			defer e.Close()
			require.True(t, e.Readiness())
			require.True(t, e.WriteReadiness())
			drain := func() {
				b := make([]byte, 4096)
				for {
					if _, err := unix.Read(p[1], b); err != nil {
						return
					}
				}
			}

			run := func(f func() error) <-chan error { return onGoroutine(t, pinned, f) }
			// Full: the deadline passes.
			require.ErrorIs(t, result(t, run(func() error {
				_, err := e.Wait(context.Background(), time.Now().Add(20*time.Millisecond))
				return err
			}), "Wait on a full socket"), ErrTimeout)
			// The peer reading frees the buffer and wakes the wait.
			require.NoError(t, result(t, run(func() error {
				go func() { time.Sleep(10 * time.Millisecond); drain() }()
				n, err := e.Await(context.Background(), time.Now().Add(5*time.Second))
				if err == nil && n != 1 {
					t.Errorf("Await gave %d, want 1", n)
				}
				return err
			}), "Await while the peer drains"))

			// Writable for good: WaitFor sleeps until an event brings what
			// ready looks for.
			var ok atomic.Bool
			r := run(func() error {
				return e.WaitFor(context.Background(), time.Now().Add(5*time.Second), ok.Load)
			})
			time.Sleep(100 * time.Millisecond)
			select {
			case err := <-r:
				t.Fatalf("returned on a stale write readiness: %v", err)
			default:
			}
			ok.Store(true)
			_, err = unix.Write(p[0], []byte{1})
			require.NoError(t, err)
			drain()
			require.NoError(t, result(t, r, "WaitFor after the peer read"))

			r = run(func() error { return e.WaitFor(context.Background(), time.Time{}, func() bool { return false }) })
			time.Sleep(50 * time.Millisecond)
			require.NoError(t, e.Close())
			require.ErrorIs(t, result(t, r, "WaitFor, closed"), ErrClosed)
		})
	}
}
