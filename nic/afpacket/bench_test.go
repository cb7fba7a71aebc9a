package afpacket

import (
	"errors"
	"testing"
	"time"

	vt "github.com/vfnic/vfnic/internal/vethtest"
	"github.com/vfnic/vfnic/nic"
)

// BenchmarkSend (as nic/afxdp's) sends frames from vfnic's end of a veth pair as fast as
// the queue takes them, reading completions in batches (busy polling on
// the calling goroutine). The peer has no reader: the kernel drops the
// frames after veth delivers them. frames/s is the rate of completions.
func BenchmarkSend(b *testing.B) {
	for _, size := range []int{64, 1514} {
		b.Run(map[int]string{64: "64B", 1514: "1514B"}[size], func(b *testing.B) {
			v := vt.New(b, 1)
			dev := openIn(b, v.A, "vfx0", nic.Config{})
			tx := dev.tx[0]
			frame := make([]byte, size)
			copy(frame, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
			frame[12], frame[13] = vt.TestType>>8, vt.TestType&0xff
			comps := make([]nic.Completion, 64)
			done := 0
			b.ResetTimer()
			start := time.Now()
			for sent := 0; done < b.N; {
				for sent < b.N {
					if err := tx.Send(frame, nil); errors.Is(err, nic.ErrFull) {
						break
					} else if err != nil {
						b.Fatal(err)
					}
					sent++
					if sent%32 == 0 {
						break
					}
				}
				if err := tx.Flush(); err != nil {
					b.Fatal(err)
				}
				done += tx.Poll(comps)
			}
			b.ReportMetric(float64(done)/time.Since(start).Seconds(), "frames/s")
		})
	}
}
