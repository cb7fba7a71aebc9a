package verbs_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/cq/qpsim"
	"github.com/vfnic/vfnic/verbs"
)

// wrid is the fi_cq side's equivalent of CQ.WRID, so both loops do the
// same work per entry.
func wrid(ctx any) uint64 {
	if v, ok := ctx.(uint64); ok {
		return v
	}
	if v, ok := ctx.(int); ok {
		return uint64(v)
	}
	if v, ok := ctx.(uintptr); ok {
		return uint64(v)
	}
	if v, ok := ctx.(uint32); ok {
		return uint64(v)
	}
	return 0
}

var sink uint64

// filledRing is a software device whose QP completes into one CQ of
// fillLap entries, the fi_cq one or a verbs CQ's, with the operations to
// fill it a lap at a time.
type filledRing struct {
	d       *qpsim.Device
	fi      *cq.CQ
	vc      *verbs.CQ // nil for the fi_cq path
	qp      *qpsim.QP
	ctxs    []any
	payload []byte
}

// fillLap is the number of entries filledRing's CQ and QP hold.
const fillLap = 4096

// The verbs CQs of the benchmarks ask for the byte length, which they
// read, and so read their ring as FormatMsg (CreateCQ); the fi_cq CQs
// they are compared with have the same format, so that both paths decode
// the same fields.
const (
	benchFields = verbs.FieldByteLen
	benchFormat = cq.FormatMsg
)

func newFilledRing(tb testing.TB, iter, single bool) *filledRing {
	d, err := qpsim.New(qpsim.Config{})
	if err != nil {
		tb.Fatal(err)
	}
	f := &filledRing{d: d, ctxs: make([]any, fillLap), payload: make([]byte, 64)}
	if iter {
		fl := verbs.CreateFlags(0)
		if single {
			fl = verbs.SingleThreaded
		}
		f.vc, err = verbs.CreateCQ(newProvider(d), verbs.CQInitAttr{CQE: fillLap, Fields: benchFields, Flags: fl})
		if err == nil {
			f.fi = f.vc.FI()
		}
	} else {
		f.fi, err = d.OpenCQ(cq.Attr{Size: fillLap, Format: benchFormat, WaitObj: cq.WaitFD, SingleThreaded: single})
	}
	if err != nil {
		_ = d.Close()
		tb.Fatal(err)
	}
	f.qp, err = d.NewQP(qpsim.QPConfig{SendCQ: f.fi, RecvCQ: f.fi, SendSize: fillLap, RecvSize: 1})
	if err != nil {
		f.close()
		tb.Fatal(err)
	}
	for i := range f.ctxs {
		f.ctxs[i] = uint64(i)
	}
	return f
}

// fill has the device complete one lap and waits until it has.
func (f *filledRing) fill(tb testing.TB) {
	if n, err := f.qp.SendBatch(f.qp.Addr(), f.ctxs, f.payload, qpsim.SendOpts{}); err != nil || n != fillLap {
		tb.Fatalf("fill: %d %v", n, err)
	}
	if err := f.qp.Flush(context.Background()); err != nil {
		tb.Fatal(err)
	}
	if err := f.d.Sync(context.Background()); err != nil {
		tb.Fatal(err)
	}
}

func (f *filledRing) close() {
	if f.qp != nil {
		_ = f.qp.Close()
	}
	if f.vc != nil {
		_ = f.vc.Close()
	} else if f.fi != nil {
		_ = f.fi.Close()
	}
	_ = f.d.Close()
}

// iterLap reads lap completions with the verbs iterator, StartPoll to
// EndPoll over batchN at a time, reading each one's id, status, opcode
// and length. It is not inlined, so that callgrind (callgrind_test.go)
// can count it.
//
//go:noinline
func iterLap(vc *verbs.CQ, lap, batchN int) (sum uint64, err error) {
	for i := 0; i < lap; i += batchN {
		if err := vc.StartPoll(); err != nil {
			return sum, err
		}
		for k := 0; ; k++ {
			sum += vc.WRID() + uint64(vc.Status()) + uint64(vc.Opcode()) + uint64(vc.ByteLen())
			if k == batchN-1 {
				break
			}
			if err := vc.NextPoll(); err != nil {
				vc.EndPoll()
				return sum, err
			}
		}
		vc.EndPoll()
	}
	return sum, nil
}

// readLap reads lap completions with fi_cq Read, len(ents) at a time,
// reading each one's id (as WRID converts it), flags and length.
//
//go:noinline
func readLap(fi *cq.CQ, ents []cq.Entry, lap int) (sum uint64, err error) {
	for i := 0; i < lap; i += len(ents) {
		n, err := fi.Read(ents)
		if err != nil || n != len(ents) {
			return sum, fmt.Errorf("read %d of %d: %v", n, len(ents), err)
		}
		for j := range ents[:n] {
			e := &ents[j]
			sum += wrid(e.Context) + uint64(e.Flags) + uint64(e.Len)
		}
	}
	return sum, nil
}

// benchFilled times reading a ring the software device has filled (4096
// entries, one lap) in batches of batchN: iterLap (iter, the verbs
// iterator) or readLap (the fi_cq path) over a CQ of the same device and
// attributes. ns/op is per completion and counts only the reads
// (refilling is timed out by hand, as StopTimer stops the world).
func benchFilled(b *testing.B, iter, single bool, batchN int) {
	const lap = fillLap
	f := newFilledRing(b, iter, single)
	defer f.close()
	ents := make([]cq.Entry, batchN)
	var reading time.Duration
	var sum uint64
	b.ReportAllocs()
	b.ResetTimer()
	for done := 0; done < b.N; done += lap {
		f.fill(b)
		t0 := time.Now()
		var s uint64
		var err error
		if iter {
			s, err = iterLap(f.vc, lap, batchN)
		} else {
			s, err = readLap(f.fi, ents, lap)
		}
		reading += time.Since(t0)
		if err != nil {
			b.Fatal(err)
		}
		sum += s
	}
	b.StopTimer()
	sink = sum
	b.ReportMetric(float64(reading.Nanoseconds())/float64((b.N+lap-1)/lap*lap), "ns/op")
}

// BenchmarkFilledRing compares, per completion at batch 32, the fi_cq
// Read path with the verbs iterator on the same device, with the CQ's
// lock (locked) and without (single).
func BenchmarkFilledRing(b *testing.B) {
	b.Run("read/locked", func(b *testing.B) { benchFilled(b, false, false, 32) })
	b.Run("iter/locked", func(b *testing.B) { benchFilled(b, true, false, 32) })
	b.Run("read/single", func(b *testing.B) { benchFilled(b, false, true, 32) })
	b.Run("iter/single", func(b *testing.B) { benchFilled(b, true, true, 32) })
	// Read of 256: fewer instructions per completion than of 32, but a
	// buffer that leaves L1 (why the iterator reads 32 at a time).
	b.Run("read256/single", func(b *testing.B) { benchFilled(b, false, true, 256) })
}

// benchStream reads at batch 32 while the device thread produces: each
// completion read is posted again at once, so the device always has work
// (as tests/simcq's BenchmarkRead32). ns/op is per completion, end to
// end: read plus re-post, with the device's processing overlapped on the
// other core.
func benchStream(b *testing.B, iter bool) {
	const depth, batchN = 4096, 32
	d, err := qpsim.New(qpsim.Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	var fi *cq.CQ
	var vc *verbs.CQ
	if iter {
		vc, err = verbs.CreateCQ(newProvider(d), verbs.CQInitAttr{CQE: 2 * depth, Fields: benchFields})
		if err == nil {
			fi = vc.FI()
		}
	} else {
		fi, err = d.OpenCQ(cq.Attr{Size: 2 * depth, Format: benchFormat, WaitObj: cq.WaitFD})
	}
	if err != nil {
		b.Fatal(err)
	}
	qp, err := d.NewQP(qpsim.QPConfig{SendCQ: fi, RecvCQ: fi, SendSize: depth, RecvSize: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer qp.Close()
	ctxs := make([]any, depth)
	for i := range ctxs {
		ctxs[i] = uint64(i)
	}
	payload := make([]byte, 64)
	if n, err := qp.SendBatch(qp.Addr(), ctxs, payload, qpsim.SendOpts{}); err != nil || n != depth {
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
			k, err := qp.SendBatch(qp.Addr(), repost, payload, qpsim.SendOpts{})
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
