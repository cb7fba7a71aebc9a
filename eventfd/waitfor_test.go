package eventfd

import (
	"context"
	"os"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// onGoroutine runs f on a goroutine of its own, its thread pinned to one
// CPU when pinned is set (where Wait sleeps in ppoll), and returns f's
// result channel.
func onGoroutine(t *testing.T, pinned bool, f func() error) <-chan error {
	t.Helper()
	cpus, err := allowedCPUs()
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		if pinned {
			runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
			var one unix.CPUSet
			one.Set(cpus[0])
			if err := unix.SchedSetaffinity(0, &one); err != nil {
				done <- err
				return
			}
		}
		done <- f()
	}()
	return done
}

// staleSocket returns a readiness FD over one end of a unix socket pair
// whose other end (peer) has written a byte nobody reads: readable for
// good, with nothing new; own is the end the FD stands for.
func staleSocket(t *testing.T) (e *FD, own, peer int) {
	t.Helper()
	p, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = unix.Close(p[0]); _ = unix.Close(p[1]) })
	_, err = unix.Write(p[1], []byte{1})
	require.NoError(t, err)
	e, err = Readable(p[0])
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	return e, p[0], p[1]
}

// TestWaitForStaleReadiness: on a socket that stays readable with nothing
// new (ready says false), WaitFor sleeps, on the poller and on a pinned
// thread alike, looking at most a few times (Wait would return at once);
// a condition that comes true without an event is not seen until the
// next event; the event after it returns; a deadline, a cancelled
// context and Close end the wait.
func TestWaitForStaleReadiness(t *testing.T) {
	for _, pinned := range []bool{false, true} {
		t.Run(map[bool]string{false: "poller", true: "thread"}[pinned], func(t *testing.T) {
			e, _, peer := staleSocket(t)
			var looks atomic.Int64
			var ok atomic.Bool
			ready := func() bool { looks.Add(1); return ok.Load() }

			r := onGoroutine(t, pinned, func() error { return e.WaitFor(context.Background(), time.Time{}, ready) })
			time.Sleep(200 * time.Millisecond)
			select {
			case err := <-r:
				t.Fatalf("returned on a stale readiness: %v", err)
			default:
			}
			// One look, and one more for the token the registration
			// raised for the readiness already there.
			require.LessOrEqual(t, looks.Load(), int64(3), "looks in 200ms of stale readiness")
			ok.Store(true)
			time.Sleep(50 * time.Millisecond)
			select {
			case err := <-r:
				t.Fatalf("returned with no event: %v", err)
			default:
			}
			_, err := unix.Write(peer, []byte{2})
			require.NoError(t, err)
			require.NoError(t, result(t, r, "WaitFor after new data"))
			t.Logf("%d looks", looks.Load())
			ok.Store(false)

			start := time.Now()
			err = result(t, onGoroutine(t, pinned, func() error {
				return e.WaitFor(context.Background(), start.Add(100*time.Millisecond), ready)
			}), "WaitFor with a deadline")
			require.ErrorIs(t, err, ErrTimeout)
			require.False(t, time.Now().Before(start.Add(100*time.Millisecond)), "returned before its deadline")

			ctx, cancel := context.WithCancel(context.Background())
			r = onGoroutine(t, pinned, func() error { return e.WaitFor(ctx, time.Time{}, ready) })
			time.Sleep(50 * time.Millisecond)
			cancel()
			require.ErrorIs(t, result(t, r, "WaitFor, cancelled"), context.Canceled)

			r = onGoroutine(t, pinned, func() error { return e.WaitFor(context.Background(), time.Time{}, ready) })
			time.Sleep(50 * time.Millisecond)
			require.NoError(t, e.Close())
			require.ErrorIs(t, result(t, r, "WaitFor, closed"), ErrClosed)
			require.ErrorIs(t, e.WaitFor(context.Background(), time.Time{}, ready), ErrClosed)
		})
	}
}

// TestWaitForNoLostWakeup: a producer publishes a value and then raises
// an event, while the waiter looks and sleeps, round after round, with
// the publication landing anywhere around the look (the waiter says it
// is about to wait, the producer publishes at once). A wake-up lost
// between a look and the sleep leaves the waiter asleep to its deadline
// (a failure). On a readiness FD (a socket that stays readable
// throughout: the waiter reads all but one byte) and on an eventfd, on the poller and on a pinned thread.
func TestWaitForNoLostWakeup(t *testing.T) {
	rounds := 3000
	if raceEnabled || testing.Short() {
		rounds = 500
	}
	for _, kind := range []string{"socket", "eventfd"} {
		for _, pinned := range []bool{false, true} {
			t.Run(kind+"/"+map[bool]string{false: "poller", true: "thread"}[pinned], func(t *testing.T) {
				var e *FD
				var raise func() error
				drain := func() error { return nil }
				if kind == "socket" {
					var own, peer int
					e, own, peer = staleSocket(t)
					raise = func() error { _, err := unix.Write(peer, []byte{3}); return err }
					// All but the stale byte, so that the socket's
					// buffer holds every round's byte.
					b := make([]byte, 64)
					drain = func() error {
						n, err := unix.IoctlGetInt(own, unix.SIOCINQ)
						if err == nil && n > 1 {
							_, err = unix.Read(own, b[:min(n-1, len(b))])
						}
						return err
					}
				} else {
					var err error
					e, err = New()
					require.NoError(t, err)
					defer e.Close()
					raise = func() error { return e.Add(1) }
				}
				var published atomic.Int64
				waiting := make(chan int64)
				r := onGoroutine(t, pinned, func() error {
					defer close(waiting)
					for i := int64(1); i <= int64(rounds); i++ {
						waiting <- i
						err := e.WaitFor(context.Background(), time.Now().Add(5*time.Second),
							func() bool { return published.Load() >= i })
						if err != nil {
							return err
						}
						if err := drain(); err != nil {
							return err
						}
					}
					return nil
				})
				for i := range waiting {
					if i%2 == 0 {
						runtime.Gosched() // let the waiter reach its look or its sleep
					}
					published.Store(i)
					require.NoError(t, raise())
				}
				require.NoError(t, <-r, "a wake-up was lost")
			})
		}
	}
}

// TestWaitForEventfd: on an eventfd each look after the first follows a
// wait that took the counter; an event with the condition still false
// sleeps again.
func TestWaitForEventfd(t *testing.T) {
	e, err := New()
	require.NoError(t, err)
	defer e.Close()
	var looks atomic.Int64
	var ok atomic.Bool
	ready := func() bool { looks.Add(1); return ok.Load() }
	r := onGoroutine(t, false, func() error { return e.WaitFor(context.Background(), time.Time{}, ready) })
	require.NoError(t, e.Add(1))
	time.Sleep(50 * time.Millisecond)
	select {
	case err := <-r:
		t.Fatalf("returned with the condition false: %v", err)
	default:
	}
	require.EqualValues(t, 2, looks.Load(), "a look at the start, one after the event")
	n, err := e.Take()
	require.NoError(t, err)
	require.Zero(t, n, "the look took the count")
	ok.Store(true)
	require.NoError(t, e.Add(1))
	require.NoError(t, result(t, r, "WaitFor after the condition came true"))
	require.ErrorIs(t, e.WaitFor(nil, time.Time{}, ready), os.ErrInvalid)
}

// TestWaitForNoAllocs: a wait on a readiness FD's poller allocates
// nothing once the FD has its poller file (the look is made once).
func TestWaitForNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes allocations of its own")
	}
	e, _, _ := staleSocket(t)
	yes := func() bool { return true }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	require.NoError(t, e.WaitFor(ctx, time.Time{}, yes))
	require.Zero(t, testing.AllocsPerRun(100, func() {
		if err := e.WaitFor(ctx, time.Now().Add(time.Minute), yes); err != nil {
			t.Error(err)
		}
	}))
}
