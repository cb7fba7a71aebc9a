package nic_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vfnic/vfnic/lcore/lcoretest"
	"github.com/vfnic/vfnic/nic"
)

// TestSReadPinnedLosesNoWakeup: SRead on a thread pinned to one CPU, where
// WaitInterrupt leaves the eventfd's count for the next Arm to take. The
// device (lcoretest: an interrupt only when armed, once per arm) writes at
// every point of the read: while the reader polls, inside Arm (BeforeArm:
// an entry written before the arm raises nothing, the poll after it must
// find it), between the arm and the sleep, and while it sleeps. Every
// completion is read and no read waits for its timeout.
func TestSReadPinnedLosesNoWakeup(t *testing.T) {
	const rounds = 2000
	const timeout = 2 * time.Second // a woken read takes microseconds
	q, err := lcoretest.New(0, 256)
	require.NoError(t, err)
	defer q.Close()
	var arms atomic.Int64
	q.BeforeArm = func() {
		if arms.Add(1)%7 == 0 {
			q.Inject(1)
		}
	}
	var set unix.CPUSet
	require.NoError(t, unix.SchedGetaffinity(0, &set))
	cpu := 0
	for !set.IsSet(cpu) {
		cpu++
	}
	var got atomic.Int64
	var stop atomic.Bool
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the pinned thread ends with the goroutine
		var one unix.CPUSet
		one.Set(cpu)
		if err := unix.SchedSetaffinity(0, &one); err != nil {
			done <- err
			return
		}
		out := make([]nic.Completion, 4)
		for !stop.Load() {
			t0 := time.Now()
			n, err := q.SRead(context.Background(), out, 1, timeout)
			if err != nil {
				done <- fmt.Errorf("after %d completions: %w", got.Load(), err)
				return
			}
			// A read that ran out its time found, in its last poll, an
			// entry whose interrupt it slept through: a lost wake-up.
			if el := time.Since(t0); el >= timeout {
				done <- fmt.Errorf("after %d completions a read slept %v, its whole timeout, with an entry written", got.Load(), el)
				return
			}
			got.Add(int64(n))
		}
		done <- nil
	}()
	// One write at a time, after the reader took the last one, at a random
	// point of its next read.
	wait := func() {
		for q.Pending() > 0 {
			select {
			case err := <-done:
				require.NoError(t, err)
				require.Fail(t, "the reader stopped early")
			default:
				runtime.Gosched()
			}
		}
	}
	for range rounds {
		wait()
		if d := rand.IntN(40); d > 0 {
			time.Sleep(time.Duration(d) * time.Microsecond)
		}
		q.Inject(1)
	}
	wait()
	stop.Store(true)
	q.Inject(1) // ends the last read
	require.NoError(t, <-done)
	c := q.Counters()
	t.Logf("%d completions (%d written inside Arm), %d arms, %d interrupts", got.Load(), arms.Load()/7, c.Arms, c.Fired)
	require.EqualValues(t, rounds+1+arms.Load()/7, got.Load()+int64(q.Pending()), "every completion written was read or is pending")
	require.Positive(t, c.Fired, "some reads slept and were woken")
}
