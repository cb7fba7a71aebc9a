package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
	"github.com/vfnic/vfnic/cmd/vfnic/internal/pcapfilter"
	"github.com/vfnic/vfnic/lcore"
	"github.com/vfnic/vfnic/nic"
)

// defaultSnaplen is tcpdump's default: whole frames, even jumbo ones.
const defaultSnaplen = 262144

func runCapture(ctx context.Context, args []string, o stdio) error {
	fs := newFlags("capture", "[-w FILE] [flags] DEVICE [FILTER EXPRESSION]")
	var df deviceFlags
	df.register(fs)
	file := fs.String("w", "", `pcap file to write (nanosecond timestamps); "-" writes the pcap to stdout, human lines then go to stderr;`+
		"\nwithout -w, one line per frame on stdout, as tcpdump prints")
	var count, snaplen int
	fs.IntVar(&count, "count", 0, "stop after this many frames that pass the filter (0: until -duration or interrupted)")
	fs.IntVar(&count, "c", 0, "same as -count (tcpdump's)")
	fs.IntVar(&snaplen, "snaplen", defaultSnaplen, "bytes of each frame to write (longer frames are truncated, as tcpdump -s; 0: whole frames)")
	fs.IntVar(&snaplen, "s", defaultSnaplen, "same as -snaplen (tcpdump's)")
	iface := fs.String("i", "", "the NIC's `DEVICE` (PCI address, afxdp:IF or afpacket:IF), as tcpdump's interface: then every argument is the filter")
	var noPromisc bool
	fs.BoolVar(&noPromisc, "p", false, "do not put the NIC in promiscuous mode (as tcpdump -p): only frames for its MAC, broadcast and multicast")
	fs.BoolVar(&noPromisc, "no-promisc", false, "same as -p")
	fs.Bool("n", true, "accepted for tcpdump's habit: addresses and ports are always printed as numbers")
	df.registerQueues(fs, "the NIC spreads flows over them (RSS); frames from all queues go to the one output, in the order written")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: vfnic capture [-w FILE] [flags] DEVICE [FILTER EXPRESSION]\n"+
			"       vfnic capture -i DEVICE [-w FILE] [flags] [FILTER EXPRESSION]\n\n"+
			"The filter is tcpdump's (pcap-filter(7)), compiled to classic BPF: host, net, port, portrange,\n"+
			"proto names (ip ip6 arp rarp icmp icmp6 tcp udp sctp), ip/ip6 proto, vlan [ID], ether host/src/dst/proto,\n"+
			"broadcast, multicast, less, greater, and/or/not and parentheses; quote it or not, as with tcpdump.\n\n"+
			"flags (before or after the arguments):\n")
		fs.PrintDefaults()
		fmt.Fprintf(fs.Output(), "\n%s\n", hostNames)
	}
	if err := parse(fs, args); err != nil {
		return err
	}
	addr, words := *iface, fs.Args()
	if addr == "" {
		if len(words) == 0 {
			return fmt.Errorf("%w: name the NIC's PCI address (see 'vfnic list'), then the filter if any", errUsage)
		}
		addr, words = words[0], words[1:]
		if _, err := parseDevice(addr); err != nil {
			return fmt.Errorf("%w; the PCI address comes first (or with -i), then the filter expression", err)
		}
	}
	if snaplen == 0 {
		snaplen = defaultSnaplen // tcpdump -s 0
	}
	switch {
	case count < 0:
		return fmt.Errorf("%w: -count %d is negative", errUsage, count)
	case snaplen < nic.MinFrame || snaplen > defaultSnaplen:
		return fmt.Errorf("%w: -snaplen %d outside [%d, %d] (0: whole frames)", errUsage, snaplen, nic.MinFrame, defaultSnaplen)
	}
	expr := strings.Join(words, " ")
	var filter *pcapfilter.Filter
	if expr != "" {
		var err error
		if filter, err = pcapfilter.New(expr); err != nil {
			var se *pcapfilter.SyntaxError
			if errors.As(err, &se) {
				return fmt.Errorf("%w: filter: %s\n  %s", errUsage, err, strings.ReplaceAll(se.Caret(), "\n", "\n  "))
			}
			return fmt.Errorf("%w: filter: %v", errUsage, err)
		}
	}
	text := *file == ""
	human := df.human(o)
	if *file == "-" || text {
		human = o.err // stdout carries the pcap or the frame lines
		if df.json {
			what := "-w -"
			if text {
				what = "the frame lines (no -w)"
			}
			return fmt.Errorf("%w: -json and %s both want stdout", errUsage, what)
		}
	}
	core, dev, err := df.openAt(ctx, addr, nic.Config{Promiscuous: !noPromisc}, o.err)
	if err != nil {
		return err
	}
	defer core.Close() // after the device
	defer df.cleanup() // after the device
	defer dev.Close()
	var dst io.Writer = o.out
	var f *os.File
	if *file != "" && *file != "-" {
		if f, err = os.Create(*file); err != nil {
			return err
		}
		defer f.Close()
		dst = f
	}
	bw := bufio.NewWriterSize(dst, 1<<20)
	var fw frameWriter
	if text {
		fw = &textWriter{w: bw}
	} else {
		w := pcapgo.NewWriterNanos(bw)
		if err := w.WriteFileHeader(uint32(snaplen), layers.LinkTypeEthernet); err != nil {
			return err
		}
		fw = pcapWriter{w}
	}
	ctx, cancel := df.withDuration(ctx)
	defer cancel()
	describe(human, dev)
	var rxs []nic.RxQueue
	for i := range df.nqueues() {
		rx, err := dev.Rx(i)
		if err != nil {
			return err
		}
		if err := fillRx(rx); err != nil {
			return err
		}
		rxs = append(rxs, rx)
	}
	rx := rxs[0]
	cw := &capturer{rxs: rxs, w: fw, bw: bw, filter: filter, count: uint64(count), snaplen: snaplen, pipe: *file == "-" || text,
		c: captureCounts{bufFrame: rx.MaxFrame(), filtered: filter != nil}}
	p := newProgress(human, dev, df.interval, cw.line)
	p.promisc = !noPromisc
	mode := "promiscuous"
	if noPromisc {
		mode = "not promiscuous"
	}
	where := name(*file)
	if text {
		where = "stdout as text"
	}
	filterNote := "no filter"
	if filter != nil {
		filterNote = fmt.Sprintf("filter %q (%d BPF instructions)", expr, len(filter.Program()))
	}
	cores := coreNote(core)
	if len(rxs) > 1 {
		cores = fmt.Sprintf("%d queues, each %s", len(rxs), cores)
	}
	fmt.Fprintf(human, "capture: writing frames to %s (%s, snap length %d, buffers hold frames of up to %d bytes, %s), %s\n",
		where, mode, snaplen, cw.c.bufFrame, filterNote, cores)
	if err := cw.runOn(ctx, df.cores(core), p); err != nil {
		return removed(err, rx)
	}
	if f != nil {
		if err := f.Close(); err != nil {
			return err
		}
	}
	return p.summary("capture", df.jsonOut(o), cw.c.details())
}

// frameWriter is where capture puts the frames that pass: a pcap, or
// lines of text.
type frameWriter interface {
	write(ts time.Time, data []byte, length int) error
}

type pcapWriter struct{ w *pcapgo.Writer }

func (p pcapWriter) write(ts time.Time, data []byte, length int) error {
	return p.w.WritePacket(gopacket.CaptureInfo{Timestamp: ts, CaptureLength: len(data), Length: length}, data)
}

// capturer is capture's receive loop: a Handler of a polling core per
// queue that writes each frame to the pcap and posts its buffer again.
type capturer struct {
	rx      nic.RxQueue   // the queue, when rxs is empty
	rxs     []nic.RxQueue // the queues: rxs[i] is polled by cores[i]
	w       frameWriter
	bw      *bufio.Writer      // under w: flushed when a queue goes idle
	filter  *pcapfilter.Filter // nil: every frame
	count   uint64             // frames to write, 0 for no limit
	snaplen int
	pipe    bool // stdout: flush every batch

	// mu guards w, bw and c between the queues' cores (taken once per
	// batch); the summary reads c once they stopped.
	mu sync.Mutex
	c  captureCounts
}

// line is the live line, taken on queue 0's core.
func (cw *capturer) line() string {
	cw.mu.Lock()
	defer cw.mu.Unlock()
	return cw.c.line()
}

// run captures on core until count frames are written, ctx ends, or an
// operation fails, and flushes the pcap.
func (cw *capturer) run(ctx context.Context, core *lcore.Core, p *progress) error {
	return cw.runOn(ctx, []*lcore.Core{core}, p)
}

// runOn is run with queue i on cores[i].
func (cw *capturer) runOn(ctx context.Context, cores []*lcore.Core, p *progress) error {
	ctx, done := context.WithCancel(ctx)
	defer done()
	rxs := cw.rxs
	if len(rxs) == 0 {
		rxs = []nic.RxQueue{cw.rx}
	}
	for i, rx := range rxs {
		got := 0 // completions in the current round of this core
		err := cores[i].AddQueue(rx, func(_ nic.Queue, batch []nic.Completion) error {
			got += len(batch)
			return cw.handle(rx, batch, done)
		})
		if err != nil {
			return err
		}
		err = cores[i].AddFunc(func() (int, error) {
			// A reader on a pipe (tshark -r -) sees each batch at once; a
			// file gets what is buffered whenever the queue is idle, as
			// the core polls once more before it sleeps.
			if cw.pipe || got == 0 {
				cw.mu.Lock()
				err := cw.bw.Flush()
				cw.mu.Unlock()
				if err != nil {
					return 0, err
				}
			}
			got = 0
			return 0, nil
		})
		if err != nil {
			return err
		}
	}
	err := runCores(ctx, done, cores, p)
	cw.mu.Lock()
	defer cw.mu.Unlock()
	return errors.Join(err, cw.bw.Flush())
}

// handle writes a batch of frames received on rx, up to count, and posts
// their buffers again; done stops the cores once count frames are written.
func (cw *capturer) handle(rx nic.RxQueue, comps []nic.Completion, done func()) error {
	cw.mu.Lock()
	defer cw.mu.Unlock()
	refill := false
	for i := range comps {
		cp := &comps[i]
		if cp.Err != nil {
			// The driver took the buffer back into its pool.
			cw.c.failed(cp.Err)
			refill = true
			continue
		}
		if cw.filter != nil && !cw.filter.Match(cp.Data) {
			cw.c.rejected++
		} else if cw.count == 0 || cw.c.written < cw.count {
			l := min(len(cp.Data), cw.snaplen)
			if err := cw.w.write(time.Now(), cp.Data[:l], len(cp.Data)); err != nil {
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
		if err := rx.Repost(cp.Buf, nil); err != nil {
			return err
		}
	}
	if refill {
		return fillRx(rx)
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
	filtered           bool   // a filter is set
	rejected           uint64 // frames the filter refused
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
	if c.filtered {
		s += fmt.Sprintf(", filtered out %d", c.rejected)
	}
	s += fmt.Sprintf(", too long for the %d-byte buffers %d", c.bufFrame, c.tooLong)
	if c.tooLong > 0 {
		s += fmt.Sprintf(" (up to %d bytes; raise -buffer-size)", c.tooLongMax)
	}
	return s + fmt.Sprintf(", bad completions %d", c.bad)
}

func (c *captureCounts) details() map[string]any {
	return map[string]any{
		"written": c.written, "truncated": c.truncated, "filtered_out": c.rejected,
		"too_long": map[string]any{"frames": c.tooLong, "largest_bytes": c.tooLongMax, "buffer_holds": c.bufFrame,
			"reason": fmt.Sprintf("frame longer than the %d bytes a receive buffer holds", c.bufFrame)},
		"bad_completions": c.bad,
	}
}
