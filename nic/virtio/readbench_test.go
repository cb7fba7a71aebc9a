package virtio

import (
	"fmt"
	"testing"

	"github.com/vfnic/vfnic/nic/internal/benchcpu"
)

// BenchmarkDriverRead is bench/run.sh's driver rows for virtio: a real
// receive queue (its own read code: the ring reader's batch read,
// virtio-net's pass over the batch, the queue core lending each buffer
// and writing nic.Completion) over an in-memory ring of
// VFNIC_BENCH_ENTRIES descriptors (1024), read with Poll in batches of
// VFNIC_BENCH_BATCH (32). The device is the tests' fake one, which
// writes what a device writes: it takes each available buffer, writes
// the virtio-net header (num_buffers 1) and a 64-byte frame into it and
// a used entry. It fills a whole lap untimed, then the reads of the lap
// are timed, then the buffers are reposted (untimed), as bench/run.sh's
// filled and local modes do: mode=local fills on the reader's CPU,
// mode=filled on another (the reader is pinned to CPU 0, the device to
// CPU 1). The metric ns/completion is the time of the reads alone.
func BenchmarkDriverRead(b *testing.B) {
	n, batch := benchcpu.ReadParams(b)
	for _, packed := range []bool{true, false} {
		for _, filled := range []bool{false, true} {
			b.Run(fmt.Sprintf("layout=%s/mode=%s", map[bool]string{true: "packed", false: "split"}[packed],
				map[bool]string{true: "filled", false: "local"}[filled]), func(b *testing.B) {
				benchDriverRead(b, n, batch, packed, filled)
			})
		}
	}
}

func benchDriverRead(b *testing.B, n, batch int, packed, filled bool) {
	r := newRig(b, n, packed, true, n*2048+(64<<10))
	rx := r.rxQueue(b, n, 2048, true)
	for rx.PostRecv(nil) == nil {
	}
	if err := rx.Flush(); err != nil {
		b.Fatal(err)
	}
	frame := frameFor(1, 64)
	fill := func() int {
		k := 0
		for tk, ok := r.dev.take(); ok; tk, ok = r.dev.take() {
			r.dev.complete(tk.id, writeFrame(tk, frame, 1), tk.ndesc)
			k++
		}
		return k
	}
	benchcpu.ReadLaps(b, rx, fill, filled, batch, len(frame))
}
