package main

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/vfnic/vfnic/lcore"
	"github.com/vfnic/vfnic/nic"
)

// Forwarding modes, as testpmd's: io passes frames on untouched; macswap
// swaps their source and destination MACs first.
const (
	fwdIO      = "io"
	fwdMACSwap = "macswap"
)

// runFwd forwards every frame received on one port out of the other, both
// ways, on one polling core: testpmd's io and macswap forwarding, l2fwd
// without the MAC rewrite.
func runFwd(ctx context.Context, args []string, o stdio) error {
	fs := newFlags("fwd", "[flags] DEVICE-A DEVICE-B")
	var df deviceFlags
	df.register(fs)
	df.registerQueues(fs, "queue i of one port forwards to queue i of the other, both ways, on core i; each NIC spreads its flows over them (RSS)")
	mode := fs.String("forward", fwdIO, "what is done to a frame before it goes out: `io|macswap` (io: nothing; macswap: swap its MACs)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *mode != fwdIO && *mode != fwdMACSwap {
		return fmt.Errorf("%w: -forward %q: want io or macswap", errUsage, *mode)
	}
	if fs.NArg() != 2 {
		return fmt.Errorf("%w: name two PCI addresses: the ports to forward between (see 'vfnic list')", errUsage)
	}
	ds, err := parseDevices(fs.Args())
	if err != nil {
		return err
	}
	if ds[0].String() == ds[1].String() {
		return fmt.Errorf("%w: %s twice: name two ports", errUsage, ds[0])
	}
	core, devA, err := df.openAt(ctx, fs.Arg(0), nic.Config{Promiscuous: true}, o.err)
	if err != nil {
		return err
	}
	defer core.Close() // after the devices
	defer df.cleanup() // after the devices
	defer devA.Close()
	if df.force && ds[1].pci { // a host interface stays the kernel's
		df.kernel.take(ds[1].addr, o.err)
	}
	nq := df.nqueues()
	cfgB := nic.Config{Promiscuous: true, QueueSize: df.queueSize, BufferSize: df.bufferSize, Force: df.force}
	if nq > 1 {
		cfgB.QueuePairs = nq
	}
	devB, err := openNIC(ctx, fs.Arg(1), cfgB)
	if err != nil {
		return err
	}
	defer devB.Close()
	if n := devB.QueuePairs(); n < nq {
		return fmt.Errorf("%w: -queues %d: %s has %d queue pair(s)", errUsage, nq, ds[1], n)
	}
	out := df.human(o)
	describe(out, devA)
	describe(out, devB)
	f := &forwarder{swap: *mode == fwdMACSwap}
	for q := range nq {
		var pair [2]*fwdPort
		for i, d := range []nic.Device{devA, devB} {
			rx, err := d.Rx(q)
			if err != nil {
				return err
			}
			tx, err := d.Tx(q)
			if err != nil {
				return err
			}
			if err := fillRx(rx); err != nil {
				return err
			}
			pair[i] = &fwdPort{addr: ds[i].String(), rx: rx, tx: tx}
		}
		f.queues = append(f.queues, pair)
	}
	p := newProgress(out, devA, df.interval, f.line)
	p.promisc = true
	where := coreNote(core)
	if nq > 1 {
		where = fmt.Sprintf("%d queue pairs, each %s", nq, where)
	}
	fmt.Fprintf(out, "fwd: %s forwarding between %s and %s, %s, %s\n", *mode, ds[0], ds[1], stopNote(0, df.duration), where)
	ctx, cancel := df.withDuration(ctx)
	defer cancel()
	if err := f.runOn(ctx, df.cores(core), p); err != nil {
		return removed(err, f.queues[0][0].rx)
	}
	sb := devB.Stats()
	fmt.Fprintf(out, "fwd: %s rx %d frames, tx %d frames\n", ds[1], sb.Rx.Packets, sb.Tx.Packets)
	return p.summary("fwd", df.jsonOut(o), f.details(*mode, sb))
}

// fwdPort is one queue pair of one side of the forwarding, with what went
// out of it.
type fwdPort struct {
	addr string
	rx   nic.RxQueue
	tx   nic.TxQueue
	// Written on the queue's core (once per batch); read by the live line
	// on queue 0's core and by the summary once the cores stopped.
	forwarded, dropped, rxErrors, txErrors atomic.Uint64
}

// forwarder is fwd's loop: a Handler per receive queue that sends each
// frame out of the other port's queue of the same number, and one per
// transmit queue for its completions.
type forwarder struct {
	swap bool
	// queues[i] are queue pair i of both ports, polled by core i.
	queues [][2]*fwdPort
}

// side sums one side's counters over the queues.
func (f *forwarder) side(i int) (forwarded, dropped, rxErrors, txErrors uint64) {
	for _, q := range f.queues {
		pt := q[i]
		forwarded, dropped = forwarded+pt.forwarded.Load(), dropped+pt.dropped.Load()
		rxErrors, txErrors = rxErrors+pt.rxErrors.Load(), txErrors+pt.txErrors.Load()
	}
	return
}

func (f *forwarder) line() string {
	a, b := f.queues[0][0].addr, f.queues[0][1].addr
	af, ad, _, _ := f.side(0)
	bf, bd, _, _ := f.side(1)
	return fmt.Sprintf("%s->%s %d (dropped %d), %s->%s %d (dropped %d)", a, b, bf, bd, b, a, af, ad)
}

func (f *forwarder) details(mode string, sb nic.Stats) map[string]any {
	ports := make([]map[string]any, 2)
	for i := range ports {
		fw, dr, rxe, txe := f.side(i)
		ports[i] = map[string]any{"address": f.queues[0][i].addr, "sent": fw, "tx_dropped": dr,
			"rx_errors": rxe, "tx_errors": txe}
		if len(f.queues) > 1 {
			per := make([]map[string]any, len(f.queues))
			for q, pair := range f.queues {
				pt := pair[i]
				per[q] = map[string]any{"queue": q, "sent": pt.forwarded.Load(), "tx_dropped": pt.dropped.Load(),
					"rx_errors": pt.rxErrors.Load(), "tx_errors": pt.txErrors.Load()}
			}
			ports[i]["queues"] = per
		}
	}
	ports[1]["rx_frames"], ports[1]["tx_frames"] = sb.Rx.Packets, sb.Tx.Packets
	return map[string]any{"forward": mode, "ports": ports}
}

// run forwards on core until ctx ends or an operation fails.
func (f *forwarder) run(ctx context.Context, core *lcore.Core, p *progress) error {
	return f.runOn(ctx, []*lcore.Core{core}, p)
}

// runOn forwards queue pair i of both ports on cores[i].
func (f *forwarder) runOn(ctx context.Context, cores []*lcore.Core, p *progress) error {
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	for q, pair := range f.queues {
		for i := range pair {
			in, out := pair[i], pair[1-i]
			if err := cores[q].AddQueue(in.rx, func(_ nic.Queue, batch []nic.Completion) error {
				return f.forward(in, out, batch)
			}); err != nil {
				return err
			}
			if err := cores[q].AddQueue(out.tx, func(_ nic.Queue, batch []nic.Completion) error {
				if n := failures(batch); n > 0 {
					out.txErrors.Add(uint64(n))
				}
				return nil
			}); err != nil {
				return err
			}
		}
	}
	return runCores(ctx, stop, cores, p)
}

// forward sends each frame of batch, received on in, out of out, and
// posts its buffer again. A frame the other side's ring has no room for
// is dropped and counted, as testpmd does: waiting would stall both ways.
func (f *forwarder) forward(in, out *fwdPort, batch []nic.Completion) error {
	refill := false
	var sent, dropped, bad uint64
	defer func() {
		// Once per batch: the counters are read on another core.
		out.forwarded.Add(sent)
		out.dropped.Add(dropped)
		in.rxErrors.Add(bad)
	}()
	for i := range batch {
		c := &batch[i]
		if c.Err != nil {
			bad++ // the driver took the buffer back into its pool
			refill = true
			continue
		}
		data := c.Data
		if f.swap && len(data) >= 12 {
			var m [6]byte
			copy(m[:], data[0:6])
			copy(data[0:6], data[6:12])
			copy(data[6:12], m[:])
		}
		err := out.tx.Send(data, nil)
		switch {
		case err == nil:
			sent++
		case errors.Is(err, nic.ErrFull), errors.Is(err, nic.ErrFrameSize):
			dropped++
		default:
			return err
		}
		if err := in.rx.Repost(c.Buf, nil); err != nil {
			return err
		}
	}
	if refill {
		return fillRx(in.rx)
	}
	return nil
}
