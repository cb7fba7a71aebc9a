package verbs_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/nic/sim"
	"github.com/vfnic/vfnic/verbs"
)

// wrid is the fi_cq side's equivalent of CQ.WRID, so both loops do the
// same work per entry.
func wrid(ctx any) uint64 {
	if v, ok := ctx.(uint64); ok {
		return v
	}
	switch v := ctx.(type) {
	case int:
		return uint64(v)
	}
	return 0
}

var sink uint64

// benchFilled times reading a ring the software device has filled (4096
// entries, one lap) in batches of batchN (Read calls, or StartPoll to
// EndPoll), reading the id, status or flags,
// opcode and length of each entry; ns/op is per completion and counts
// only the reads (refilling is timed out by hand, as StopTimer stops the
// world). read is the fi_cq path (cq.CQ.Read); iter is the verbs
// iterator over a CQ of the same device and attributes.
func benchFilled(b *testing.B, iter, single bool, batchN int) {
	const lap = 4096
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
	b.Run("read/locked", func(b *testing.B) { benchFilled(b, false, false, 32) })
	b.Run("iter/locked", func(b *testing.B) { benchFilled(b, true, false, 32) })
	b.Run("read/single", func(b *testing.B) { benchFilled(b, false, true, 32) })
	b.Run("iter/single", func(b *testing.B) { benchFilled(b, true, true, 32) })
	// Read as many entries per call as the iterator takes from the ring
	// at once: the difference to iter is the iterator's own cost.
	b.Run("read256/single", func(b *testing.B) { benchFilled(b, false, true, 256) })
}

// benchStream reads at batch 32 while the device thread produces: each
// completion read is posted again at once, so the device always has work
// (as tests/simcq's BenchmarkRead32). ns/op is per completion, end to
// end: read plus re-post, with the device's processing overlapped on the
// other core.
func benchStream(b *testing.B, iter bool) {
	const depth, batchN = 4096, 32
	d, err := sim.New(sim.Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	var fi *cq.CQ
	var vc *verbs.CQ
	if iter {
		vc, err = verbs.CreateCQ(newProvider(d), verbs.CQInitAttr{CQE: 2 * depth})
		if err == nil {
			fi = vc.FI()
		}
	} else {
		fi, err = d.OpenCQ(cq.Attr{Size: 2 * depth, Format: cq.FormatData, WaitObj: cq.WaitFD})
	}
	if err != nil {
		b.Fatal(err)
	}
	qp, err := d.NewQP(sim.QPConfig{SendCQ: fi, RecvCQ: fi, SendSize: depth, RecvSize: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer qp.Close()
	ctxs := make([]any, depth)
	for i := range ctxs {
		ctxs[i] = uint64(i)
	}
	payload := make([]byte, 64)
	if n, err := qp.SendBatch(qp.Addr(), ctxs, payload, sim.SendOpts{}); err != nil || n != depth {
		b.Fatalf("prime: %d %v", n, err)
	}
	ents := make([]cq.Entry, batchN)
	repost := make([]any, 0, depth)
	var sum uint64
	b.ReportAllocs()
	b.ResetTimer()
	for got := 0; got < b.N; {
		if iter {
			if vc.StartPoll() == nil {
				for k := 0; ; k++ {
					sum += vc.WRID() + uint64(vc.Status()) + uint64(vc.Opcode()) + uint64(vc.ByteLen())
					repost = append(repost, vc.WRContext())
					got++
					if k == batchN-1 || vc.NextPoll() != nil {
						break
					}
				}
				vc.EndPoll()
			}
		} else {
			n, _ := fi.Read(ents)
			for j := range ents[:n] {
				e := &ents[j]
				sum += wrid(e.Context) + uint64(e.Flags) + uint64(e.Len)
				repost = append(repost, e.Context)
			}
			got += n
		}
		if len(repost) > 0 {
			k, err := qp.SendBatch(qp.Addr(), repost, payload, sim.SendOpts{})
			if err != nil && !errors.Is(err, cq.ErrAgain) {
				b.Fatal(err)
			}
			repost = append(repost[:0], repost[k:]...)
		}
	}
	b.StopTimer()
	sink = sum
	if vc != nil {
		_ = qp.Close()
		_ = vc.Close()
	}
}

// BenchmarkStream compares the fi_cq Read path and the verbs iterator end
// to end, at batch 32, with the device producing meanwhile.
func BenchmarkStream(b *testing.B) {
	b.Run("read", func(b *testing.B) { benchStream(b, false) })
	b.Run("iter", func(b *testing.B) { benchStream(b, true) })
}
