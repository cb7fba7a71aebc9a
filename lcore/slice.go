package lcore

import (
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// WakeSlice is the scheduler slice a pinned sleeping core asks Linux for
// (Config.KeepSlice): the shortest that sched_setattr accepts for an
// ordinary thread (it clamps sched_runtime to 0.1-100 ms).
const WakeSlice = 100 * time.Microsecond

// slice is a thread's scheduling attributes from before shortenSlice.
type slice struct {
	old unix.SchedAttr
	set bool // the slice was changed: restore old
}

// shortenSlice asks for WakeSlice on the calling thread (locked by the
// caller), if it is an ordinary (SCHED_OTHER) thread.
//
// Why: since Linux 6.6 (EEVDF) a task woken on a CPU preempts the running
// one only when its virtual deadline is earlier; a task that has just run,
// such as an adaptive core that polled for its idle interval, has a later
// one, and its wake-up waits until the running task sleeps or its slice
// ends (up to a few milliseconds). Since 6.12 a shorter requested slice
// lets the woken task preempt (PREEMPT_SHORT). In bench/wakeup, with the
// writer on the core's CPU, an adaptive core preempted it in 4% of
// wake-ups and took 18-25 us (C: 5-7 us); with the short slice, in 79%,
// and took 4-5 us. Older kernels ignore the request. Real-time,
// batch and idle threads keep their policy's behaviour: nothing is
// changed.
func shortenSlice() (slice, error) {
	a, err := unix.SchedGetAttr(0, 0)
	if err != nil {
		return slice{}, fmt.Errorf("lcore: sched_getattr: %w", err)
	}
	if a.Policy != unix.SCHED_NORMAL {
		return slice{}, nil
	}
	s := slice{old: *a}
	s.old.Flags &= unix.SCHED_FLAG_RESET_ON_FORK // the only flag getattr reports that setattr keeps as is
	short := s.old
	short.Runtime = uint64(WakeSlice)
	if err := unix.SchedSetAttr(0, &short, 0); err != nil {
		return slice{}, fmt.Errorf("lcore: sched_setattr (slice %v): %w", WakeSlice, err)
	}
	s.set = true
	return s, nil
}

// restore gives the calling thread the slice it had before shortenSlice.
// A thread that had the default slice gets it back as a request of the
// same length (sched_getattr does not tell the two apart).
func (s slice) restore() error {
	if !s.set {
		return nil
	}
	if err := unix.SchedSetAttr(0, &s.old, 0); err != nil {
		return fmt.Errorf("lcore: restore the scheduler slice: %w", err)
	}
	return nil
}
