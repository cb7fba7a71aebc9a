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
	"github.com/vfnic/vfnic/lcore"
	"github.com/vfnic/vfnic/nic"
)

// defaultSnaplen is tcpdump's default: whole frames, even jumbo ones.
const defaultSnaplen = 262144

func runCapture(ctx context.Context, args []string, o stdio) error {
	fs := newFlags("capture", "-w FILE [flags] PCI-ADDR")
	var df deviceFlags
	df.register(fs)
	file := fs.String("w", "", `pcap file to write (nanosecond timestamps); "-" writes to stdout, human lines then go to stderr`)
	count := fs.Int("count", 0, "stop after writing this many frames (0: until -duration or interrupted)")
	snaplen := fs.Int("snaplen", defaultSnaplen, "bytes of each frame to write (longer frames are truncated, as tcpdump -s)")
	var noPromisc bool
	fs.BoolVar(&noPromisc, "p", false, "do not put the NIC in promiscuous mode (as tcpdump -p): only frames for its MAC, broadcast and multicast")
	fs.BoolVar(&noPromisc, "no-promisc", false, "same as -p")
	if err := parse(fs, args); err != nil {
		return err
	}
	switch {
	case *file == "":
		return fmt.Errorf("%w: -w FILE is required (- for stdout)", errUsage)
	case *count < 0:
		return fmt.Errorf("%w: -count %d is negative", errUsage, *count)
	case *snaplen < nic.MinFrame || *snaplen > defaultSnaplen:
		return fmt.Errorf("%w: -snaplen %d outside [%d, %d]", errUsage, *snaplen, nic.MinFrame, defaultSnaplen)
	}
	human := df.human(o)
	if *file == "-" {
		human = o.err // stdout carries the pcap
		if df.json {
			return fmt.Errorf("%w: -json and -w - both want stdout", errUsage)
		}
	}
	core, dev, err := df.open(ctx, fs, nic.Config{Promiscuous: !noPromisc})
	if err != nil {
		return err
	}
	defer core.Close() // after the device
	defer dev.Close()
	var dst io.Writer = o.out
	var f *os.File
	if *file != "-" {
		if f, err = os.Create(*file); err != nil {
			return err
		}
		defer f.Close()
		dst = f
	}
	bw := bufio.NewWriterSize(dst, 1<<20)
	w := pcapgo.NewWriterNanos(bw)
	if err := w.WriteFileHeader(uint32(*snaplen), layers.LinkTypeEthernet); err != nil {
		return err
	}
	ctx, cancel := df.withDuration(ctx)
	defer cancel()
	describe(human, dev)
	rx, err := dev.Rx(0)
	if err != nil {
		return err
	}
	if err := fillRx(rx); err != nil {
		return err
	}
	cw := &capturer{rx: rx, w: w, bw: bw, count: uint64(*count), snaplen: *snaplen, pipe: *file == "-",
		c: captureCounts{bufFrame: rx.MaxFrame()}}
	p := newProgress(human, dev, df.interval, cw.c.line)
	p.promisc = !noPromisc
	mode := "promiscuous"
	if noPromisc {
		mode = "not promiscuous"
	}
	fmt.Fprintf(human, "capture: writing frames to %s (%s, snap length %d, buffers hold frames of up to %d bytes), %s\n",
		name(*file), mode, *snaplen, cw.c.bufFrame, coreNote(core))
	if err := cw.run(ctx, core, p); err != nil {
		return removed(err, rx)
	}
	if f != nil {
		if err := f.Close(); err != nil {
			return err
		}
	}
	return p.summary("capture", df.jsonOut(o), cw.c.details())
}

// capturer is capture's receive loop: a Handler of a polling core that
// writes each frame to the pcap and posts its buffer again.
type capturer struct {
	rx      nic.RxQueue
	w       *pcapgo.Writer
	bw      *bufio.Writer // under w: flushed when the queue goes idle
	count   uint64        // frames to write, 0 for no limit
	snaplen int
	pipe    bool // the pcap goes to stdout: flush every batch

	// Written on the core's thread; read by the summary once it stopped.
	c   captureCounts
	got int // completions in the current round
}

// run captures on core until count frames are written, ctx ends, or an
// operation fails, and flushes the pcap.
func (cw *capturer) run(ctx context.Context, core *lcore.Core, p *progress) error {
	ctx, done := context.WithCancel(ctx)
	defer done()
	err := core.AddQueue(cw.rx, func(_ nic.Queue, batch []nic.Completion) error {
		cw.got += len(batch)
		return cw.handle(batch, done)
	})
	if err != nil {
		return err
	}
	err = core.AddFunc(func() (int, error) {
		// A reader on a pipe (tshark -r -) sees each batch at once; a file
		// gets what is buffered whenever the queue is idle, as the core
		// polls once more before it sleeps.
		if cw.pipe || cw.got == 0 {
			if err := cw.bw.Flush(); err != nil {
				return 0, err
			}
		}
		cw.got = 0
		return 0, nil
	})
	if err != nil {
		return err
	}
	err = runCore(ctx, core, p)
	return errors.Join(err, cw.bw.Flush())
}

// handle writes a batch of frames, up to count, and posts their buffers
// again; done stops the core once count frames are written.
func (cw *capturer) handle(comps []nic.Completion, done func()) error {
	refill := false
	for i := range comps {
		cp := &comps[i]
		if cp.Err != nil {
			// The driver took the buffer back into its pool.
			cw.c.failed(cp.Err)
			refill = true
			continue
		}
		if cw.count == 0 || cw.c.written < cw.count {
			l := min(len(cp.Data), cw.snaplen)
			ci := gopacket.CaptureInfo{Timestamp: time.Now(), CaptureLength: l, Length: len(cp.Data)}
			if err := cw.w.WritePacket(ci, cp.Data[:l]); err != nil {
				return err
			}
			cw.c.written++
			if l < len(cp.Data) {
				cw.c.truncated++
			}
			if cw.c.written == cw.count {
				done()
			}
		}
		if err := cw.rx.Repost(cp.Buf, nil); err != nil {
			return err
		}
	}
	if refill {
		return fillRx(cw.rx)
	}
	return nil
}

func name(file string) string {
	if file == "-" {
		return "stdout"
	}
	return file
}

// captureCounts are capture's own counters. Frames longer than a receive
// buffer arrive as several error completions (nic.MultiBufferError) and
// are counted once each, with their length, never silently.
type captureCounts struct {
	written, truncated uint64
	tooLong            uint64 // frames longer than a buffer
	tooLongMax         int    // the longest of them, in bytes
	spanBytes          int    // bytes of the frame being counted
	bad                uint64 // other error completions
	bufFrame           int    // the longest frame a buffer holds
}

func (c *captureCounts) failed(err error) {
	var mb *nic.MultiBufferError
	if !errors.As(err, &mb) {
		c.bad++
		return
	}
	if mb.Buffer == 0 {
		c.tooLong++
		c.spanBytes = 0
	}
	c.spanBytes += mb.Bytes
	c.tooLongMax = max(c.tooLongMax, c.spanBytes)
}

func (c *captureCounts) line() string {
	s := fmt.Sprintf("written %d", c.written)
	if c.truncated > 0 {
		s += fmt.Sprintf(" (%d truncated to the snap length)", c.truncated)
	}
	s += fmt.Sprintf(", too long for the %d-byte buffers %d", c.bufFrame, c.tooLong)
	if c.tooLong > 0 {
		s += fmt.Sprintf(" (up to %d bytes; raise -buffer-size)", c.tooLongMax)
	}
	return s + fmt.Sprintf(", bad completions %d", c.bad)
}

func (c *captureCounts) details() map[string]any {
	return map[string]any{
		"written": c.written, "truncated": c.truncated,
		"too_long": map[string]any{"frames": c.tooLong, "largest_bytes": c.tooLongMax, "buffer_holds": c.bufFrame,
			"reason": fmt.Sprintf("frame longer than the %d bytes a receive buffer holds", c.bufFrame)},
		"bad_completions": c.bad,
	}
}
