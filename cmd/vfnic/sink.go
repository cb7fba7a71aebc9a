package main

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/vfnic/vfnic/lcore"
	"github.com/vfnic/vfnic/nic"
)

// maxQueues bounds -queues: more than any supported NIC offers.
const maxQueues = 64

// runSink receives frames and drops them, counting: the receive side of a
// rate measurement, what DPDK testpmd's rxonly forwarding mode does (each
// buffer goes straight back to the ring, nothing is copied or parsed).
// With -queues N it receives on N queues, each polled by a core of its
// own, and the NIC spreads the flows over them (RSS).
func runSink(ctx context.Context, args []string, o stdio) error {
	fs := newFlags("sink", "[flags] DEVICE")
	var df deviceFlags
	df.register(fs)
	count := fs.Int("count", 0, "stop after this many frames, on all queues (0: until -duration or interrupted)")
	df.registerQueues(fs, "the NIC spreads flows over them (RSS)")
	var noPromisc bool
	fs.BoolVar(&noPromisc, "p", false, "do not put the NIC in promiscuous mode: only frames for its MAC, broadcast and multicast")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *count < 0 {
		return fmt.Errorf("%w: -count %d is negative", errUsage, *count)
	}
	core, dev, err := df.open(ctx, fs, nic.Config{Promiscuous: !noPromisc}, o.err)
	if err != nil {
		return err
	}
	defer core.Close() // after the device
	defer df.cleanup() // after the device
	defer dev.Close()
	queues := df.nqueues()
	extra := df.extra
	out := df.human(o)
	describe(out, dev)
	s := &sink{count: uint64(*count)}
	for i := range queues {
		rx, err := dev.Rx(i)
		if err != nil {
			return err
		}
		if err := fillRx(rx); err != nil {
			return err
		}
		s.queues = append(s.queues, &sinkQueue{rx: rx})
	}
	p := newProgress(out, dev, df.interval, s.line)
	p.promisc = !noPromisc
	where := coreNote(core)
	if len(extra) > 0 {
		where = fmt.Sprintf("%d queues, each %s", queues, where)
	}
	fmt.Fprintf(out, "sink: receiving and dropping frames, %s, %s\n", stopNote(*count, df.duration), where)
	ctx, cancel := df.withDuration(ctx)
	defer cancel()
	if err := s.run(ctx, df.cores(core), p); err != nil {
		return removed(err, s.queues[0].rx)
	}
	return p.summary("sink", df.jsonOut(o), s.details(extra))
}

// sink is the sink command's receive loop: a Handler per queue, each on
// its core, that counts and posts the buffer again.
type sink struct {
	count  uint64 // frames to receive on all queues, 0 for no limit
	total  atomic.Uint64
	queues []*sinkQueue
}

// sinkQueue is one queue's counters: written by its core, read by the
// live line on another core, hence atomic (updated once per batch).
type sinkQueue struct {
	rx               nic.RxQueue
	received, errors atomic.Uint64
}

func (s *sink) line() string {
	var r, e uint64
	per := make([]string, len(s.queues))
	for i, q := range s.queues {
		n := q.received.Load()
		r, e = r+n, e+q.errors.Load()
		per[i] = fmt.Sprint(n)
	}
	l := fmt.Sprintf("received %d, error completions %d", r, e)
	if len(s.queues) > 1 {
		l += ", per queue [" + strings.Join(per, " ") + "]"
	}
	return l
}

func (s *sink) details(cores []*lcore.Core) map[string]any {
	var r, e uint64
	qs := make([]map[string]any, len(s.queues))
	for i, q := range s.queues {
		n, ne := q.received.Load(), q.errors.Load()
		r, e = r+n, e+ne
		qs[i] = map[string]any{"queue": i, "received": n, "errors": ne}
		if i > 0 {
			qs[i]["core"] = summarizeCore(cores[i-1])
		}
	}
	return map[string]any{"received": r, "errors": e, "queues": qs}
}

// run receives on each queue with its core (the first runs the live
// lines) until count frames came, ctx ends or a core fails.
func (s *sink) run(ctx context.Context, cores []*lcore.Core, p *progress) error {
	ctx, done := context.WithCancel(ctx)
	defer done()
	for i, q := range s.queues {
		err := cores[i].AddQueue(q.rx, func(_ nic.Queue, batch []nic.Completion) error {
			return s.handle(q, batch, done)
		})
		if err != nil {
			return err
		}
	}
	return runCores(ctx, done, cores, p)
}

func (s *sink) handle(q *sinkQueue, batch []nic.Completion, done func()) error {
	refill := false
	var got, bad uint64
	// The buffers go back in bursts, one lock each (RepostBurst).
	var bufs [64]uintptr
	n := 0
	for i := range batch {
		c := &batch[i]
		if c.Err != nil {
			// The driver took the buffer back into its pool.
			bad++
			refill = true
			continue
		}
		got++
		bufs[n] = c.Buf
		if n++; n == len(bufs) {
			if _, err := q.rx.RepostBurst(bufs[:n], nil); err != nil {
				return err
			}
			n = 0
		}
	}
	if n > 0 {
		if _, err := q.rx.RepostBurst(bufs[:n], nil); err != nil {
			return err
		}
	}
	q.received.Add(got)
	q.errors.Add(bad)
	if s.total.Add(got) >= s.count && s.count > 0 {
		done()
	}
	if refill {
		return fillRx(q.rx)
	}
	return nil
}
