package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/vfnic/vfnic/lcore"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/pci"
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
	fs := newFlags("fwd", "[flags] PCI-ADDR-A PCI-ADDR-B")
	var df deviceFlags
	df.register(fs)
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
	as, err := parseAddrs(fs.Args())
	if err != nil {
		return err
	}
	if as[0] == as[1] {
		return fmt.Errorf("%w: %s twice: name two ports", errUsage, as[0])
	}
	core, devA, err := df.openAt(ctx, fs.Arg(0), nic.Config{Promiscuous: true}, o.err)
	if err != nil {
		return err
	}
	defer core.Close() // after the devices
	defer devA.Close()
	if df.force {
		if w := forceWarning(pci.Sysfs{}, nil, as[1]); w != "" {
			fmt.Fprintln(o.err, w)
		}
	}
	devB, err := openNIC(ctx, fs.Arg(1), nic.Config{Promiscuous: true, QueueSize: df.queueSize, BufferSize: df.bufferSize, Force: df.force})
	if err != nil {
		return err
	}
	defer devB.Close()
	out := df.human(o)
	describe(out, devA)
	describe(out, devB)
	f := &forwarder{swap: *mode == fwdMACSwap}
	for i, d := range []nic.Device{devA, devB} {
		rx, err := d.Rx(0)
		if err != nil {
			return err
		}
		tx, err := d.Tx(0)
		if err != nil {
			return err
		}
		if err := fillRx(rx); err != nil {
			return err
		}
		f.ports[i] = fwdPort{addr: as[i].String(), rx: rx, tx: tx}
	}
	p := newProgress(out, devA, df.interval, f.line)
	p.promisc = true
	fmt.Fprintf(out, "fwd: %s forwarding between %s and %s, %s, %s\n", *mode, as[0], as[1], stopNote(0, df.duration), coreNote(core))
	ctx, cancel := df.withDuration(ctx)
	defer cancel()
	if err := f.run(ctx, core, p); err != nil {
		return removed(err, f.ports[0].rx)
	}
	sb := devB.Stats()
	fmt.Fprintf(out, "fwd: %s rx %d frames, tx %d frames\n", as[1], sb.Rx.Packets, sb.Tx.Packets)
	return p.summary("fwd", df.jsonOut(o), f.details(*mode, sb))
}

// fwdPort is one side of the forwarding, with what went out of it.
type fwdPort struct {
	addr string
	rx   nic.RxQueue
	tx   nic.TxQueue
	// Written on the core's thread; read by the live line there and by
	// the summary once the core stopped.
	forwarded, dropped, rxErrors, txErrors uint64
}

// forwarder is fwd's loop: a Handler per receive queue that sends each
// frame out of the other port, and one per transmit queue for its
// completions.
type forwarder struct {
	swap  bool
	ports [2]fwdPort
}

func (f *forwarder) line() string {
	a, b := &f.ports[0], &f.ports[1]
	return fmt.Sprintf("%s->%s %d (dropped %d), %s->%s %d (dropped %d)", a.addr, b.addr, b.forwarded, b.dropped,
		b.addr, a.addr, a.forwarded, a.dropped)
}

func (f *forwarder) details(mode string, sb nic.Stats) map[string]any {
	ports := make([]map[string]any, 2)
	for i := range f.ports {
		pt := &f.ports[i]
		ports[i] = map[string]any{"address": pt.addr, "sent": pt.forwarded, "tx_dropped": pt.dropped,
			"rx_errors": pt.rxErrors, "tx_errors": pt.txErrors}
	}
	ports[1]["rx_frames"], ports[1]["tx_frames"] = sb.Rx.Packets, sb.Tx.Packets
	return map[string]any{"forward": mode, "ports": ports}
}

// run forwards on core until ctx ends or an operation fails.
func (f *forwarder) run(ctx context.Context, core *lcore.Core, p *progress) error {
	for i := range f.ports {
		in, out := &f.ports[i], &f.ports[1-i]
		if err := core.AddQueue(in.rx, func(_ nic.Queue, batch []nic.Completion) error {
			return f.forward(in, out, batch)
		}); err != nil {
			return err
		}
		if err := core.AddQueue(out.tx, func(_ nic.Queue, batch []nic.Completion) error {
			out.txErrors += uint64(failures(batch))
			return nil
		}); err != nil {
			return err
		}
	}
	return runCore(ctx, core, p)
}

// forward sends each frame of batch, received on in, out of out, and
// posts its buffer again. A frame the other side's ring has no room for
// is dropped and counted, as testpmd does: waiting would stall both ways.
func (f *forwarder) forward(in, out *fwdPort, batch []nic.Completion) error {
	refill := false
	for i := range batch {
		c := &batch[i]
		if c.Err != nil {
			in.rxErrors++ // the driver took the buffer back into its pool
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
			out.forwarded++
		case errors.Is(err, nic.ErrFull), errors.Is(err, nic.ErrFrameSize):
			out.dropped++
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
