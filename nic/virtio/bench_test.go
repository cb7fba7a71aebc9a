package virtio

import (
	"fmt"
	"testing"

	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/nic"
	qcore "github.com/vfnic/vfnic/nic/internal/queue"
)

// BenchmarkRxPoll: the receive path per frame, ns/op per frame, in batches
// of 32 (the fake device's work included: take, write the header, frame
// and used entry; 64-byte frames), through the queue's Poll and through a
// CQ the queue feeds, the buffers reposted one by one (Repost) or per
// batch (RepostBurst, burst=true).
func BenchmarkRxPoll(b *testing.B) {
	for _, packed := range []bool{true, false} {
		for _, mode := range []struct{ viaCQ, burst bool }{{false, false}, {false, true}, {true, false}} {
			viaCQ, burst := mode.viaCQ, mode.burst
			b.Run(fmt.Sprintf("packed=%v/cq=%v/burst=%v", packed, viaCQ, burst), func(b *testing.B) {
				r := newRig(b, 256, packed, true, 2<<20)
				rx := r.rxQueue(b, 512, 2048, true)
				var c *cq.CQ
				if viaCQ {
					c = benchBind(b, rx)
				}
				for range 256 {
					_ = rx.PostRecv(nil)
				}
				_ = rx.Flush()
				f := frameFor(1, 64)
				var comps [32]nic.Completion
				var bufs [32]uintptr
				ents := make([]cq.Entry, 32)
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i += 32 {
					for range 32 {
						tk, _ := r.dev.take()
						r.dev.complete(tk.id, writeFrame(tk, f, 1), 1)
					}
					if viaCQ {
						n, _ := c.Read(ents)
						for _, e := range ents[:n] {
							_ = rx.Repost(e.Buf, nil)
						}
					} else if burst {
						n := rx.Poll(comps[:])
						for i, cp := range comps[:n] {
							bufs[i] = cp.Buf
						}
						_, _ = rx.RepostBurst(bufs[:n], nil)
					} else {
						n := rx.Poll(comps[:])
						for _, cp := range comps[:n] {
							_ = rx.Repost(cp.Buf, nil)
						}
					}
					_ = rx.Flush()
				}
			})
		}
	}
}

func benchBind(b *testing.B, rx *RxQueue) *cq.CQ {
	c, err := cq.New(cq.Attr{Format: cq.FormatData, Size: 512}, cq.Limits{})
	if err != nil {
		b.Fatal(err)
	}
	var v qcore.Device
	if err := v.Bind(c, []*qcore.Queue{&rx.Queue}, func(s *qcore.Source) error { return v.Unbind(s, false) }); err != nil {
		b.Fatal(err)
	}
	return c
}
