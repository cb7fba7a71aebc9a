package igb

import (
	"testing"

	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/nic/internal/benchcpu"
)

// BenchmarkDriverRead is bench/run.sh's driver row for igb: a real
// receive queue (the ring reader's batch read of the write-back
// descriptors, igb's pass with its offload words, the queue core lending
// each buffer and writing nic.Completion) of VFNIC_BENCH_ENTRIES
// descriptors (1024), read with Poll in batches of VFNIC_BENCH_BATCH
// (32). The device is the tests' fake 82576, which writes what the
// device writes: the frame into the posted buffer, then the write-back
// descriptor with DD|EOP and the length, DD last. A lap (every posted
// descriptor) is filled untimed, its reads timed, its buffers reposted
// untimed: mode=local fills on the reader's CPU, mode=filled on another
// (reader on CPU 0, device on CPU 1), as bench/run.sh's modes.
func BenchmarkDriverRead(b *testing.B) {
	n, batch := benchcpu.ReadParams(b)
	for _, filled := range []bool{false, true} {
		b.Run("layout=igb/mode="+map[bool]string{true: "filled", false: "local"}[filled], func(b *testing.B) {
			benchDriverRead(b, n, batch, filled)
		})
	}
}

func benchDriverRead(b *testing.B, n, batch int, filled bool) {
	d, f := newFakeDevice(b, Config{Config: nic.Config{QueueSize: n}})
	dev := newFakeNIC(b, d, f)
	rx := d.rx[0]
	fill(b, rx)
	frame := frameOf(1, 64)
	deliver := func() int {
		k := 0
		for ; dev.rxPosted() > 0; k++ {
			dev.receive(frame)
		}
		return k
	}
	benchcpu.ReadLaps(b, rx, deliver, filled, batch, len(frame))
}
