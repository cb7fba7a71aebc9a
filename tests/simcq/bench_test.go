package simcq

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/cq/qpsim"
)

type benchEnv struct {
	d    *qpsim.Device
	c    *cq.CQ
	qp   *qpsim.QP
	ctxs []any
}

func newBenchEnv(b *testing.B, attr cq.Attr, depth int) *benchEnv {
	d, err := qpsim.New(qpsim.Config{})
	if err != nil {
		b.Fatal(err)
	}
	c, err := d.OpenCQ(attr)
	if err != nil {
		b.Fatal(err)
	}
	qp, err := d.NewQP(qpsim.QPConfig{SendCQ: c, RecvCQ: c, SendSize: depth, RecvSize: 1})
	if err != nil {
		b.Fatal(err)
	}
	e := &benchEnv{d: d, c: c, qp: qp, ctxs: make([]any, depth)}
	for i := range e.ctxs {
		e.ctxs[i] = i
	}
	b.Cleanup(func() { _ = d.Close() })
	return e
}

var payload = make([]byte, 64)

// benchRead reads with batches of the given size while the device thread
// produces: each completion read is re-posted at once, so the device always
// has work (the frames go to no receive queue and are dropped after their
// send completion). ns/op is per completion, end to end: read plus
// re-post, with the device's processing overlapped on the other core.
func benchRead(b *testing.B, batch int) {
	const depth = 4096
	e := newBenchEnv(b, cq.Attr{Size: 2 * depth, Format: cq.FormatData}, depth)
	if n, err := e.qp.SendBatch(e.qp.Addr(), e.ctxs, payload, qpsim.SendOpts{}); err != nil || n != depth {
		b.Fatalf("prime: %d %v", n, err)
	}
	ents := make([]cq.Entry, batch)
	// The device frees a send queue slot just after it writes the
	// completion, so a re-post may briefly find the queue full: what is
	// not re-posted waits for the next round.
	repost := make([]any, 0, depth)
	calls, empty := 0, 0
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for got := 0; got < b.N; {
		n, err := e.c.Read(ents)
		calls++
		if err != nil && !errors.Is(err, cq.ErrAgain) {
			b.Fatal(err)
		}
		if n == 0 {
			empty++
		}
		got += n
		for i := range ents[:n] {
			repost = append(repost, ents[i].Context)
		}
		if len(repost) > 0 {
			k, err := e.qp.SendBatch(e.qp.Addr(), repost, payload, qpsim.SendOpts{})
			if err != nil && !errors.Is(err, cq.ErrAgain) {
				b.Fatal(err)
			}
			repost = append(repost[:0], repost[k:]...)
		}
	}
	el := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(el.Nanoseconds())/float64(calls), "ns/read")
	b.ReportMetric(float64(b.N)/float64(calls-empty), "entries/read")
	b.ReportMetric(float64(empty)/float64(calls), "empty/read")
}

func BenchmarkRead1(b *testing.B)   { benchRead(b, 1) }
func BenchmarkRead8(b *testing.B)   { benchRead(b, 8) }
func BenchmarkRead32(b *testing.B)  { benchRead(b, 32) }
func BenchmarkRead256(b *testing.B) { benchRead(b, 256) }

// BenchmarkReadFilledRing is the reader alone on the device's real ring
// after the device wrote a full lap (4096 entries, batch 32); ns/op is per
// entry and counts only the reads (refilling between laps is timed out by
// hand, since StopTimer stops the world on every call).
func BenchmarkReadFilledRing(b *testing.B) {
	const lap = 4096
	e := newBenchEnv(b, cq.Attr{Size: lap, Format: cq.FormatData}, lap)
	ents := make([]cq.Entry, 32)
	var reading time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	done := 0
	for done < b.N {
		if n, err := e.qp.SendBatch(e.qp.Addr(), e.ctxs, payload, qpsim.SendOpts{}); err != nil || n != lap {
			b.Fatalf("fill: %d %v", n, err)
		}
		if err := e.qp.Flush(context.Background()); err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		for i := 0; i < lap; i += len(ents) {
			if n, err := e.c.Read(ents); err != nil || n != len(ents) {
				b.Fatalf("read %d: %v", n, err)
			}
		}
		reading += time.Since(t0)
		done += lap
	}
	b.ReportMetric(float64(reading.Nanoseconds())/float64(done), "ns/op")
}

// BenchmarkSReadWakeup measures how long a reader blocked in SRead takes
// to return after the device wrote the entry (device clock to return):
// the interrupt through the eventfd, the runtime poller, the goroutine
// scheduled, the read. Reported as the median and 99th percentile.
func BenchmarkSReadWakeup(b *testing.B) {
	e := newBenchEnv(b, cq.Attr{Size: 64, Format: cq.FormatContext, WaitObj: cq.WaitFD}, 16)
	kick := make(chan struct{})
	defer close(kick)
	go func() {
		for range kick {
			time.Sleep(200 * time.Microsecond) // let the reader park first
			if err := e.qp.Send(e.qp.Addr(), 1, payload, qpsim.SendOpts{}); err != nil {
				panic(err)
			}
		}
	}()
	ents := make([]cq.Entry, 1)
	lat := make([]time.Duration, 0, b.N)
	// A context that can end, as a server's request context: its
	// registration is made once, so the reads allocate nothing.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		kick <- struct{}{}
		n, err := e.c.SRead(ctx, ents, 0, 5*time.Second)
		now := e.d.Now()
		if err != nil || n != 1 {
			b.Fatalf("sread %d: %v", n, err)
		}
		st, err := e.d.CQStats(e.c)
		if err != nil {
			b.Fatal(err)
		}
		lat = append(lat, now-st.LastWrite)
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	p := func(q float64) float64 { return float64(lat[int(q*float64(len(lat)-1))].Nanoseconds()) }
	b.ReportMetric(p(0.5), "p50-ns")
	b.ReportMetric(p(0.99), "p99-ns")
	if testing.Verbose() {
		fmt.Printf("SRead wake-up over %d: min %v p50 %v p99 %v max %v\n", len(lat), lat[0],
			time.Duration(p(0.5)), time.Duration(p(0.99)), lat[len(lat)-1])
	}
}
