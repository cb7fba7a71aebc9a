package verbs_test

import (
	"context"
	"testing"
	"time"

	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/nic/sim"
	"github.com/vfnic/vfnic/verbs"
)

// wrid is the fi_cq side's equivalent of CQ.WRID, so both loops do the
// same work per entry.
func wrid(ctx any) uint64 {
	switch v := ctx.(type) {
	case uint64:
		return v
	case int:
		return uint64(v)
	}
	return 0
}

var sink uint64

// benchFilled times reading a ring the software device has filled (4096
// entries, one lap) in batches of 32, reading the id, status or flags,
// opcode and length of each entry; ns/op is per completion and counts
// only the reads (refilling is timed out by hand, as StopTimer stops the
// world). read is the fi_cq path (cq.CQ.Read); iter is the verbs
// iterator over a CQ of the same device and attributes.
func benchFilled(b *testing.B, iter, single bool) {
	const lap, batchN = 4096, 32
	d, err := sim.New(sim.Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	var fi *cq.CQ
	var vc *verbs.CQ
	if iter {
		fl := verbs.CreateFlags(0)
		if single {
			fl = verbs.SingleThreaded
		}
		vc, err = verbs.CreateCQ(newProvider(d), verbs.CQInitAttr{CQE: lap, Flags: fl})
		if err == nil {
			fi = vc.FI()
		}
	} else {
		fi, err = d.OpenCQ(cq.Attr{Size: lap, Format: cq.FormatData, WaitObj: cq.WaitFD, SingleThreaded: single})
	}
	if err != nil {
		b.Fatal(err)
	}
	qp, err := d.NewQP(sim.QPConfig{SendCQ: fi, RecvCQ: fi, SendSize: lap, RecvSize: 1})
	if err != nil {
		b.Fatal(err)
	}
	ctxs := make([]any, lap)
	for i := range ctxs {
		ctxs[i] = uint64(i)
	}
	payload := make([]byte, 64)
	ents := make([]cq.Entry, batchN)
	var reading time.Duration
	var sum uint64
	b.ReportAllocs()
	b.ResetTimer()
	for done := 0; done < b.N; done += lap {
		if n, err := qp.SendBatch(qp.Addr(), ctxs, payload, sim.SendOpts{}); err != nil || n != lap {
			b.Fatalf("fill: %d %v", n, err)
		}
		if err := qp.Flush(context.Background()); err != nil {
			b.Fatal(err)
		}
		if err := d.Sync(context.Background()); err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		if iter {
			for i := 0; i < lap; i += batchN {
				if err := vc.StartPoll(); err != nil {
					b.Fatal(err)
				}
				for k := 0; ; k++ {
					sum += vc.WRID() + uint64(vc.Status()) + uint64(vc.Opcode()) + uint64(vc.ByteLen())
					if k == batchN-1 {
						break
					}
					if err := vc.NextPoll(); err != nil {
						b.Fatal(err)
					}
				}
				vc.EndPoll()
			}
		} else {
			for i := 0; i < lap; i += batchN {
				n, err := fi.Read(ents)
				if err != nil || n != batchN {
					b.Fatalf("read %d: %v", n, err)
				}
				for j := range ents[:n] {
					e := &ents[j]
					sum += wrid(e.Context) + uint64(e.Flags) + uint64(e.Len)
				}
			}
		}
		reading += time.Since(t0)
	}
	b.StopTimer()
	sink = sum
	b.ReportMetric(float64(reading.Nanoseconds())/float64((b.N+lap-1)/lap*lap), "ns/op")
	_ = qp.Close()
	if vc != nil {
		_ = vc.Close()
	} else {
		_ = fi.Close()
	}
}

// BenchmarkFilledRing compares, per completion at batch 32, the fi_cq
// Read path with the verbs iterator on the same device, with the CQ's
// lock (locked) and without (single).
func BenchmarkFilledRing(b *testing.B) {
	b.Run("read/locked", func(b *testing.B) { benchFilled(b, false, false) })
	b.Run("iter/locked", func(b *testing.B) { benchFilled(b, true, false) })
	b.Run("read/single", func(b *testing.B) { benchFilled(b, false, true) })
	b.Run("iter/single", func(b *testing.B) { benchFilled(b, true, true) })
}
