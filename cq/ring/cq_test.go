package ring

import (
	"context"
	"github.com/vfnic/vfnic/cq"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestSReadBlocksUntilInterrupt(t *testing.T) {
	h := newHarness(t, cq.Attr{Format: cq.FormatMsg, WaitObj: cq.WaitFD}, 16, 16)
	id := h.post("late", 8, cq.FlagSend|cq.FlagMsg)
	go func() {
		time.Sleep(30 * time.Millisecond)
		h.produce(rawEntry{id: id, ln: 8})
	}()
	ents := make([]cq.Entry, 4)
	start := time.Now()
	n, err := h.c.SRead(context.Background(), ents, 0, 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, "late", ents[0].Context)
	require.Less(t, time.Since(start), 2*time.Second)
	require.GreaterOrEqual(t, h.arms.n, 1, "SRead armed the device")
}

func TestSReadNoWaitObject(t *testing.T) {
	h := newHarness(t, cq.Attr{WaitObj: cq.WaitNone}, 16, 16)
	_, err := h.c.SRead(context.Background(), make([]cq.Entry, 1), 0, time.Second)
	require.ErrorIs(t, err, cq.ErrNotSupported)
	require.ErrorIs(t, h.c.Signal(), cq.ErrNotSupported)
	_, err = h.c.WaitFD()
	require.ErrorIs(t, err, cq.ErrNoData)
}

func TestSReadLostInterruptRecoversAtTimeout(t *testing.T) {
	h := newHarness(t, cq.Attr{Format: cq.FormatMsg, WaitObj: cq.WaitFD}, 16, 16)
	h.arms.lose = 1
	id := h.post("lost", 8, cq.FlagSend|cq.FlagMsg)
	go func() {
		time.Sleep(20 * time.Millisecond)
		h.produce(rawEntry{id: id, ln: 8})
	}()
	ents := make([]cq.Entry, 4)
	n, err := h.c.SRead(context.Background(), ents, 0, 150*time.Millisecond)
	require.NoError(t, err, "the last poll at the timeout finds the entry")
	require.Equal(t, 1, n)
}

func TestSReadManyWaiters(t *testing.T) {
	h := newHarness(t, cq.Attr{Format: cq.FormatMsg, WaitObj: cq.WaitFD}, 256, 256)
	const total = 200
	var got atomic.Int64
	seen := make([]atomic.Int32, total)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ents := make([]cq.Entry, 3)
			for got.Load() < total {
				n, err := h.c.SRead(ctx, ents, 0, 50*time.Millisecond)
				if err != nil {
					continue
				}
				for _, e := range ents[:n] {
					seen[e.Context.(int)].Add(1)
				}
				got.Add(int64(n))
			}
		}()
	}
	for i := 0; i < total; i++ {
		id := h.post(i, 8, cq.FlagSend|cq.FlagMsg)
		h.produce(rawEntry{id: id, ln: 1})
		if i%16 == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	wg.Wait()
	for i := range seen {
		require.EqualValues(t, 1, seen[i].Load(), "completion %d", i)
	}
}

func TestAllocsFilledRing(t *testing.T) {
	h := newHarness(t, cq.Attr{Format: cq.FormatTagged, WaitObj: cq.WaitFD}, 1024, 1024)
	ctxs := make([]any, 1024)
	for i := range ctxs {
		ctxs[i] = i
	}
	fill := func(status uint8) {
		for i := 0; i < 1000; i++ {
			id, err := h.tab.Post(Op{Context: ctxs[i], Len: 64, Flags: cq.FlagRecv | cq.FlagMsg})
			require.NoError(t, err)
			h.complete(rawEntry{id: id, opcode: 1, ln: 64, status: uint32(status), flags: 1 << 4, src: 9})
		}
	}
	ents := make([]cq.Entry, 8)
	addrs := make([]cq.Addr, 8)
	fill(0)
	require.Zero(t, testing.AllocsPerRun(100, func() { _, _ = h.c.Read(ents) }))
	require.Zero(t, testing.AllocsPerRun(20, func() { _, _ = h.c.ReadFrom(ents, addrs) }))
	for {
		if _, err := h.c.Read(ents); err != nil {
			break
		}
	}
	fill(5)
	var ee cq.ErrEntry
	buf := make([]byte, 16)
	require.Zero(t, testing.AllocsPerRun(100, func() {
		ee.ErrData = buf
		_, _ = h.c.Read(ents)
		_ = h.c.ReadErr(&ee)
	}))
	require.Zero(t, testing.AllocsPerRun(100, func() {
		ee.ErrData = nil
		_ = h.c.ReadErr(&ee)
	}))
}

// BenchmarkReadFilledRing is the reader alone on a ring the device has
// already written for a lap (4096 64-byte entries, batch 32): the state a
// NIC leaves after a burst. ns/op is per entry and counts only the reads
// (the refill between laps is timed out by hand: StopTimer would stop the
// world to read memory statistics on every lap).
func BenchmarkReadFilledRing(b *testing.B) {
	const lap = 4096
	h := newHarness(b, cq.Attr{Format: cq.FormatData}, lap, lap)
	ctxs := make([]any, lap)
	for i := range ctxs {
		ctxs[i] = i
	}
	refill := func() {
		for i := 0; i < lap; i++ {
			id, err := h.tab.Post(Op{Context: ctxs[i], Len: 1500, Flags: cq.FlagRecv | cq.FlagMsg})
			if err != nil {
				b.Fatal(err)
			}
			h.dev.write(rawEntry{id: id, queue: h.queue, opcode: 1, ln: 64}, false)
		}
	}
	benchLaps(b, h.c, lap, refill)
}

// BenchmarkReadFilledPackedRing is BenchmarkReadFilledRing on the virtio
// packed ring's layout (16-byte descriptors, 16-bit buffer ids, the
// AVAIL/USED wrap bits), the format a virtio NIC writes.
func BenchmarkReadFilledPackedRing(b *testing.B) {
	const lap = 4096
	l := conventionLayouts(lap)[2]
	mem := mmap(b, lap*l.EntrySize)
	src, err := NewRingSource(RingConfig{Mem: mem, Layout: l})
	if err != nil {
		b.Fatal(err)
	}
	c, err := cq.New(cq.Attr{Size: lap, Format: cq.FormatData}, cq.Limits{})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	if err := c.Driver().AddSource(src); err != nil {
		b.Fatal(err)
	}
	tab, err := NewTable(lap, 16)
	if err != nil {
		b.Fatal(err)
	}
	if err := src.BindTable(0, tab); err != nil {
		b.Fatal(err)
	}
	if src.fast == nil {
		b.Fatal("the packed layout should take the fast path")
	}
	dev := &fakeDev{mem: mem, l: l}
	ctxs := make([]any, lap)
	for i := range ctxs {
		ctxs[i] = i
	}
	refill := func() {
		for i := 0; i < lap; i++ {
			id, err := tab.Post(Op{Context: ctxs[i], Len: 1500, Flags: cq.FlagRecv | cq.FlagMsg})
			if err != nil {
				b.Fatal(err)
			}
			dev.write(rawEntry{id: id, ln: 64}, false)
		}
	}
	benchLaps(b, c, lap, refill)
}

// benchLaps is the timed part of the filled-ring benchmarks: for each lap,
// refill (not timed), then read the lap from c in batches of benchBatch.
// ns/op is per entry and counts only the reads.
func benchLaps(b *testing.B, c *cq.CQ, lap int, refill func()) {
	ents := make([]cq.Entry, benchBatch)
	b.ReportAllocs()
	b.ResetTimer()
	var reading time.Duration
	done := 0
	for done < b.N {
		refill()
		t0 := time.Now()
		for i := 0; i < lap; i += benchBatch {
			if n, err := c.Read(ents); err != nil || n != benchBatch {
				b.Fatalf("read %d: %v", n, err)
			}
		}
		reading += time.Since(t0)
		done += lap
	}
	b.ReportMetric(float64(reading.Nanoseconds())/float64(done), "ns/op")
}

var benchBatch = 32

// One error vocabulary: a closed CQ's errors match os.ErrClosed, an
// expired SRead os.ErrDeadlineExceeded (and ErrAgain, fi_cq_sread's
// -FI_EAGAIN), and a nil context is refused.
func TestErrorVocabulary(t *testing.T) {
	c, err := cq.New(cq.Attr{WaitObj: cq.WaitFD}, cq.Limits{})
	require.NoError(t, err)
	ents := make([]cq.Entry, 1)
	_, err = c.SRead(context.Background(), ents, 0, time.Millisecond)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	require.ErrorIs(t, err, cq.ErrAgain)
	var te interface{ Timeout() bool }
	require.ErrorAs(t, err, &te)
	require.True(t, te.Timeout())
	require.NoError(t, c.Signal())
	_, err = c.SRead(context.Background(), ents, 0, time.Millisecond)
	require.ErrorIs(t, err, cq.ErrSignaled)
	require.NotErrorIs(t, err, os.ErrDeadlineExceeded, "a signal is not a deadline")
	_, err = c.SRead(nil, ents, 0, time.Millisecond) //nolint:staticcheck // a nil context is what is tested
	require.ErrorIs(t, err, cq.ErrInvalid)
	require.ErrorIs(t, err, os.ErrInvalid)
	require.NoError(t, c.Close())
	_, err = c.Read(ents)
	require.ErrorIs(t, err, os.ErrClosed)
	require.ErrorIs(t, c.ReadErr(&cq.ErrEntry{}), os.ErrClosed)
	_, err = c.SRead(context.Background(), ents, 0, time.Millisecond)
	require.ErrorIs(t, err, os.ErrClosed)
	require.ErrorIs(t, c.Signal(), os.ErrClosed)
	require.ErrorIs(t, c.Driver().AddSource(&RingSource{}), os.ErrClosed)
}
