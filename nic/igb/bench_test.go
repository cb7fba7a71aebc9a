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
	var ms runtime.MemStats
	var allocs uint64
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
		if round > 0 { // the first round may warm up lazily made state
			allocs += ms.Mallocs - before
		}
	}
	require.Equal(t, 20*63, frames)
	require.Zero(t, allocs, "allocations in 19 rounds of 63 frames")
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
