package main

import (
	"context"
	"fmt"

	"github.com/vfnic/vfnic/lcore"
	"github.com/vfnic/vfnic/nic"
)

// runSink receives frames and drops them, counting: the receive side of a
// rate measurement, what DPDK testpmd's rxonly forwarding mode does (each
// buffer goes straight back to the ring, nothing is copied or parsed).
func runSink(ctx context.Context, args []string, o stdio) error {
	fs := newFlags("sink", "[flags] PCI-ADDR")
	var df deviceFlags
	df.register(fs)
	count := fs.Int("count", 0, "stop after this many frames (0: until -duration or interrupted)")
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
	defer dev.Close()
	out := df.human(o)
	describe(out, dev)
	rx, err := dev.Rx(0)
	if err != nil {
		return err
	}
	if err := fillRx(rx); err != nil {
		return err
	}
	s := &sink{rx: rx, count: uint64(*count)}
	p := newProgress(out, dev, df.interval, s.line)
	p.promisc = !noPromisc
	fmt.Fprintf(out, "sink: receiving and dropping frames, %s, %s\n", stopNote(*count, df.duration), coreNote(core))
	ctx, cancel := df.withDuration(ctx)
	defer cancel()
	if err := s.run(ctx, core, p); err != nil {
		return removed(err, rx)
	}
	return p.summary("sink", df.jsonOut(o), map[string]any{"received": s.received, "errors": s.errors})
}

// sink is the sink command's Handler: count, post the buffer again.
type sink struct {
	rx    nic.RxQueue
	count uint64 // frames to receive, 0 for no limit

	// Written on the core's thread; read by the summary once it stopped.
	received, errors uint64
}

func (s *sink) line() string {
	return fmt.Sprintf("received %d, error completions %d", s.received, s.errors)
}

func (s *sink) run(ctx context.Context, core *lcore.Core, p *progress) error {
	ctx, done := context.WithCancel(ctx)
	defer done()
	err := core.AddQueue(s.rx, func(_ nic.Queue, batch []nic.Completion) error {
		refill := false
		for i := range batch {
			c := &batch[i]
			if c.Err != nil {
				// The driver took the buffer back into its pool.
				s.errors++
				refill = true
				continue
			}
			s.received++
			if err := s.rx.Repost(c.Buf, nil); err != nil {
				return err
			}
		}
		if s.count > 0 && s.received >= s.count {
			done()
		}
		if refill {
			return fillRx(s.rx)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return runCore(ctx, core, p)
}
