package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/vfnic/vfnic/nic"
	_ "github.com/vfnic/vfnic/nic/igb"    // registers the igb (Intel 82576) driver
	_ "github.com/vfnic/vfnic/nic/virtio" // registers the virtio-net driver
)

// deviceFlags are the flags every traffic command takes.
type deviceFlags struct {
	queueSize int
	force     bool
	interval  time.Duration
	duration  time.Duration
}

func (d *deviceFlags) register(fs *flag.FlagSet) {
	fs.IntVar(&d.queueSize, "queue-size", 0, "descriptors per ring (0: driver default)")
	fs.BoolVar(&d.force, "force", false, "take the NIC even if its kernel interface is up or has addresses")
	fs.DurationVar(&d.interval, "progress", time.Second, "interval between progress lines (0: none)")
	fs.DurationVar(&d.duration, "duration", 0, "stop after this long (0: until done or interrupted)")
}

// openOne parses the single PCI address argument and opens the NIC there.
func (d *deviceFlags) openOne(ctx context.Context, fs *flag.FlagSet) (nic.Device, error) {
	if fs.NArg() != 1 {
		return nil, fmt.Errorf("%w: name one PCI address (see 'vfnic list')", errUsage)
	}
	if _, err := parseAddrs(fs.Args()); err != nil {
		return nil, err
	}
	return nic.Open(ctx, fs.Arg(0), nic.Config{QueueSize: d.queueSize, Force: d.force})
}

// withDuration bounds ctx by -duration when it is set.
func (d *deviceFlags) withDuration(ctx context.Context) (context.Context, context.CancelFunc) {
	if d.duration > 0 {
		return context.WithTimeout(ctx, d.duration)
	}
	return context.WithCancel(ctx)
}

// fillRx posts every free receive buffer and hands them to the device.
func fillRx(rx nic.RxQueue) error {
	for {
		err := rx.PostRecv(nil)
		if errors.Is(err, nic.ErrFull) {
			return rx.Flush()
		}
		if err != nil {
			return err
		}
	}
}

// reapTx reads send completions so their descriptors can be used again
// and returns how many failed.
func reapTx(tx nic.TxQueue, scratch []nic.Completion) (failed int) {
	for {
		n := tx.Poll(scratch)
		failed += failures(scratch[:n])
		if n < len(scratch) {
			return failed
		}
	}
}

// failures counts the error completions among cs.
func failures(cs []nic.Completion) int {
	n := 0
	for _, c := range cs {
		if c.Err != nil {
			n++
		}
	}
	return n
}

// progress prints a line of rates and totals every interval, and the
// summary at the end.
type progress struct {
	out      io.Writer
	dev      nic.Device
	start    time.Time
	last     time.Time
	lastRx   uint64
	lastTx   uint64
	extra    func() string
	interval time.Duration
}

func newProgress(out io.Writer, dev nic.Device, interval time.Duration, extra func() string) *progress {
	now := time.Now()
	return &progress{out: out, dev: dev, start: now, last: now, interval: interval, extra: extra}
}

// tick prints a progress line when the interval has passed.
func (p *progress) tick() {
	if p.interval <= 0 || time.Since(p.last) < p.interval {
		return
	}
	now := time.Now()
	s := p.dev.Stats()
	dt := now.Sub(p.last).Seconds()
	fmt.Fprintf(p.out, "%6.1fs  rx %8.0f fr/s  tx %8.0f fr/s  totals rx %d tx %d  %s\n",
		now.Sub(p.start).Seconds(), float64(s.Rx.Packets-p.lastRx)/dt, float64(s.Tx.Packets-p.lastTx)/dt,
		s.Rx.Packets, s.Tx.Packets, p.extra())
	p.last, p.lastRx, p.lastTx = now, s.Rx.Packets, s.Tx.Packets
}

// summary prints totals, average rates and the driver's counters.
func (p *progress) summary(what string) {
	s := p.dev.Stats()
	el := time.Since(p.start).Seconds()
	fmt.Fprintf(p.out, "%s: %.2fs, rx %d frames (%d bytes, %.0f fr/s), tx %d frames (%d bytes, %.0f fr/s), %s\n",
		what, el, s.Rx.Packets, s.Rx.Bytes, float64(s.Rx.Packets)/el, s.Tx.Packets, s.Tx.Bytes, float64(s.Tx.Packets)/el, p.extra())
	fmt.Fprintf(p.out, "%s: completions rx %d tx %d, errors rx %d tx %d, interrupts rx %d tx %d, doorbells rx %d tx %d (suppressed %d)\n",
		what, s.Rx.Packets+s.Rx.Errors, s.Tx.Packets+s.Tx.Errors, s.Rx.Errors, s.Tx.Errors,
		s.Rx.Interrupts, s.Tx.Interrupts, s.Rx.Notifies, s.Tx.Notifies, s.Rx.Suppressed+s.Tx.Suppressed)
}

// describe prints what was opened.
func describe(out io.Writer, dev nic.Device) {
	in := dev.Info()
	fmt.Fprintf(out, "%s: %s (%s driver), MAC %s, %d queue pair(s) of %d descriptors, %d MSI-X vectors, features %v\n",
		in.Address, in.Model, in.Driver, in.MAC, in.QueuePairs, in.QueueSize, in.Vectors, in.Features)
}
