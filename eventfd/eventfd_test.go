package eventfd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestAddTake(t *testing.T) {
	e, err := New()
	require.NoError(t, err)
	defer e.Close()
	n, err := e.Take()
	require.NoError(t, err)
	require.Zero(t, n)
	require.NoError(t, e.Add(2))
	require.NoError(t, e.Add(3))
	n, err = e.Take()
	require.NoError(t, err)
	require.EqualValues(t, 5, n, "the counter merges events")
}

type waitFunc func(context.Context, time.Time) (uint64, error)

// eachWait runs f on a new FD with each of Wait's two ways to sleep.
func eachWait(t *testing.T, f func(t *testing.T, e *FD, wait waitFunc)) {
	for _, name := range []string{"poller", "thread"} {
		t.Run(name, func(t *testing.T) {
			e, err := New()
			require.NoError(t, err)
			defer e.Close()
			wait := func(ctx context.Context, d time.Time) (uint64, error) { return e.waitPoller(ctx, d, nil) }
			if name == "thread" {
				wait = func(ctx context.Context, d time.Time) (uint64, error) { return e.waitThread(ctx, d, true) }
			}
			f(t, e, wait)
		})
	}
}

func TestWaitWakes(t *testing.T) {
	eachWait(t, func(t *testing.T, e *FD, wait waitFunc) {
		go func() {
			time.Sleep(10 * time.Millisecond)
			_ = e.Add(2)
		}()
		n, err := wait(context.Background(), time.Time{})
		require.NoError(t, err)
		require.EqualValues(t, 2, n)

		// A count already there returns at once, and is taken.
		require.NoError(t, e.Add(1))
		n, err = wait(context.Background(), time.Now().Add(time.Second))
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		n, err = e.Take()
		require.NoError(t, err)
		require.Zero(t, n)
	})
}

func TestWaitTimeoutAndCancel(t *testing.T) {
	eachWait(t, func(t *testing.T, e *FD, wait waitFunc) {
		var err error
		deadline := time.Now().Add(20 * time.Millisecond)
		_, err = wait(context.Background(), deadline)
		require.ErrorIs(t, err, ErrTimeout)
		require.False(t, time.Now().Before(deadline), "returned before its deadline")

		ctx, cancel := context.WithCancel(context.Background())
		go func() { time.Sleep(10 * time.Millisecond); cancel() }()
		_, err = wait(ctx, time.Time{})
		require.ErrorIs(t, err, context.Canceled)

		// After a cancellation the FD still works (on a thread, the
		// next sleeper reuses the cancel eventfd the first one kicked).
		go func() { time.Sleep(10 * time.Millisecond); _ = e.Add(1) }()
		n, err := wait(context.Background(), time.Now().Add(5*time.Second))
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
	})
}

func TestCloseWakesWaiter(t *testing.T) {
	e, err := New()
	require.NoError(t, err)
	done := make(chan error)
	go func() {
		_, err := e.Wait(context.Background(), time.Time{})
		done <- err
	}()
	time.Sleep(10 * time.Millisecond)
	require.NoError(t, e.Close())
	require.True(t, errors.Is(<-done, ErrClosed))
	require.NoError(t, e.Close(), "Close is idempotent")
	require.ErrorIs(t, e.Add(1), ErrClosed)
	require.Equal(t, -1, e.Fd())
	// A wait that starts after Close: the os.File then reports poll's
	// "use of closed file", which must still come out as ErrClosed.
	for _, wait := range []func(context.Context, time.Time) (uint64, error){e.Wait, e.Await} {
		_, err = wait(context.Background(), time.Time{})
		require.ErrorIs(t, err, os.ErrClosed)
	}
}

// openFDs counts the process's open descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents)
}

// Wait sleeps a thread pinned to one CPU in the kernel (its cancel
// eventfd is left for the next one) and parks any other on the poller.
func TestWaitPicksThePath(t *testing.T) {
	cpus, err := allowedCPUs()
	require.NoError(t, err)
	e, err := New()
	require.NoError(t, err)
	defer e.Close()
	if len(cpus) > 1 {
		require.NoError(t, e.Add(1))
		_, err = e.Wait(context.Background(), time.Time{})
		require.NoError(t, err)
		require.Equal(t, -1, e.spare, "an unpinned thread slept on its own")
	}
	done := make(chan error)
	go func() {
		// Never unlocked: the pinned thread ends with the goroutine.
		runtime.LockOSThread()
		var one unix.CPUSet
		one.Set(cpus[0])
		if err := unix.SchedSetaffinity(0, &one); err != nil {
			done <- err
			return
		}
		go func() { time.Sleep(10 * time.Millisecond); _ = e.Add(1) }()
		_, err := e.Wait(context.Background(), time.Now().Add(5*time.Second))
		done <- err
	}()
	require.NoError(t, <-done)
	e.mu.Lock()
	defer e.mu.Unlock()
	require.GreaterOrEqual(t, e.spare, 0, "the pinned thread did not sleep on its own")
}

func allowedCPUs() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, err
	}
	var cpus []int
	for i := 0; i < 1024; i++ {
		if set.IsSet(i) {
			cpus = append(cpus, i)
		}
	}
	return cpus, nil
}

// Several sleepers all wake on an event; one takes it and the others sleep
// on until the next.
func TestWaitThreadSleepers(t *testing.T) {
	e, err := New()
	require.NoError(t, err)
	defer e.Close()
	const sleepers = 3
	got := make(chan uint64, sleepers)
	for range sleepers {
		go func() {
			n, err := e.waitThread(context.Background(), time.Now().Add(10*time.Second), true)
			if err != nil {
				n = 0
			}
			got <- n
		}()
	}
	for i := range sleepers {
		time.Sleep(5 * time.Millisecond)
		require.NoError(t, e.Add(1))
		require.EqualValues(t, 1, <-got, "event %d", i)
	}
}

// Close wakes every sleeper, waits for them, and leaves no descriptor open.
func TestWaitThreadClose(t *testing.T) {
	before := openFDs(t)
	e, err := New()
	require.NoError(t, err)
	const sleepers = 3
	done := make(chan error, sleepers+1)
	for range sleepers {
		go func() {
			_, err := e.waitThread(context.Background(), time.Time{}, true)
			done <- err
		}()
	}
	go func() {
		_, err := e.Wait(context.Background(), time.Time{})
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, e.Close())
	for range sleepers + 1 {
		require.ErrorIs(t, <-done, ErrClosed)
	}
	require.Equal(t, -1, e.Fd())
	require.ErrorIs(t, e.Add(1), ErrClosed)
	_, err = e.Take()
	require.ErrorIs(t, err, ErrClosed)
	_, err = e.waitThread(context.Background(), time.Time{}, true)
	require.ErrorIs(t, err, ErrClosed)
	require.Equal(t, before, openFDs(t), "descriptors left open")
}

// Close racing Adds, Takes and sleepers: every call returns nil or
// ErrClosed, none reaches a closed descriptor (EBADF), and no descriptor
// is left open.
func TestCloseRace(t *testing.T) {
	before := openFDs(t)
	var bad atomic.Value
	check := func(err error) {
		if err != nil && !errors.Is(err, ErrClosed) {
			bad.Store(err)
		}
	}
	for range 50 {
		e, err := New()
		require.NoError(t, err)
		var wg sync.WaitGroup
		for range 3 {
			wg.Add(3)
			go func() {
				defer wg.Done()
				for e.Add(1) == nil {
				}
				check(e.Add(1))
			}()
			go func() {
				defer wg.Done()
				for {
					if _, err := e.Take(); err != nil {
						check(err)
						return
					}
				}
			}()
			go func() {
				defer wg.Done()
				for {
					if _, err := e.waitThread(context.Background(), time.Now().Add(time.Second), true); err != nil {
						check(err)
						return
					}
				}
			}()
		}
		time.Sleep(100 * time.Microsecond)
		require.NoError(t, e.Close())
		wg.Wait()
		if err, _ := bad.Load().(error); err != nil {
			t.Fatalf("a call racing Close: %v", err)
		}
	}
	require.Equal(t, before, openFDs(t), "descriptors left open")
}

// Await on a pinned thread wakes on the event and leaves the count for the
// caller's Take; elsewhere it takes the count, as Wait does.
func TestAwait(t *testing.T) {
	cpus, err := allowedCPUs()
	require.NoError(t, err)
	for _, pinned := range []bool{false, true} {
		if !pinned && len(cpus) < 2 {
			continue // every thread is on one CPU: no poller path
		}
		t.Run(fmt.Sprintf("pinned=%v", pinned), func(t *testing.T) {
			e, err := New()
			require.NoError(t, err)
			defer e.Close()
			type result struct {
				n, left uint64
				err     error
			}
			done := make(chan result)
			go func() {
				if pinned {
					runtime.LockOSThread() // never unlocked: the pinned thread ends with the goroutine
					var one unix.CPUSet
					one.Set(cpus[0])
					if err := unix.SchedSetaffinity(0, &one); err != nil {
						done <- result{err: err}
						return
					}
				}
				go func() { time.Sleep(10 * time.Millisecond); _ = e.Add(3) }()
				n, err := e.Await(context.Background(), time.Now().Add(5*time.Second))
				left, _ := e.TakeLeft()
				done <- result{n, left, err}
			}()
			r := <-done
			require.NoError(t, r.err)
			require.NoError(t, e.Add(1))
			n, err := e.TakeLeft()
			require.NoError(t, err)
			require.Zero(t, n, "TakeLeft takes only what an Await left")
			n, err = e.Take()
			require.NoError(t, err)
			require.EqualValues(t, 1, n)
			if pinned {
				require.Zero(t, r.n, "the count is left")
				require.EqualValues(t, 3, r.left, "for the caller's Take")
			} else {
				require.EqualValues(t, 3, r.n, "the poller path takes the count")
				require.Zero(t, r.left)
			}
			_, err = e.Await(context.Background(), time.Now().Add(10*time.Millisecond))
			require.ErrorIs(t, err, ErrTimeout)
			require.ErrorIs(t, err, os.ErrDeadlineExceeded)
			_, err = e.Await(nil, time.Time{}) //nolint:staticcheck // the nil context is the test
			require.ErrorIs(t, err, os.ErrInvalid)
		})
	}
}

// TestZeroFD: an FD that New did not make (a struct field never set) owns
// no descriptor. Its methods fail with os.ErrInvalid and its Close does
// nothing; none of them touches fd 0, which belongs to someone else.
func TestZeroFD(t *testing.T) {
	saved, err := unix.Dup(0)
	require.NoError(t, err)
	defer func() {
		require.NoError(t, unix.Dup2(saved, 0))
		unix.Close(saved)
	}()
	// fd 0 becomes the write end of a pipe this test reads: a write to it
	// shows up there, a close of it makes fcntl fail.
	var p [2]int
	require.NoError(t, unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK))
	defer unix.Close(p[0])
	require.NoError(t, unix.Dup2(p[1], 0))
	unix.Close(p[1])

	var e FD
	require.Equal(t, -1, e.Fd())
	require.ErrorIs(t, e.Add(1), os.ErrInvalid)
	_, err = e.Take()
	require.ErrorIs(t, err, os.ErrInvalid)
	deadline := time.Now().Add(50 * time.Millisecond)
	_, err = e.Wait(context.Background(), deadline)
	require.ErrorIs(t, err, os.ErrInvalid)
	_, err = e.Await(context.Background(), deadline)
	require.ErrorIs(t, err, os.ErrInvalid)
	_, err = e.waitPoller(context.Background(), deadline, nil)
	require.ErrorIs(t, err, os.ErrInvalid)
	_, err = e.waitThread(context.Background(), deadline, true)
	require.ErrorIs(t, err, os.ErrInvalid)
	require.NoError(t, e.Close())
	require.NoError(t, e.Close())
	require.ErrorIs(t, e.Add(1), os.ErrInvalid, "still not an FD after Close")

	_, err = unix.FcntlInt(0, unix.F_GETFD, 0)
	require.NoError(t, err, "fd 0 was closed")
	var b [8]byte
	_, err = unix.Read(p[0], b[:])
	require.ErrorIs(t, err, unix.EAGAIN, "something was written to fd 0")
}

// TestSignalOnClose: Close signals each registered eventfd once, after
// the descriptor is gone; a cancelled registration is not signalled, an
// FD closed already signals at once, and one New did not make never.
func TestSignalOnClose(t *testing.T) {
	e, err := New()
	require.NoError(t, err)
	s, err := New()
	require.NoError(t, err)
	defer s.Close()
	other, err := New()
	require.NoError(t, err)
	defer other.Close()
	e.SignalOnClose(s)
	e.SignalOnClose(other)()
	n, err := s.Take()
	require.NoError(t, err)
	require.Zero(t, n, "nothing before Close")
	require.NoError(t, e.Close())
	n, err = s.Take()
	require.NoError(t, err)
	require.Equal(t, uint64(1), n, "signalled by Close")
	require.Equal(t, -1, e.Fd(), "after the descriptor closed")
	n, err = other.Take()
	require.NoError(t, err)
	require.Zero(t, n, "cancelled")
	require.NoError(t, e.Close())
	n, _ = s.Take()
	require.Zero(t, n, "a second Close signals nothing")

	e.SignalOnClose(s)
	n, _ = s.Take()
	require.Equal(t, uint64(1), n, "closed already: at once")
	var zero FD
	zero.SignalOnClose(s)()
	n, _ = s.Take()
	require.Zero(t, n, "an FD New did not make never closes")
}
