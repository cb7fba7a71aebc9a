// Command goreader is the Go half of the completion-path benchmark (see
// bench/README.md). It maps the shared-memory ring that bench/c/producer.c
// writes and reads it through vfnic's real completion path, built the way
// cq/qpsim builds its CQs: cq.New with qpsim.Limits, a ring.RingSource over
// qpsim.Layout with qpsim.Codes, the consumer-count doorbell and the overrun
// word of sim's status page, and a ring.Table of posted receives bound to
// queue 0. Each cq.CQ.Read fills a []cq.Entry of the batch size; every
// completion is checked (data = sequence number) and its buffer re-posted
// through the Table.
//
// The ring's layout is the producer's (the header's layout word, ring.h):
// cq/qpsim's, read through a cq.CQ as cq/qpsim's CQs are, or the virtio
// packed ring (virtio.PackedLayout) or split used ring
// (virtio.SplitLayout, its used index the RingRegs.Producer word), the
// formats a virtio NIC writes, read as nic/virtio reads them: with no
// Codes, through the ring source's batch read (ring.RingSource.NextBatch,
// the loop nic/virtio and nic/igb run), each completion then written into
// the caller's record (a cq.Entry here, as the queue writes a
// nic.Completion or a CQ's entry). The benchmark's consumer-count doorbell
// (sim's) is kept for the virtio layouts too: the producer needs it to
// know which slots are free, where a virtio device learns it from the
// re-posted buffers.
//
// Usage:
//
//	goreader -f PATH -b BATCH [-s] [-k] [-t SECONDS] [-cpuprofile FILE]
//	goreader -l [-L sim|packed|split] [-n ENTRIES] [-c COUNT] -b BATCH [-s] [-k] [-cpuprofile FILE]
//
// -l is local mode: no producer; goreader writes each lap itself (untimed)
// and times its reads of the full ring, with the entries hot in its own
// cache: the CPU cost of the read path alone.
//
// -s opens the CQ SingleThreaded and makes the Table with
// NewSingleThreadedTable: a read and a re-post execute no locked
// instruction, like the C reader in a process of one thread. Without it the
// CQ and the Table are the thread-safe ones (a mutex per Read and per
// Post), which compare with the C reader run with -T.
//
// It prints one line in the format of bench/c/reader.c, with the heap
// allocations per completion (runtime.MemStats.Mallocs over the run) and
// the ring reader's loop that ran (ring.RingSource.Loop).
package main

import (
	"errors"
	"flag"
	"fmt"
	"math/bits"
	"os"
	"runtime"
	"runtime/pprof"
	"sync/atomic"
	"time"

	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/cq/qpsim"
	"github.com/vfnic/vfnic/cq/ring"
	"github.com/vfnic/vfnic/doorbell"
	"github.com/vfnic/vfnic/nic/virtio"
)

// rxBuf is a posted receive buffer; a pointer to it is the operation's
// context, so completions name their buffer without allocating.
type rxBuf struct {
	idx  uint32
	addr uintptr
}

const recvFlags = cq.FlagRecv | cq.FlagMsg

func main() {
	path := flag.String("f", "", "shared-memory file the producer creates")
	batch := flag.Int("b", 32, "entries per Read")
	check := flag.Bool("k", false, "digest every converted field (for the Go test)")
	timeout := flag.Float64("t", 20, "seconds to wait for the producer")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the run to this file (for go tool pprof)")
	local := flag.Bool("l", false, "local mode: no producer, fill each lap in this thread (untimed) and time the reads")
	localN := flag.Int("n", 4096, "ring entries in local mode")
	localCount := flag.Uint64("c", 2000000, "completions in local mode (rounded up to whole laps)")
	localLayout := flag.String("L", "sim", "ring layout in local mode: sim, packed or split")
	single := flag.Bool("s", false, "SingleThreaded CQ and single-threaded Table (no lock per read or post)")
	flag.Parse()
	layout := -1
	for i, name := range layoutNames {
		if name == *localLayout {
			layout = i
		}
	}
	if (*path == "") == !*local || *batch < 1 || layout < 0 {
		flag.Usage()
		os.Exit(2)
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "goreader:", err)
			os.Exit(1)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "goreader: cpu profile:", err)
			os.Exit(1)
		}
		defer func() {
			pprof.StopCPUProfile()
			_ = f.Close()
		}()
	}
	var s *shm
	var err error
	if *local {
		s, err = newLocal(*localN, *localCount, uint32(layout))
	} else {
		s, err = openShm(*path, time.Duration(*timeout*float64(time.Second)))
	}
	if err == nil {
		err = run(s, *batch, *check, *single, time.Duration(*timeout*float64(time.Second)))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "goreader:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

// source makes the ring source for s's layout and adds it to c.
func source(s *shm, c *cq.CQ) (*ring.RingSource, error) {
	n := s.entries
	win := doorbell.NewWindow(s.mem[:ctrlSize])
	cons, err := win.Reg32(offConsumer)
	if err != nil {
		return nil, err
	}
	cfg := ring.RingConfig{Mem: s.ring(), Regs: ring.RingRegs{Doorbell: doorbell.NewDoorbell(cons)}}
	switch s.layout {
	case layoutSim:
		cfg.Layout, cfg.Codes = qpsim.Layout(n), qpsim.Codes()
		if cfg.Regs.Overrun, err = win.Reg32(offOverrun); err != nil {
			return nil, err
		}
		cfg.Regs.OverrunMask = 1
	case layoutPacked:
		cfg.Layout = virtio.PackedLayout(n)
	case layoutSplit:
		cfg.Layout = virtio.SplitLayout(n)
		cfg.Mem = s.ring()[splitHeader:]
		if cfg.Regs.Producer, err = doorbell.NewWindow(s.ring()[:splitHeader]).Reg32(0); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("layout %d", s.layout)
	}
	if s.layout != layoutSim {
		// The benchmark's producer learns free slots from the count.
		cfg.Layout.Doorbell = ring.DoorbellCount
	}
	src, err := ring.NewRingSource(cfg)
	if err != nil {
		return nil, err
	}
	if s.layout != layoutSim {
		return src, nil // read by the driver's batch read, not a CQ
	}
	return src, c.Driver().AddSource(src)
}

func run(s *shm, batch int, check, single bool, timeout time.Duration) error {
	defer s.close()
	abort := s.p32(offAbort)
	fail := func(err error) error {
		atomic.StoreUint32(abort, 1)
		return err
	}
	if batch > s.slack {
		return fail(fmt.Errorf("batch %d above the producer's slack %d", batch, s.slack))
	}
	n := s.entries

	c, err := cq.New(cq.Attr{Size: n, Format: cq.FormatData, SingleThreaded: single}, qpsim.Limits())
	if err != nil {
		return fail(err)
	}
	defer c.Close()
	if c.Attr().Size != n {
		return fail(fmt.Errorf("CQ of %d entries for a ring of %d", c.Attr().Size, n))
	}
	src, err := source(s, c)
	if err != nil {
		return fail(err)
	}
	// Ids are the slot index (log2(N) id bits, no generation), so the
	// producer, which completes ids in sequence, can name them.
	newTable := ring.NewTable
	if single {
		newTable = ring.NewSingleThreadedTable
	}
	tab, err := newTable(n, bits.TrailingZeros(uint(n)))
	if err != nil {
		return fail(err)
	}
	if err := src.BindTable(0, tab); err != nil {
		return fail(err)
	}
	bufs := make([]rxBuf, n)
	for i := range bufs {
		bufs[i] = rxBuf{idx: uint32(i), addr: bufBase + uintptr(i)*postLen}
		id, err := tab.Post(ring.Op{Context: &bufs[i], Buf: bufs[i].addr, Len: postLen, Flags: recvFlags})
		if err != nil {
			return fail(err)
		}
		if id != uint32(i) {
			return fail(fmt.Errorf("initial post %d got id %d", i, id))
		}
	}
	ents := make([]cq.Entry, batch)
	read := c.Read
	if s.layout != layoutSim {
		// The drivers' read: one batch read of the ring, then one write
		// of the caller's record per completion.
		cs := make([]ring.Completion, batch)
		read = func(ents []cq.Entry) (int, error) {
			k := src.NextBatch(cs[:len(ents)])
			src.Publish()
			if k == 0 {
				return 0, cq.ErrAgain
			}
			for i := range cs[:k] {
				c := &cs[i]
				if c.Err != 0 {
					return 0, fmt.Errorf("refused entry at %d: %v", c.Pos, c.Prov)
				}
				ents[i] = cq.Entry{Context: c.Context, Flags: c.Flags, Len: c.Len, Buf: c.Buf}
			}
			return k, nil
		}
	}

	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	atomic.StoreUint32(s.p32(offReaderReady), 1)

	var seq, reads, empty uint64
	digest := uint64(0xcbf29ce484222325)
	var timed time.Duration
	lapped := s.mode != modeStream // filled, local: timed lap by lap
	laps := uint64(1)
	if lapped {
		laps = s.total / uint64(n)
	}
	deadline := time.Now().Add(timeout)
	t0 := time.Now()
	for lap := uint64(0); lap < laps; lap++ {
		end := s.total
		if lapped {
			end = (lap + 1) * uint64(n)
		}
		switch s.mode {
		case modeLocal:
			s.fill(lap*uint64(n), end)
			t0 = time.Now()
		case modeFilled:
			for spins := 0; atomic.LoadUint64(s.p64(offProduced)) < end; spins++ {
				if spins&4095 == 4095 {
					if atomic.LoadUint32(abort) != 0 {
						return errors.New("the producer gave up")
					}
					if time.Now().After(deadline) {
						return fail(fmt.Errorf("timed out waiting for lap %d", lap))
					}
				}
			}
			t0 = time.Now()
		}
		for seq < end {
			k, err := read(ents)
			reads++
			if err != nil {
				if err != cq.ErrAgain {
					return fail(readError(c, seq, err))
				}
				empty++
				if empty&65535 == 0 {
					if atomic.LoadUint32(abort) != 0 {
						return errors.New("the producer gave up")
					}
					if time.Now().After(deadline) {
						return fail(fmt.Errorf("timed out at completion %d", seq))
					}
				}
				continue
			}
			for i := range ents[:k] {
				e := &ents[i]
				b := e.Context.(*rxBuf)
				if s.layout == layoutSim && e.Data != seq ||
					s.layout != layoutSim && (b.idx != uint32(seq)&uint32(n-1) || e.Len != int(byteLen(seq))) {
					return fail(fmt.Errorf("out of order at completion %d: data %d, buffer %d, len %d", seq, e.Data, b.idx, e.Len))
				}
				if check {
					digest = fnv(digest, uint64(b.idx))
					digest = fnv(digest, uint64(e.Flags))
					digest = fnv(digest, uint64(e.Len))
					digest = fnv(digest, uint64(e.Buf-bufBase))
					digest = fnv(digest, e.Data)
				}
				seq++
				if lapped {
					continue // re-posted after the timed reads
				}
				if _, err := tab.Post(ring.Op{Context: b, Buf: b.addr, Len: postLen, Flags: recvFlags}); err != nil {
					return fail(fmt.Errorf("re-post at completion %d: %w", seq, err))
				}
			}
		}
		if lapped {
			timed += time.Since(t0)
			// The lap completed ids 0..N-1 in order (data checked
			// above), so the buffers go back in that order.
			for i := range bufs {
				b := &bufs[i]
				if _, err := tab.Post(ring.Op{Context: b, Buf: b.addr, Len: postLen, Flags: recvFlags}); err != nil {
					return fail(fmt.Errorf("re-post of buffer %d after lap %d: %w", i, lap, err))
				}
			}
			atomic.StoreUint32(s.p32(offLapsDone), uint32(lap+1))
			deadline = time.Now().Add(timeout)
		}
	}
	if !lapped {
		timed = time.Since(t0)
	}
	runtime.ReadMemStats(&m1)
	mode := modeName(s.mode)
	dig := "-"
	if check {
		dig = fmt.Sprintf("%016x", digest)
	}
	locking := "mutex"
	if single {
		locking = "none"
	}
	fmt.Printf("reader=go layout=%s locking=%s mode=%s batch=%d entries=%d completions=%d ns_per_completion=%.3f reads=%d empty_reads=%d allocs_per_completion=%.4f order=ok digest=%s loop=%s\n",
		layoutNames[s.layout], locking, mode, batch, n, seq, float64(timed.Nanoseconds())/float64(seq), reads, empty,
		float64(m1.Mallocs-m0.Mallocs)/float64(seq), dig, loopName(s, src))
	return nil
}

// loopName is the loop that read the ring: the CQ's (ring.RingSource.Loop)
// for sim's, the drivers' batch read for the virtio layouts.
func loopName(s *shm, src *ring.RingSource) string {
	switch {
	case s.layout == layoutSim:
		return src.Loop()
	case src.Batched():
		return "NextBatch"
	}
	return "NextBatch-generic"
}

// readError describes a failed Read: the error completion at the head, or
// the overrun.
func readError(c *cq.CQ, seq uint64, err error) error {
	if errors.Is(err, cq.ErrAvail) {
		var ee cq.ErrEntry
		if e := c.ReadErr(&ee); e != nil {
			return fmt.Errorf("read at completion %d: %w (ReadErr: %v)", seq, err, e)
		}
		return fmt.Errorf("read at completion %d: error completion: %s", seq, c.StrError(ee.ProvErrno, ee.ErrData))
	}
	return fmt.Errorf("read at completion %d: %w", seq, err)
}

// modeName names a mode as reader.c does.
func modeName(m uint32) string {
	switch m {
	case modeFilled:
		return "filled"
	case modeStream:
		return "stream"
	case modeLocal:
		return "local"
	}
	return "?"
}

// fnv folds x into an FNV-1a-style digest, as reader.c does.
func fnv(h, x uint64) uint64 { return (h ^ x) * 0x100000001b3 }
