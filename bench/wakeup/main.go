// Command wakeup measures how long a sleeping reader takes to wake when a
// queue's interrupt eventfd is written, in the three ways vfnic can sleep
// (see README.md); wakeup.c is the C reference. Each sample: the writer
// pauses 50 to 150 µs (so the reader is asleep), takes the time, makes the
// software queue complete one entry and write its eventfd, and sleeps until
// the reader has stamped the time it got the completion.
//
//	sread:        nic.SRead on an ordinary goroutine: arm, poll, park on
//	              Go's runtime poller (eventfd.FD.Wait), poll
//	sread-locked: the same from a goroutine locked to a pinned thread,
//	              where eventfd.FD.Wait sleeps the thread itself in ppoll
//	lcore:        an lcore.Core in Interrupt mode: epoll_wait on its own
//	              pinned thread, then a round of polls into the Handler
//	adaptive:     an lcore.Core in Adaptive mode (default idle interval):
//	              the first completion after the core went to sleep; the
//	              writer's pause is one idle interval longer
//
// It prints one line per mode: mode= samples= median_ns= p90_ns= p99_ns=
// max_ns= (the same fields as wakeup.c).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/vfnic/vfnic/lcore"
	"github.com/vfnic/vfnic/lcore/lcoretest"
	"github.com/vfnic/vfnic/nic"
	"golang.org/x/sys/unix"
)

func main() {
	samples := flag.Int("n", 2000, "samples per mode")
	readerCPU := flag.Int("r", -1, "CPU of the reader's thread (-1: not pinned)")
	writerCPU := flag.Int("w", -1, "CPU of the writer's thread (-1: not pinned)")
	modes := flag.String("modes", "sread,sread-locked,lcore,adaptive", "modes to run, comma-separated")
	flag.Parse()
	if *samples < 1 {
		fmt.Fprintln(os.Stderr, "wakeup: -n must be positive")
		os.Exit(2)
	}
	for _, m := range strings.Split(*modes, ",") {
		lat, err := run(m, *samples, *readerCPU, *writerCPU)
		if err != nil {
			fmt.Fprintf(os.Stderr, "wakeup: %s: %v\n", m, err)
			os.Exit(1)
		}
		slices.Sort(lat)
		n := len(lat)
		fmt.Printf("mode=%s samples=%d median_ns=%d p90_ns=%d p99_ns=%d max_ns=%d\n",
			m, n, lat[n/2], lat[n*90/100], lat[n*99/100], lat[n-1])
	}
}

// since is the monotonic clock in ns since the program started.
var epoch = time.Now()

func since() int64 { return int64(time.Since(epoch)) }

func pin(cpu int) error {
	if cpu < 0 {
		return nil
	}
	var set unix.CPUSet
	set.Set(cpu)
	return unix.SchedSetaffinity(0, &set)
}

func run(mode string, samples, readerCPU, writerCPU int) ([]int64, error) {
	q, err := lcoretest.New(0, 256)
	if err != nil {
		return nil, err
	}
	defer q.Close()
	var wokeAt atomic.Int64 // the reader's stamp, 0 while it waits
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	readerDone := make(chan error, 1)
	var extraPause time.Duration // so that an adaptive core is asleep

	switch mode {
	case "sread", "sread-locked":
		ready := make(chan error, 1)
		go func() {
			if mode == "sread-locked" {
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				if err := pin(readerCPU); err != nil {
					ready <- err
					return
				}
			}
			ready <- nil
			out := make([]nic.Completion, 32)
			for {
				n, err := q.SRead(ctx, out, 1, -1)
				if n > 0 {
					wokeAt.Store(since())
				}
				if err != nil {
					readerDone <- nil
					return
				}
			}
		}()
		if err := <-ready; err != nil {
			return nil, err
		}
	case "lcore", "adaptive":
		cpu := readerCPU
		if cpu < 0 {
			cpu = lcore.AnyCPU
		}
		m := lcore.Interrupt
		if mode == "adaptive" {
			m = lcore.Adaptive
			extraPause = lcore.DefaultIdleInterval
		}
		core, err := lcore.New(lcore.Config{CPU: cpu, Mode: m})
		if err != nil {
			return nil, err
		}
		err = core.AddQueue(q, func(nic.Queue, []nic.Completion) error {
			wokeAt.Store(since())
			return nil
		})
		if err == nil {
			err = core.Start(ctx)
		}
		if err != nil {
			_ = core.Close()
			return nil, err
		}
		go func() { readerDone <- core.Wait(context.Background()) }()
		defer core.Close()
	default:
		return nil, fmt.Errorf("unknown mode %q", mode)
	}

	// The writer: a locked, pinned thread, as the device's is.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var old unix.CPUSet
	if writerCPU >= 0 {
		if err := unix.SchedGetaffinity(0, &old); err != nil {
			return nil, err
		}
		if err := pin(writerCPU); err != nil {
			return nil, err
		}
		defer func() { _ = unix.SchedSetaffinity(0, &old) }()
	}
	lat := make([]int64, 0, samples)
	for tries := 0; len(lat) < samples; tries++ {
		if tries > 2*samples+100 {
			return nil, errors.New("the reader was rarely asleep when written to")
		}
		// nanosleep on the writer's own thread, as wakeup.c does: Go's
		// timers would bring the runtime's poller into the measurement.
		pause := unix.NsecToTimespec(int64(50+rand.IntN(100))*1000 + int64(extraPause))
		_ = unix.Nanosleep(&pause, nil)
		wokeAt.Store(0)
		t0 := since()
		fired := q.Inject(1) // writes the eventfd when the reader armed it
		deadline := t0 + int64(time.Second)
		var t1 int64
		nap := unix.NsecToTimespec(20000) // sleep, as wakeup.c: on one CPU, do not compete with the reader
		for t1 = wokeAt.Load(); t1 == 0; t1 = wokeAt.Load() {
			if since() > deadline {
				return nil, errors.New("the reader did not wake within 1 s")
			}
			_ = unix.Nanosleep(&nap, nil)
		}
		if fired { // else the reader was still polling: not a wake-up
			lat = append(lat, t1-t0)
		}
	}
	cancel()
	if err := <-readerDone; err != nil {
		return nil, err
	}
	return lat, nil
}
