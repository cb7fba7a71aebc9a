// Package benchcpu runs a driver benchmark's two sides on two CPUs, as
// bench/run.sh runs a reader and its producer: the calling goroutine on
// one CPU and a "device" goroutine on another, so that a ring the device
// filled reaches the reader from the other core's cache (bench/run.sh's
// filled mode); and the lap loop of the drivers' BenchmarkDriverRead.
// Test and benchmark code only.
package benchcpu

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"testing"

	"github.com/vfnic/vfnic/nic"
	"golang.org/x/sys/unix"
)

// ReadLaps is the body of a driver's BenchmarkDriverRead: lap by lap,
// the device (fill, which returns how many frames of frameLen bytes it
// delivered) fills the receive queue rx untimed, on CPU 1 when filled
// and else on the reader's CPU 0; the Polls of batch completions that
// read the lap are timed; the buffers are reposted and flushed untimed.
// It reports ns/completion, the time of the reads alone. The queue has
// its buffers posted already.
func ReadLaps(b *testing.B, rx nic.RxQueue, fill func() int, filled bool, batch, frameLen int) {
	undo, err := Pin(0)
	if err != nil {
		b.Fatal(err)
	}
	defer undo()
	var k int
	lap := func() { k = fill() }
	dev := lap
	if filled {
		o := Start(1)
		defer o.Close()
		dev = func() { o.Do(lap) }
	}
	out := make([]nic.Completion, batch)
	bufs := make([]uintptr, 0, rx.Size())
	done := 0
	b.ReportAllocs()
	b.ResetTimer()
	b.StopTimer()
	for done < b.N {
		dev()
		if k == 0 {
			b.Fatal("the device delivered no frame")
		}
		b.StartTimer()
		for got := 0; got < k; {
			m := rx.Poll(out)
			for i := range out[:m] {
				if c := &out[i]; c.Err != nil || c.Len != frameLen {
					b.Fatalf("completion %d of the lap: len %d, %v", got+i, c.Len, c.Err)
				}
				bufs = append(bufs, out[i].Buf)
			}
			got += m
		}
		b.StopTimer()
		for _, p := range bufs {
			if err := rx.Repost(p, nil); err != nil {
				b.Fatal(err)
			}
		}
		bufs = bufs[:0]
		if err := rx.Flush(); err != nil {
			b.Fatal(err)
		}
		done += k
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(done), "ns/completion")
}

// Pin locks the calling goroutine to its thread and the thread to cpu;
// the returned func undoes both. On a machine with one CPU it only locks
// the thread.
func Pin(cpu int) (undo func(), err error) {
	runtime.LockOSThread()
	var old unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	if runtime.NumCPU() > cpu {
		var set unix.CPUSet
		set.Set(cpu)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			runtime.UnlockOSThread()
			return nil, err
		}
	}
	return func() {
		_ = unix.SchedSetaffinity(0, &old)
		runtime.UnlockOSThread()
	}, nil
}

// Other is a goroutine pinned to another CPU that runs what it is given,
// one call at a time: the benchmark's device.
type Other struct {
	do   chan func()
	done chan struct{}
}

// Start starts the goroutine, pinned to cpu (see Pin).
func Start(cpu int) *Other {
	o := &Other{do: make(chan func()), done: make(chan struct{})}
	go func() {
		undo, err := Pin(cpu)
		if err == nil {
			defer undo()
		}
		for f := range o.do {
			f()
			o.done <- struct{}{}
		}
	}()
	return o
}

// Do runs f on the other goroutine and returns when it has: what f
// wrote is visible to the caller after Do (the channel orders it).
func (o *Other) Do(f func()) {
	o.do <- f
	<-o.done
}

// Close stops the goroutine.
func (o *Other) Close() { close(o.do) }

// ReadParams are a BenchmarkDriverRead's ring size and batch, from
// bench/run.sh's VFNIC_BENCH_ENTRIES (1024) and VFNIC_BENCH_BATCH (32);
// a malformed value fails b.
func ReadParams(b *testing.B) (entries, batch int) {
	entries, err := env("VFNIC_BENCH_ENTRIES", 1024)
	if err == nil {
		batch, err = env("VFNIC_BENCH_BATCH", 32)
	}
	if err != nil {
		b.Fatal(err)
	}
	return entries, batch
}

// env is the positive integer in the environment variable name, or def
// when it is unset.
func env(name string, def int) (int, error) {
	s := os.Getenv(name)
	if s == "" {
		return def, nil
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < 1 {
		return 0, fmt.Errorf("%s=%q: want a positive integer", name, s)
	}
	return v, nil
}
