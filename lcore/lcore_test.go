package lcore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/eventfd"
	"github.com/vfnic/vfnic/lcore/lcoretest"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/tests/leakcheck"
	"golang.org/x/sys/unix"
)

// lastCPU is the highest CPU the process may use: pinning there leaves CPU
// 0, where most of the machine's work lands, alone.
func lastCPU(t testing.TB) int {
	t.Helper()
	cpus, err := AllowedCPUs()
	require.NoError(t, err)
	require.NotEmpty(t, cpus)
	return cpus[len(cpus)-1]
}

func newQueue(t testing.TB, index int) *lcoretest.Queue {
	t.Helper()
	q, err := lcoretest.New(index, 256)
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	return q
}

// counter is a Handler that counts completions and reposts their buffers.
type counter struct{ n atomic.Int64 }

func (c *counter) handle(q nic.Queue, batch []nic.Completion) error {
	rx := q.(nic.RxQueue)
	for i := range batch {
		if err := rx.Repost(batch[i].Buf, nil); err != nil {
			return err
		}
	}
	c.n.Add(int64(len(batch)))
	return nil
}

// waitFor polls cond until it holds or d passes.
func waitFor(d time.Duration, cond func() bool) bool {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if cond() {
			return true
		}
		time.Sleep(200 * time.Microsecond)
	}
	return cond()
}

func threadAffinity(t *testing.T, tid int) []int {
	t.Helper()
	var set unix.CPUSet
	require.NoError(t, unix.SchedGetaffinity(tid, &set))
	return cpusIn(set)
}

func cpusIn(set unix.CPUSet) []int {
	var cpus []int
	for i := 0; i < maxCPU; i++ {
		if set.IsSet(i) {
			cpus = append(cpus, i)
		}
	}
	return cpus
}

func TestPinnedThreadReadsBackAndEndsWithTheCore(t *testing.T) {
	cpu := lastCPU(t)
	c, err := New(Config{CPU: cpu, Mode: Adaptive})
	require.NoError(t, err)
	require.NoError(t, c.AddQueue(newQueue(t, 0), nil))
	require.NoError(t, c.Start(context.Background()))
	tid := c.ThreadID()
	require.NotZero(t, tid)
	require.NotEqual(t, unix.Gettid(), tid)
	require.Equal(t, []int{cpu}, threadAffinity(t, tid), "the core's thread is pinned to the CPU named")
	// The rest of the program is not pinned.
	all, err := AllowedCPUs()
	require.NoError(t, err)
	runtime.LockOSThread()
	require.Equal(t, all, threadAffinity(t, unix.Gettid()))
	runtime.UnlockOSThread()

	require.NoError(t, c.Close())
	require.Zero(t, c.ThreadID())
	if tid == unix.Getpid() {
		// Go parks the main thread rather than end it: it must not stay
		// pinned, since its affinity is the process's.
		require.Equal(t, all, threadAffinity(t, tid))
		return
	}
	gone := waitFor(5*time.Second, func() bool {
		_, err := os.Stat(fmt.Sprintf("/proc/self/task/%d", tid))
		return errors.Is(err, os.ErrNotExist)
	})
	require.True(t, gone, "the pinned thread %d ends with the core", tid)
}

func TestRunRestoresTheCallersAffinity(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	tid := unix.Gettid()
	before := threadAffinity(t, tid)
	c, err := New(Config{CPU: lastCPU(t), Mode: Busy})
	require.NoError(t, err)
	require.NoError(t, c.AddQueue(newQueue(t, 0), nil))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	require.NoError(t, c.Run(ctx))
	require.Equal(t, before, threadAffinity(t, tid))
	require.NoError(t, c.Close())
	require.Greater(t, c.Stats().Polls, uint64(0))
}

// A Handler that panics inside Run: the panic reaches Run's caller, the
// caller's thread is unpinned, and the core is stopped (Wait and Close
// return at once, with the panic as its error).
func TestPanicInRunReachesTheCallerAndStopsTheCore(t *testing.T) {
	all, err := AllowedCPUs()
	require.NoError(t, err)
	for _, mode := range []Mode{Busy, Adaptive, Interrupt} {
		c, err := New(Config{CPU: lastCPU(t), Mode: mode})
		require.NoError(t, err)
		q := newQueue(t, 0)
		require.NoError(t, c.AddQueue(q, func(nic.Queue, []nic.Completion) error { panic("handler bug") }))
		q.Inject(1)
		type result struct {
			tid       int
			recovered any
			affinity  unix.CPUSet
			err       error
		}
		res := make(chan result, 1)
		go func() {
			// Locked around Run, so that the thread read after it is the
			// one Run pinned.
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			r := result{tid: unix.Gettid()}
			func() {
				defer func() { r.recovered = recover() }()
				_ = c.Run(context.Background())
			}()
			r.err = unix.SchedGetaffinity(0, &r.affinity)
			res <- r
		}()
		var r result
		select {
		case r = <-res:
		case <-time.After(5 * time.Second):
			t.Fatalf("%v: Run did not return", mode)
		}
		require.Equal(t, "handler bug", r.recovered, "%v: the original panic reaches Run's caller", mode)
		require.NoError(t, r.err)
		require.Equal(t, all, cpusIn(r.affinity), "%v: the caller's thread is no longer pinned", mode)
		pinnedThreads.Lock()
		_, left := pinnedThreads.old[r.tid]
		pinnedThreads.Unlock()
		require.False(t, left, mode)
		require.Zero(t, c.ThreadID(), mode)

		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = c.Wait(ctx)
		cancel()
		require.NotErrorIs(t, err, context.DeadlineExceeded, "%v: Wait returns", mode)
		require.ErrorContains(t, err, "panicked: handler bug", mode)
		closed := make(chan error, 1)
		go func() { closed <- c.Close() }()
		select {
		case err := <-closed:
			require.ErrorContains(t, err, "panicked: handler bug", mode)
		case <-time.After(5 * time.Second):
			t.Fatalf("%v: Close hangs", mode)
		}
	}
}

// A Handler that calls runtime.Goexit (t.FailNow on the core's thread)
// ends the core's goroutine, in Run or Start: the core is stopped, and
// Wait and Close return rather than wait for ever.
func TestGoexitInAHandlerStopsTheCore(t *testing.T) {
	for _, run := range []bool{false, true} {
		for _, mode := range []Mode{Busy, Adaptive, Interrupt} {
			c, err := New(Config{CPU: lastCPU(t), Mode: mode})
			require.NoError(t, err)
			q := newQueue(t, 0)
			require.NoError(t, c.AddQueue(q, func(nic.Queue, []nic.Completion) error {
				runtime.Goexit()
				return nil
			}))
			q.Inject(1)
			if run {
				exited := make(chan struct{})
				go func() {
					defer close(exited)
					_ = c.Run(context.Background())
				}()
				select {
				case <-exited:
				case <-time.After(5 * time.Second):
					t.Fatalf("%v: Run's goroutine did not exit", mode)
				}
			} else {
				require.NoError(t, c.Start(context.Background()))
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err = c.Wait(ctx)
			cancel()
			require.NotErrorIs(t, err, context.DeadlineExceeded, "%v (Run %v): Wait returns", mode, run)
			require.ErrorContains(t, err, "runtime.Goexit", mode)
			require.ErrorContains(t, c.Close(), "runtime.Goexit", mode)
		}
	}
}

func TestBadCPUs(t *testing.T) {
	allowed, err := AllowedCPUs()
	require.NoError(t, err)
	notAllowed := allowed[len(allowed)-1] + 1 // exists or not, not in the set
	for _, cpu := range []int{-2, maxCPU, 1 << 30, notAllowed} {
		_, err := New(Config{CPU: cpu})
		require.ErrorIs(t, err, ErrCPU, "CPU %d", cpu)
		require.ErrorIs(t, err, os.ErrInvalid, "CPU %d", cpu)
	}
	_, err = New(Config{CPU: notAllowed})
	require.ErrorContains(t, err, "allowed CPUs ("+cpuList(allowed)+")")
	c, err := New(Config{CPU: AnyCPU})
	require.NoError(t, err)
	require.NoError(t, c.Close())
}

func TestConfigErrors(t *testing.T) {
	for _, cfg := range []Config{{CPU: AnyCPU, Mode: 7}, {CPU: AnyCPU, Batch: -1}, {CPU: AnyCPU, Batch: MaxBatch + 1}, {CPU: AnyCPU, IdleInterval: -1}} {
		_, err := New(cfg)
		require.ErrorIs(t, err, os.ErrInvalid, "%+v", cfg)
	}
	c, err := New(Config{CPU: AnyCPU})
	require.NoError(t, err)
	defer c.Close()
	require.Equal(t, DefaultBatch, c.Config().Batch)
	require.Equal(t, DefaultIdleInterval, c.Config().IdleInterval)
	require.ErrorIs(t, c.AddQueue(nil, nil), os.ErrInvalid)
	require.ErrorIs(t, c.AddFunc(nil), os.ErrInvalid)
	require.ErrorIs(t, c.Run(nil), os.ErrInvalid)  //nolint:staticcheck // a nil context is refused
	require.ErrorIs(t, c.Wait(nil), os.ErrInvalid) //nolint:staticcheck // a nil context is refused

	for _, s := range []string{"busy", "adaptive", "interrupt"} {
		m, err := ParseMode(s)
		require.NoError(t, err)
		require.Equal(t, s, m.String())
	}
	_, err = ParseMode("napi")
	require.ErrorIs(t, err, os.ErrInvalid)
}

func TestWaitOnACoreNeverStartedIsErrNotStarted(t *testing.T) {
	c, err := New(Config{CPU: AnyCPU})
	require.NoError(t, err)
	require.ErrorIs(t, c.Wait(context.Background()), ErrNotStarted)
	require.NoError(t, c.Close())
	require.ErrorIs(t, c.Wait(context.Background()), ErrNotStarted, "closed, still never started")
}

// Wake reports a closed core as os.ErrClosed, and passes any other failure
// of the eventfd through: a full counter (EAGAIN) is not a closed core.
func TestWakeErrClosedOnlyWhenClosed(t *testing.T) {
	c, err := New(Config{CPU: AnyCPU})
	require.NoError(t, err)
	require.NoError(t, c.Wake())
	require.NoError(t, c.wake.Add(0xfffffffffffffffe-1)) // the most an eventfd holds
	err = c.Wake()
	require.ErrorIs(t, err, unix.EAGAIN)
	require.NotErrorIs(t, err, os.ErrClosed)
	require.NoError(t, c.Close())
	require.ErrorIs(t, c.Wake(), os.ErrClosed)
}

func TestQueueWithoutInterruptOnlyInBusyMode(t *testing.T) {
	q := noIRQ{newQueue(t, 3)}
	c, err := New(Config{CPU: AnyCPU, Mode: Adaptive})
	require.NoError(t, err)
	defer c.Close()
	require.ErrorIs(t, c.AddQueue(q, nil), nic.ErrNotSupported)
	b, err := New(Config{CPU: AnyCPU, Mode: Busy})
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.AddQueue(q, nil))
}

// noIRQ is a queue without an interrupt vector.
type noIRQ struct{ *lcoretest.Queue }

func (noIRQ) Interrupt() *eventfd.FD { return nil }

func TestLifecycleErrors(t *testing.T) {
	before, err := leakcheck.Snapshot()
	require.NoError(t, err)
	c, err := New(Config{CPU: AnyCPU, Mode: Interrupt})
	require.NoError(t, err)
	q := newQueue(t, 0)
	require.NoError(t, c.AddQueue(q, nil))
	require.NoError(t, c.Start(context.Background()))
	require.ErrorIs(t, c.Start(context.Background()), ErrStarted)
	require.ErrorIs(t, c.Run(context.Background()), ErrStarted)
	require.ErrorIs(t, c.AddQueue(q, nil), ErrStarted)
	require.ErrorIs(t, c.AddFunc(func() (int, error) { return 0, nil }), ErrStarted)
	require.NoError(t, c.Wake())
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	require.ErrorIs(t, c.Wait(ctx), context.DeadlineExceeded, "the core runs on")
	require.NoError(t, c.Close())
	require.NoError(t, c.Close(), "twice")
	require.ErrorIs(t, c.Wake(), os.ErrClosed)
	require.ErrorIs(t, c.Start(context.Background()), os.ErrClosed)
	require.NoError(t, q.Close())
	after, err := leakcheck.Snapshot()
	require.NoError(t, err)
	require.Equal(t, before, after, "Close gives back the epoll and wake fds")
}

// Close from a Handler or Func, on the core's own thread, stops the core
// rather than wait for the loop it runs in; Wait there says it cannot
// wait. The core's fds are released when the loop ends.
func TestCloseFromInsideTheCoreStopsIt(t *testing.T) {
	for _, run := range []bool{false, true} {
		for _, mode := range []Mode{Busy, Adaptive, Interrupt} {
			before, err := leakcheck.Snapshot()
			require.NoError(t, err)
			c, err := New(Config{CPU: lastCPU(t), Mode: mode})
			require.NoError(t, err)
			q := newQueue(t, 0)
			inside := make(chan [2]error, 1)
			closeInside := func() {
				select {
				case inside <- [2]error{c.Close(), c.Wait(context.Background())}:
				default: // called again before the loop saw the stop
				}
			}
			if run {
				// From a Func: Run's round calls it at once.
				require.NoError(t, c.AddQueue(q, nil))
				require.NoError(t, c.AddFunc(func() (int, error) { closeInside(); return 0, nil }))
			} else {
				require.NoError(t, c.AddQueue(q, func(nic.Queue, []nic.Completion) error { closeInside(); return nil }))
			}
			ran := make(chan error, 1)
			if run {
				go func() { ran <- c.Run(context.Background()) }()
			} else {
				require.NoError(t, c.Start(context.Background()))
				q.Inject(1)
			}
			var errs [2]error
			select {
			case errs = <-inside:
			case <-time.After(5 * time.Second):
				t.Fatalf("%v (Run %v): the Handler or Func did not return", mode, run)
			}
			require.NoError(t, errs[0], "%v (Run %v): Close inside", mode, run)
			require.ErrorIs(t, errs[1], ErrSelfWait, "%v (Run %v): Wait inside", mode, run)
			if run {
				select {
				case err := <-ran:
					require.NoError(t, err, mode)
				case <-time.After(5 * time.Second):
					t.Fatalf("%v: Run did not return", mode)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			require.NoError(t, c.Wait(ctx), "%v (Run %v)", mode, run)
			cancel()
			require.NoError(t, c.Close(), "%v (Run %v): again, outside", mode, run)
			require.ErrorIs(t, c.Wake(), os.ErrClosed)
			require.NoError(t, q.Close())
			after, err := leakcheck.Snapshot()
			require.NoError(t, err)
			require.Equal(t, before, after, "%v (Run %v): the core's fds are released", mode, run)
		}
	}
}

func TestHandlerErrorStopsTheCore(t *testing.T) {
	boom := errors.New("boom")
	for _, mode := range []Mode{Busy, Adaptive, Interrupt} {
		c, err := New(Config{CPU: AnyCPU, Mode: mode})
		require.NoError(t, err)
		q := newQueue(t, 0)
		require.NoError(t, c.AddQueue(q, func(nic.Queue, []nic.Completion) error { return boom }))
		require.NoError(t, c.Start(context.Background()))
		q.Inject(1)
		require.ErrorIs(t, c.Wait(context.Background()), boom, mode)
		require.ErrorIs(t, c.Close(), boom, mode)
	}
}

func TestClosedQueueStopsASleepingCore(t *testing.T) {
	c, err := New(Config{CPU: AnyCPU, Mode: Interrupt})
	require.NoError(t, err)
	q := newQueue(t, 0)
	require.NoError(t, c.AddQueue(q, nil))
	require.NoError(t, c.Start(context.Background()))
	require.True(t, waitFor(5*time.Second, func() bool { return c.Stats().Sleeps > 0 }))
	require.NoError(t, q.Close())
	require.NoError(t, c.Wake())
	require.ErrorIs(t, c.Wait(context.Background()), os.ErrClosed)
	require.ErrorIs(t, c.Close(), os.ErrClosed, "Close reports the loop's error too")
}

func TestContextStopsEveryMode(t *testing.T) {
	for _, mode := range []Mode{Busy, Adaptive, Interrupt} {
		c, err := New(Config{CPU: lastCPU(t), Mode: mode})
		require.NoError(t, err)
		require.NoError(t, c.AddQueue(newQueue(t, 0), nil))
		ctx, cancel := context.WithCancel(context.Background())
		require.NoError(t, c.Start(ctx))
		time.Sleep(5 * time.Millisecond)
		cancel()
		require.NoError(t, c.Wait(context.Background()), mode)
		require.NoError(t, c.Close())
	}
}

// TestModes checks what each mode does with idle queues and with traffic:
// Busy never sleeps; Adaptive and Interrupt sleep when idle, and every
// injected completion reaches the handler through the wake-up.
func TestModes(t *testing.T) {
	for _, mode := range []Mode{Busy, Adaptive, Interrupt} {
		t.Run(mode.String(), func(t *testing.T) {
			c, err := New(Config{CPU: lastCPU(t), Mode: mode, IdleInterval: 200 * time.Microsecond})
			require.NoError(t, err)
			rx, tx := newQueue(t, 0), newQueue(t, 1)
			var got, sent counter
			require.NoError(t, c.AddQueue(rx, got.handle))
			require.NoError(t, c.AddQueue(tx, func(_ nic.Queue, b []nic.Completion) error {
				sent.n.Add(int64(len(b)))
				return nil
			}))
			require.NoError(t, c.Start(context.Background()))
			defer c.Close()

			time.Sleep(20 * time.Millisecond) // idle
			st := c.Stats()
			if mode == Busy {
				require.Zero(t, st.Sleeps)
			} else {
				require.True(t, waitFor(5*time.Second, func() bool { return c.Stats().Sleeps > 0 }), "an idle %v core sleeps", mode)
			}
			const bursts = 50
			for i := 1; i <= bursts; i++ {
				rx.Inject(3)
				tx.Inject(1)
				require.True(t, waitFor(5*time.Second, func() bool { return got.n.Load() == int64(3*i) && sent.n.Load() == int64(i) }),
					"burst %d: received %d of %d, sent %d of %d", i, got.n.Load(), 3*i, sent.n.Load(), i)
				time.Sleep(time.Duration(rand.IntN(500)) * time.Microsecond)
			}
			require.Equal(t, uint64(3*bursts), rx.Counters().Posts, "every buffer reposted")
			require.GreaterOrEqual(t, rx.Counters().Flushes, uint64(1))
			require.NoError(t, c.Close())
			st = c.Stats()
			require.Equal(t, uint64(4*bursts), st.Completions)
			require.Greater(t, st.EmptyPolls, uint64(0))
			if mode == Busy {
				require.Zero(t, st.Sleeps)
				require.Zero(t, rx.Counters().Arms, "a busy core never arms")
			} else {
				require.Greater(t, st.Sleeps, uint64(0))
				require.Greater(t, st.Wakeups, uint64(0))
				require.Greater(t, rx.Counters().Fired, uint64(0), "woken by interrupts")
			}
			t.Logf("%v: %+v, rx %+v", mode, st, rx.Counters())
		})
	}
}

// TestNoLostWakeup hammers the window between the last empty poll and the
// arm: on about half the arms a completion lands just before the arm takes
// effect (the queue then raises no interrupt, like hardware), and the
// others land at random times around the core's sleep. A lost wake-up
// leaves a completion unread while the core sleeps forever.
func TestNoLostWakeup(t *testing.T) {
	rounds := 1500
	if testing.Short() {
		rounds = 500
	}
	for _, mode := range []Mode{Interrupt, Adaptive} {
		t.Run(mode.String(), func(t *testing.T) {
			c, err := New(Config{CPU: AnyCPU, Mode: mode, IdleInterval: time.Microsecond})
			require.NoError(t, err)
			q := newQueue(t, 0)
			var injected atomic.Int64
			var hammer atomic.Bool
			hammer.Store(true)
			q.BeforeArm = func() {
				if hammer.Load() && rand.IntN(2) == 0 {
					injected.Add(1)
					q.Inject(1) // before the arm: no interrupt
				}
			}
			var got counter
			require.NoError(t, c.AddQueue(q, got.handle))
			require.NoError(t, c.Start(context.Background()))
			defer c.Close()
			for i := 0; i < rounds; i++ {
				if d := rand.IntN(40); d > 0 {
					time.Sleep(time.Duration(d) * time.Microsecond)
				}
				injected.Add(1)
				q.Inject(1)
				ok := waitFor(5*time.Second, func() bool { return got.n.Load() == injected.Load() })
				require.True(t, ok, "round %d: %d completions injected, %d read: a wake-up was lost", i, injected.Load(), got.n.Load())
			}
			hammer.Store(false)
			require.True(t, waitFor(5*time.Second, func() bool { return got.n.Load() == injected.Load() }))
			require.NoError(t, c.Close())
			st := c.Stats()
			t.Logf("%v: %d completions, %+v, queue %+v", mode, injected.Load(), st, q.Counters())
			require.Greater(t, st.Sleeps, uint64(rounds/10), "the core slept between rounds")
		})
	}
}

// TestIdleAdaptiveCoreCostsLittleCPU measures the CPU time of an idle
// Adaptive core over a second, from its thread's own counters and from
// the process's (getrusage), with a generous bound: a machine shared with
// other builds makes tight timing assertions lie.
func TestIdleAdaptiveCoreCostsLittleCPU(t *testing.T) {
	if testing.Short() {
		t.Skip("takes a second")
	}
	c, err := New(Config{CPU: lastCPU(t), Mode: Adaptive})
	require.NoError(t, err)
	q := newQueue(t, 0)
	var got counter
	require.NoError(t, c.AddQueue(q, got.handle))
	require.NoError(t, c.Start(context.Background()))
	defer c.Close()
	q.Inject(1) // some traffic first, then idleness
	require.True(t, waitFor(5*time.Second, func() bool { return got.n.Load() == 1 && c.Stats().Sleeps > 0 }))

	tid := c.ThreadID()
	var ru0, ru1 unix.Rusage
	require.NoError(t, unix.Getrusage(unix.RUSAGE_SELF, &ru0))
	th0 := threadCPU(t, tid)
	t0 := time.Now()
	time.Sleep(time.Second)
	wall := time.Since(t0)
	th1 := threadCPU(t, tid)
	require.NoError(t, unix.Getrusage(unix.RUSAGE_SELF, &ru1))
	proc := rusageCPU(ru1) - rusageCPU(ru0)
	thread := th1 - th0
	t.Logf("idle for %v: core thread %v CPU (%.2f%%), whole process %v (%.2f%%); %+v",
		wall, thread, 100*thread.Seconds()/wall.Seconds(), proc, 100*proc.Seconds()/wall.Seconds(), c.Stats())
	require.Less(t, thread.Seconds()/wall.Seconds(), 0.20)
	require.Less(t, proc.Seconds()/wall.Seconds(), 0.20)

	q.Inject(5) // and it still wakes up
	require.True(t, waitFor(5*time.Second, func() bool { return got.n.Load() == 6 }))
}

func rusageCPU(r unix.Rusage) time.Duration {
	return time.Duration(r.Utime.Nano() + r.Stime.Nano())
}

// threadCPU reads a thread's user+system time from /proc (clock ticks).
func threadCPU(t *testing.T, tid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/stat", tid))
	require.NoError(t, err)
	// Fields after the command name (which may hold spaces): state, then
	// 10 more, then utime and stime (fields 14 and 15 of proc(5)).
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	require.Greater(t, len(f), 12)
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	require.NoError(t, errors.Join(err1, err2))
	const hz = 100 // USER_HZ on Linux
	return time.Duration(ut+st) * time.Second / hz
}

// TestRoundDoesNotAllocate checks the hot path: a round that reads a batch
// from each queue, reposts every buffer, calls a Func and flushes.
func TestRoundDoesNotAllocate(t *testing.T) {
	c, err := New(Config{CPU: AnyCPU, Mode: Busy})
	require.NoError(t, err)
	defer c.Close()
	rx, tx := newQueue(t, 0), newQueue(t, 1)
	var got counter
	require.NoError(t, c.AddQueue(rx, got.handle))
	require.NoError(t, c.AddQueue(tx, nil))
	frame := make([]byte, 64)
	require.NoError(t, c.AddFunc(func() (int, error) { return 1, tx.Send(frame, nil) }))
	allocs := testing.AllocsPerRun(1000, func() {
		rx.Inject(DefaultBatch)
		tx.Inject(4)
		if _, err := c.round(); err != nil {
			panic(err)
		}
	})
	if !raceEnabled { // the race detector allocates by itself
		require.Zero(t, allocs, "allocations per round")
	}
	require.Equal(t, int64(1001*DefaultBatch), got.n.Load())

	empty := testing.AllocsPerRun(1000, func() { _, _ = c.round() })
	if !raceEnabled {
		require.Zero(t, empty, "allocations per empty round")
	}
}

// TestSleepCycleDoesNotAllocate: arm, poll again, epoll_wait, wake.
func TestSleepCycleDoesNotAllocate(t *testing.T) {
	c, err := New(Config{CPU: AnyCPU, Mode: Interrupt})
	require.NoError(t, err)
	defer c.Close()
	q := newQueue(t, 0)
	require.NoError(t, c.AddQueue(q, nil))
	ep, err := newEpoller(c.wake, c.queues)
	require.NoError(t, err)
	defer ep.close()
	allocs := testing.AllocsPerRun(200, func() {
		if err := c.wake.Add(1); err != nil { // a Wake, so that the wait returns
			panic(err)
		}
		if err := c.sleep(ep); err != nil {
			panic(err)
		}
	})
	if !raceEnabled {
		require.Zero(t, allocs)
	}
	require.Equal(t, c.st.Sleeps, c.st.Wakeups)
}

// sharedIRQ is a queue that shares another queue's interrupt vector, as
// a receive and a transmit queue do on a device with few MSI-X vectors.
type sharedIRQ struct {
	*lcoretest.Queue
	irq *eventfd.FD
}

func (q sharedIRQ) Interrupt() *eventfd.FD { return q.irq }

func TestQueuesSharingAnInterrupt(t *testing.T) {
	c, err := New(Config{CPU: AnyCPU, Mode: Interrupt})
	require.NoError(t, err)
	defer c.Close()
	a, b := newQueue(t, 0), newQueue(t, 1)
	var got counter
	require.NoError(t, c.AddQueue(a, got.handle))
	require.NoError(t, c.AddQueue(sharedIRQ{b, a.Interrupt()}, got.handle))
	require.NoError(t, c.Start(context.Background()))
	require.True(t, waitFor(5*time.Second, func() bool { return c.Stats().Sleeps > 0 }))
	// b raises its interrupt on its own eventfd, which nobody polls: the
	// vector's eventfd (a's) is what the device writes for both.
	b.Inject(2)
	require.NoError(t, a.Interrupt().Add(1))
	require.True(t, waitFor(5*time.Second, func() bool { return got.n.Load() == 2 }))
}

// BenchmarkRound is the cost of one round of a busy core over a receive
// queue holding a full batch (read, repost each buffer, flush) and a
// transmit queue with nothing to read.
func BenchmarkRound(b *testing.B) {
	c, err := New(Config{CPU: AnyCPU, Mode: Busy})
	require.NoError(b, err)
	defer c.Close()
	rx, tx := newQueue(b, 0), newQueue(b, 1)
	var got counter
	require.NoError(b, c.AddQueue(rx, got.handle))
	require.NoError(b, c.AddQueue(tx, nil))
	b.ReportAllocs()
	for b.Loop() {
		rx.Inject(DefaultBatch)
		if _, err := c.round(); err != nil {
			b.Fatal(err)
		}
	}
}

// steerable is a software queue whose interrupt can be steered, recording
// the CPUs it was steered to; with fail, steering fails.
type steerable struct {
	*lcoretest.Queue
	fail bool
	cpus []int
}

func (q *steerable) SteerInterrupt(cpu int) error {
	if q.fail {
		return fmt.Errorf("%w: refused", os.ErrPermission)
	}
	q.cpus = append(q.cpus, cpu)
	return nil
}

// TestSteersInterruptsToItsCPU: a pinned core that sleeps on interrupts
// steers each steerable queue's interrupt to its CPU once, at start, and
// reports a failure without stopping; busy, unpinned or KeepIRQAffinity
// cores leave them alone.
func TestSteersInterruptsToItsCPU(t *testing.T) {
	cpu := lastCPU(t)
	for _, tc := range []struct {
		cfg   Config
		steer bool
	}{
		{Config{CPU: cpu, Mode: Adaptive}, true},
		{Config{CPU: cpu, Mode: Interrupt}, true},
		{Config{CPU: cpu, Mode: Busy}, false},
		{Config{CPU: AnyCPU, Mode: Interrupt}, false},
		{Config{CPU: cpu, Mode: Adaptive, KeepIRQAffinity: true}, false},
	} {
		name := fmt.Sprintf("%+v", tc.cfg)
		good := &steerable{Queue: newQueue(t, 0)}
		bad := &steerable{Queue: newQueue(t, 1), fail: true}
		plain := newQueue(t, 2) // no SteerInterrupt
		c, err := New(tc.cfg)
		require.NoError(t, err)
		for _, q := range []nic.Queue{good, bad, plain} {
			require.NoError(t, c.AddQueue(q, nil))
		}
		require.NoError(t, c.Start(context.Background()), name)
		n, err := c.Steered()
		if tc.steer {
			require.Equal(t, []int{cpu}, good.cpus, name)
			require.Equal(t, 1, n, name)
			require.ErrorIs(t, err, os.ErrPermission, name)
		} else {
			require.Empty(t, good.cpus, name)
			require.Zero(t, n, name)
			require.NoError(t, err, name)
		}
		// The core runs on, and steers nothing more.
		good.Inject(1)
		require.True(t, waitFor(5*time.Second, func() bool { return c.Stats().Completions >= 1 }), name)
		require.NoError(t, c.Close())
		require.NoError(t, c.Wait(context.Background()), name)
		require.LessOrEqual(t, len(good.cpus), 1, name)
	}
}

// sendOnly is a transmit queue whose sends stay outstanding until done is
// set: the device owes their completions.
type sendOnly struct {
	nic.TxQueue
	done atomic.Bool
}

func (q *sendOnly) Outstanding() int {
	if q.done.Load() {
		return 0
	}
	return 1
}

// An adaptive core whose transmit queue has sends outstanding keeps
// polling past its idle interval (their completions are on the way), up
// to 32 intervals; with none outstanding it sleeps after one.
func TestAdaptiveWaitsForOwedSends(t *testing.T) {
	const iv = 2 * time.Millisecond
	c, err := New(Config{CPU: AnyCPU, Mode: Adaptive, IdleInterval: iv})
	require.NoError(t, err)
	q := &sendOnly{TxQueue: newQueue(t, 0)}
	require.NoError(t, c.AddQueue(q, nil))
	start := time.Now()
	require.NoError(t, c.Start(context.Background()))
	defer func() { require.NoError(t, c.Close()) }()
	time.Sleep(5 * iv)
	if st := c.Stats(); time.Since(start) < owedWait*iv {
		require.Zero(t, st.Sleeps, "sends are owed")
	}
	require.True(t, waitFor(5*time.Second, func() bool { return c.Stats().Sleeps > 0 }), "a device that stalls longer still lets it sleep")
	q.done.Store(true)
	require.NoError(t, c.Wake())
	n := c.Stats().Sleeps
	require.True(t, waitFor(5*time.Second, func() bool { return c.Stats().Sleeps > n }), "nothing owed: it sleeps again")
}

// threadSlice is the scheduler slice of the calling thread as
// sched_getattr reports it (0 on kernels before EEVDF custom slices).
func threadSlice(t *testing.T) time.Duration {
	t.Helper()
	a, err := unix.SchedGetAttr(0, 0)
	require.NoError(t, err)
	return time.Duration(a.Runtime)
}

// TestSleepingCoreShortensSlice: a pinned core that sleeps on interrupts
// runs with WakeSlice (so that its wake-up preempts the task on its CPU)
// and Run gives the caller's thread its slice back; busy, unpinned or
// KeepSlice cores leave it alone.
func TestSleepingCoreShortensSlice(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	before := threadSlice(t)
	if before == 0 {
		t.Skip("sched_getattr reports no slice for SCHED_OTHER: a kernel before Linux 6.12, which takes no slice request")
	}
	cpu := lastCPU(t)
	for _, tc := range []struct {
		cfg   Config
		short bool
	}{
		{Config{CPU: cpu, Mode: Adaptive}, true},
		{Config{CPU: cpu, Mode: Interrupt}, true},
		{Config{CPU: cpu, Mode: Busy}, false},
		{Config{CPU: AnyCPU, Mode: Interrupt}, false},
		{Config{CPU: cpu, Mode: Adaptive, KeepSlice: true}, false},
	} {
		for _, run := range []bool{false, true} {
			name := fmt.Sprintf("%+v run=%v", tc.cfg, run)
			c, err := New(tc.cfg)
			require.NoError(t, err)
			require.NoError(t, c.AddQueue(newQueue(t, 0), nil))
			var onCore atomic.Int64 // the slice the core's thread sees
			require.NoError(t, c.AddFunc(func() (int, error) {
				a, err := unix.SchedGetAttr(0, 0)
				if err != nil {
					return 0, err
				}
				onCore.Store(int64(a.Runtime))
				return 0, nil
			}))
			done := make(chan error, 1)
			if run {
				// On this locked thread: Run must give it back as it was.
				go func() { time.Sleep(50 * time.Millisecond); done <- c.Close() }()
				require.NoError(t, c.Run(context.Background()), name)
				require.NoError(t, <-done, name)
				require.Equal(t, before, threadSlice(t), name+": Run restores the slice")
			} else {
				require.NoError(t, c.Start(context.Background()), name)
				require.True(t, waitFor(5*time.Second, func() bool { return onCore.Load() != 0 }), name)
				require.NoError(t, c.Close(), name)
			}
			got, err := c.Slice()
			require.NoError(t, err, name)
			if tc.short {
				require.Equal(t, WakeSlice, got, name)
				require.Equal(t, int64(WakeSlice), onCore.Load(), name)
			} else {
				require.Zero(t, got, name)
				require.Equal(t, int64(before), onCore.Load(), name)
			}
		}
	}
}

// TestClosedQueueStopsSleepingCore: a queue closed while its core sleeps
// on its interrupt (a device closed or taken back by the kernel) wakes
// the core at once (its eventfd signals the core's wake eventfd as it
// closes, where closing alone would only take it out of the epoll set),
// which stops with an error matching os.ErrClosed. Nothing else wakes an
// idle core: it sleeps through a quiet second and a half, then wakes
// once, for the close.
func TestClosedQueueStopsSleepingCore(t *testing.T) {
	for _, mode := range []Mode{Adaptive, Interrupt} {
		t.Run(mode.String(), func(t *testing.T) {
			q := newQueue(t, 0)
			c, err := New(Config{CPU: AnyCPU, Mode: mode})
			require.NoError(t, err)
			var h counter
			require.NoError(t, c.AddQueue(q, h.handle))
			require.NoError(t, c.Start(context.Background()))
			require.True(t, waitFor(5*time.Second, func() bool { return c.Stats().Sleeps > 0 }), "the core sleeps")
			asleep := c.Stats()
			time.Sleep(1500 * time.Millisecond)
			require.Equal(t, asleep, c.Stats(), "an idle core stays asleep (no periodic look)")
			start := time.Now()
			require.NoError(t, q.Close())
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err = c.Wait(ctx)
			require.ErrorIs(t, err, os.ErrClosed, "the core stopped on the closed queue")
			t.Logf("stopped %v after the queue closed: %v", time.Since(start).Round(time.Microsecond), err)
			require.NoError(t, ctx.Err())
			// Stats publishes Wakeups at the next sleep or the end: the last
			// sleep was woken, by the close, and none followed.
			end := c.Stats()
			require.Equal(t, asleep.Sleeps, end.Sleeps, "no sleep after the close")
			require.Equal(t, end.Sleeps, end.Wakeups, "the last sleep woken")
			_ = c.Close()
		})
	}
}
