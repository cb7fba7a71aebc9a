package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"
	"github.com/vfnic/vfnic/nic"
)

func runCapture(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlags("capture", "-w FILE [flags] PCI-ADDR")
	var df deviceFlags
	df.register(fs)
	file := fs.String("w", "", "pcap file to write")
	count := fs.Int("count", 0, "stop after this many frames (0: until -duration or interrupted)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *file == "" {
		return fmt.Errorf("%w: -w FILE is required", errUsage)
	}
	if *count < 0 {
		return fmt.Errorf("%w: -count %d", errUsage, *count)
	}
	dev, err := df.openOne(ctx, fs)
	if err != nil {
		return err
	}
	defer dev.Close()
	f, err := os.Create(*file)
	if err != nil {
		return err
	}
	defer f.Close()
	bw := bufio.NewWriterSize(f, 1<<20)
	w := pcapgo.NewWriter(bw)
	if err := w.WriteFileHeader(65536, layers.LinkTypeEthernet); err != nil {
		return err
	}
	ctx, cancel := df.withDuration(ctx)
	defer cancel()
	describe(out, dev)
	rx, err := dev.Rx(0)
	if err != nil {
		return err
	}
	if err := fillRx(rx); err != nil {
		return err
	}
	var written, errs uint64
	p := newProgress(out, dev, df.interval, func() string {
		return fmt.Sprintf("written %d, bad completions %d", written, errs)
	})
	fmt.Fprintf(out, "capture: writing frames to %s\n", *file)
	comps := make([]nic.Completion, 64)
	for (*count == 0 || written < uint64(*count)) && ctx.Err() == nil {
		n, err := rx.SRead(ctx, comps, 1, 100*time.Millisecond)
		if err != nil && !errors.Is(err, nic.ErrTimeout) && ctx.Err() == nil {
			return err
		}
		now := time.Now()
		for i := range comps[:n] {
			c := &comps[i]
			if c.Err != nil {
				errs++
				continue
			}
			if *count == 0 || written < uint64(*count) {
				ci := gopacket.CaptureInfo{Timestamp: now, CaptureLength: len(c.Data), Length: len(c.Data)}
				if err := w.WritePacket(ci, c.Data); err != nil {
					return err
				}
				written++
			}
			if err := rx.Repost(c.Buf, nil); err != nil {
				return err
			}
		}
		if n > 0 {
			if err := rx.Flush(); err != nil {
				return err
			}
		}
		p.tick()
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	p.summary("capture")
	return f.Close()
}
