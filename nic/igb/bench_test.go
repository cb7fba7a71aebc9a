package igb

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/nic"
)

// TestRxPathAllocs: reading, reposting and flushing allocate nothing
// (counted around the driver's calls only, not the fake device's).
func TestRxPathAllocs(t *testing.T) {
	d, f := newFakeDevice(t, Config{Config: nic.Config{QueueSize: 64}})
	dev := newFakeNIC(t, d, f)
	rx := d.rx[0]
	fill(t, rx)
	out := make([]nic.Completion, 32)
	frame := frameOf(1, 64)
	// rounds receives and reposts 20 rings of 63 frames and counts the
	// allocations of the last 19 (the first may warm up lazily made
	// state). MemStats counts the whole process's, and another goroutine
	// of the test binary allocated 7 times once in about 40 runs (under
	// -race), so a count above 0 is measured again: an allocation on the
	// path would show in every attempt.
	rounds := func() (allocs uint64) {
		var ms runtime.MemStats
		frames := 0
		for round := 0; round < 20; round++ {
			for dev.rxPosted() > 0 {
				dev.receive(frame)
			}
			runtime.ReadMemStats(&ms)
			before := ms.Mallocs
			for {
				n := rx.Poll(out)
				for _, c := range out[:n] {
					if c.Err != nil || rx.Repost(c.Buf, nil) != nil {
						t.Fatalf("completion %+v", c)
					}
				}
				frames += n
				if n < len(out) {
					break
				}
			}
			if err := rx.Flush(); err != nil {
				t.Fatal(err)
			}
			runtime.ReadMemStats(&ms)
			if round > 0 {
				allocs += ms.Mallocs - before
			}
		}
		require.Equal(t, 20*63, frames)
		return allocs
	}
	var counts []uint64
	for range 3 {
		n := rounds()
		if n == 0 {
			return
		}
		counts = append(counts, n)
	}
	t.Fatalf("allocations in 19 rounds of 63 frames, in each of 3 attempts: %v", counts)
}

// BenchmarkRxPoll measures the receive completion path per frame: Poll
// (the cq ring reader, validation, conversion), Repost and one Flush per
// batch, on a ring the fake device filled.
func BenchmarkRxPoll(b *testing.B) {
	d, f := newFakeDevice(b, Config{Config: nic.Config{QueueSize: 256}})
	dev := newFakeNIC(b, d, f)
	rx := d.rx[0]
	fill(b, rx)
	out := make([]nic.Completion, 32)
	frame := frameOf(1, 64)
	b.ReportAllocs()
	b.ResetTimer()
	n := 0
	for n < b.N {
		b.StopTimer()
		for dev.rxPosted() > 0 {
			dev.receive(frame)
		}
		b.StartTimer()
		for {
			k := rx.Poll(out)
			for _, c := range out[:k] {
				_ = rx.Repost(c.Buf, nil)
			}
			n += k
			if k < len(out) {
				break
			}
		}
		_ = rx.Flush()
	}
}
