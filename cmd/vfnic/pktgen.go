package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
	"github.com/vfnic/vfnic/lcore"
	"github.com/vfnic/vfnic/nic"
)

func runPktgen(ctx context.Context, args []string, o stdio) error {
	fs := newFlags("pktgen", "[flags] DEVICE")
	var df deviceFlags
	df.register(fs)
	count := fs.Int("count", 0, "frames to send (0: until -duration or interrupted)")
	sizeFlag := fs.String("size", "64", "frame size in bytes without FCS, or a range `N-M` (one more per frame): 60 (70 for IPv6)\n"+
		"up to the device's largest frame, MTU+22")
	sizeMix := fs.String("size-mix", "", "sizes in turn instead of -size, as `SIZE:COUNT,...` (IMIX: 64:7,594:4,1518:1)")
	rate := fs.Float64("rate", 0, "frames per second (0: as fast as the NIC takes them)")
	vlan := fs.Int("vlan", -1, "802.1Q VLAN ID to tag frames with (-1: untagged)")
	dstMAC := fs.String("dst-mac", "ff:ff:ff:ff:ff:ff", "destination MAC, or a range `A-B` of them")
	srcMAC := fs.String("src-mac", "", "source MAC, or a range A-B (default: the NIC's)")
	srcIP := fs.String("src-ip", "10.0.0.1", "source IPv4 or IPv6 address, or a range `A-B` (IPv6: in the low 64 bits)")
	dstIP := fs.String("dst-ip", "10.0.0.2", "destination address or range A-B, of the family of -src-ip")
	port := fs.String("port", "9", "UDP destination port, or a range `N-M` (9: discard)")
	replay := fs.String("replay", "", "send the frames of this pcap or pcapng `FILE` as they are, in order, at -rate, instead of UDP frames")
	loops := fs.Int("loop", 1, "with -replay: times through the file (0: until -count, -duration or interrupted)")
	srcPort := fs.String("src-port", "9000", "UDP source port, or a range N-M (several: RSS spreads the flows over queues)")
	df.registerQueues(fs, "queue i sends frames i, i+N, i+2N... of the run (each at -rate/N), so that the frames, their\n"+
		"sequence numbers and flows are those of one queue")
	if err := parse(fs, args); err != nil {
		return err
	}
	spec := flowSpec{vlan: *vlan}
	var err error
	var frames [][]byte
	if *replay != "" {
		var bad []string
		fs.Visit(func(f *flag.Flag) {
			switch f.Name {
			case "size", "size-mix", "vlan", "dst-mac", "src-mac", "src-ip", "dst-ip", "port", "src-port":
				bad = append(bad, "-"+f.Name)
			}
		})
		switch {
		case len(bad) > 0:
			return fmt.Errorf("%w: -replay sends the file's frames as they are: drop %s", errUsage, strings.Join(bad, ", "))
		case *loops < 0:
			return fmt.Errorf("%w: -loop %d is negative", errUsage, *loops)
		}
		if frames, err = readFrames(*replay); err != nil {
			return fmt.Errorf("%w: -replay: %v", errUsage, err)
		}
		if *count == 0 && *loops > 0 {
			*count = *loops * len(frames)
		}
	} else if *sizeMix != "" {
		set := false
		fs.Visit(func(f *flag.Flag) { set = set || f.Name == "size" })
		if set {
			return fmt.Errorf("%w: -size and -size-mix both set: give one", errUsage)
		}
		if spec.sizes, err = parseSizeMix(*sizeMix); err != nil {
			return err
		}
	} else {
		r, err := parseNumRange("size", *sizeFlag, minFrame, 65535)
		if err != nil {
			return err
		}
		spec.sizes = sizeSeq{r: r, txt: *sizeFlag}
	}
	// The device flags first (parse has refused a negative -duration).
	if err := df.check(); err != nil {
		return err
	}
	switch {
	case *count < 0:
		return fmt.Errorf("%w: -count %d is negative", errUsage, *count)
	case math.IsNaN(*rate) || math.IsInf(*rate, 0):
		// NaN passes every comparison, and the pacing would overflow.
		return fmt.Errorf("%w: -rate %g is not a finite number", errUsage, *rate)
	case *rate < 0:
		return fmt.Errorf("%w: -rate %g is negative", errUsage, *rate)
	}
	if *vlan < -1 || *vlan > 4094 {
		return fmt.Errorf("%w: -vlan %d outside [0, 4094]", errUsage, *vlan)
	}
	if *replay == "" {
		if err := parseFlows(&spec, *dstMAC, *srcMAC, *srcIP, *dstIP, *port, *srcPort); err != nil {
			return err
		}
	}
	lo, hi := spec.sizes.bounds()
	if *replay != "" {
		lo, hi = frameBounds(frames)
	}
	if fs.NArg() == 1 {
		// A size the kernel's driver of the NIC refuses is refused before
		// the NIC is taken from it.
		if dn, err := parseDevice(fs.Arg(0)); err != nil {
			return err
		} else if a := dn.addr; dn.pci {
			if max, ok := kernelMaxFrame(a); ok && hi > max {
				return fmt.Errorf("%w: -size %d: longer than any frame %s takes (its kernel driver's largest MTU makes frames of up to %d bytes)",
					errUsage, hi, a, max)
			}
		}
	}
	core, dev, err := df.open(ctx, fs, nic.Config{}, o.err)
	if err != nil {
		return err
	}
	defer core.Close() // after the device
	defer df.cleanup() // after the device
	defer dev.Close()
	out := df.human(o)
	describe(out, dev)
	tx, err := dev.Tx(0)
	if err != nil {
		return err
	}
	nq := df.nqueues()
	// newSource gives each queue its own frame source: a flow generator
	// rewrites its one frame in place.
	var newSource func() (frameSource, error)
	details := map[string]any{"rate_pps": *rate, "duration_seconds": df.duration.Seconds()}
	var what string
	if *replay != "" {
		if hi > tx.MaxFrame() || lo < nic.MinFrame {
			return fmt.Errorf("%w: -replay %s: frames of %d to %d bytes, outside [%d, %d] for %s (MTU %d)",
				errUsage, *replay, lo, hi, nic.MinFrame, tx.MaxFrame(), dev.Info().Address, dev.Info().MTU)
		}
		newSource = func() (frameSource, error) { return &replayFrames{frames: frames}, nil }
		details["replay"], details["replay_frames"], details["loop"] = *replay, len(frames), *loops
		what = fmt.Sprintf("the %d frames of %s (%d to %d bytes) as they are, %s", len(frames), *replay, lo, hi,
			rateNote(*rate, meanLen(frames)))
	} else {
		if hi > tx.MaxFrame() {
			return fmt.Errorf("%w: -size %d: frame of %d bytes outside [%d, %d] for %s (MTU %d)",
				errUsage, hi, hi, minFrame, tx.MaxFrame(), dev.Info().Address, dev.Info().MTU)
		}
		if *srcMAC == "" {
			m := dev.MAC()
			spec.srcMAC = numRange{lo: uint64(m[0])<<40 | uint64(m[1])<<32 | uint64(binary.BigEndian.Uint32(m[2:])), n: 1}
		}
		newSource = func() (frameSource, error) { return newFlowGen(spec) }
		for k, v := range map[string]any{"frame_size": sizeNote(spec.sizes), "src_ip": *srcIP, "dst_ip": *dstIP,
			"dst_port": spec.dstPort.String(), "src_port": spec.srcPort.String(), "dst_mac": *dstMAC,
			"src_mac": macRangeNote(spec.srcMAC), "vlan": *vlan} {
			details[k] = v
		}
		what = fmt.Sprintf("%s frames to %s (%s -> %s:%s%s%s) %s", sizeNote(spec.sizes), *dstMAC, *srcIP, *dstIP,
			spec.dstPort, srcNote(*srcMAC, spec.srcPort), vlanNote(*vlan), rateNote(*rate, spec.sizes.mean()))
	}
	details["count"] = *count
	gens := make(pktgens, nq)
	for i := range gens {
		q, err := dev.Tx(i)
		if err != nil {
			return err
		}
		src, err := newSource()
		if err != nil {
			return err
		}
		// Queue i sends the run's frames i, i+nq, ...: its share of -count.
		n := uint64(*count / nq)
		if i < *count%nq {
			n++
		}
		gens[i] = &pktgen{tx: q, src: src, count: n, limited: *count > 0, rate: *rate / float64(nq),
			first: uint64(i), stride: uint64(nq)}
	}
	p := newProgress(out, dev, df.interval, gens.line)
	where := coreNote(core)
	if nq > 1 {
		where = fmt.Sprintf("%d queues, each %s", nq, where)
	}
	fmt.Fprintf(out, "pktgen: sending %s, %s, %s\n", what, stopNote(*count, df.duration), where)
	ctx, cancel := df.withDuration(ctx)
	defer cancel()
	if err := gens.run(ctx, df.cores(core), p); err != nil {
		return removed(err, tx)
	}
	// Wait (bounded) for the last completions so the counters are final.
	txc := make([]nic.Completion, 256)
	for _, g := range gens {
		for g.tx.Outstanding() > 0 {
			n, err := g.tx.SRead(context.Background(), txc, g.tx.Outstanding(), 2*time.Second)
			g.failed.Add(uint64(failures(txc[:n])))
			if err != nil {
				fmt.Fprintf(out, "pktgen: %d sends not completed on queue %d: %v\n", g.tx.Outstanding(), g.tx.Index(), err)
				break
			}
		}
	}
	sent, failed, full := gens.totals()
	details["queued"], details["send_errors"], details["ring_full_waits"] = sent, failed, full
	if nq > 1 {
		per := make([]map[string]any, nq)
		for i, g := range gens {
			per[i] = map[string]any{"queue": i, "queued": g.sent.Load(), "send_errors": g.failed.Load(), "ring_full_waits": g.full.Load()}
		}
		details["queues"] = per
	}
	return p.summary("pktgen", df.jsonOut(o), details)
}

// pktgen is pktgen's sending loop on one queue: a Func of a polling core
// that queues up to a batch of frames per round (the core rings the
// doorbell once per round), with the transmit queue's completions counted
// by the core.
type pktgen struct {
	tx  nic.TxQueue
	src frameSource
	// count frames to send when limited, else no limit.
	count   uint64
	limited bool
	rate    float64 // frames per second, 0 for as fast as the NIC takes them
	// first and stride place this queue's frames in the run: its frame k
	// is the run's frame first+k*stride (stride 0 means 1).
	first, stride uint64

	// Written on the core's thread (once per round); read by the live
	// line on queue 0's core and by the summary once the cores stopped.
	sent, failed, full atomic.Uint64
	blocked            bool        // the last Send found the ring full (core's thread only)
	timer              *time.Timer // wakes a sleeping core when the next frame is due (-rate)
}

func (g *pktgen) line() string { return pktgens{g}.line() }

// pktgens are the queues of one run, each on its core.
type pktgens []*pktgen

func (gs pktgens) totals() (sent, failed, full uint64) {
	for _, g := range gs {
		sent, failed, full = sent+g.sent.Load(), failed+g.failed.Load(), full+g.full.Load()
	}
	return sent, failed, full
}

func (gs pktgens) line() string {
	sent, failed, full := gs.totals()
	return fmt.Sprintf("queued %d, send errors %d, ring-full waits %d", sent, failed, full)
}

// run sends on core until count frames are queued, ctx ends, or a send
// fails. It flushes what it queued; completions may still be outstanding.
func (g *pktgen) run(ctx context.Context, core *lcore.Core, p *progress) error {
	return pktgens{g}.run(ctx, []*lcore.Core{core}, p)
}

// run sends on each queue with its core (gs[i] on cores[i]) until every
// queue has sent its count, ctx ends, or a send fails, and flushes them.
func (gs pktgens) run(ctx context.Context, cores []*lcore.Core, p *progress) error {
	ctx, done := context.WithCancel(ctx)
	defer done()
	var left atomic.Int32
	left.Store(int32(len(gs)))
	finished := func() {
		if left.Add(-1) == 0 {
			done() // the cores finish this round (their doorbells) and stop
		}
	}
	for i, g := range gs {
		if err := g.attach(cores[i], finished); err != nil {
			return err
		}
	}
	err := runCores(ctx, done, cores, p)
	for _, g := range gs {
		if g.timer != nil {
			g.timer.Stop()
		}
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, g := range gs {
		errs = append(errs, g.tx.Flush())
	}
	return errors.Join(errs...)
}

// attach adds g's queue and sending Func to core; finished is called
// once, when g has queued its count.
func (g *pktgen) attach(core *lcore.Core, finished func()) error {
	// A sleeping core wakes only for interrupts: when the next frame is
	// not due yet, a timer wakes it then. A busy core looks by itself.
	var timer *time.Timer
	var timerAt time.Time
	if g.rate > 0 && core.Config().Mode != lcore.Busy {
		timer = time.AfterFunc(time.Hour, func() { _ = core.Wake() })
		timer.Stop()
		g.timer = timer
	}
	err := core.AddQueue(g.tx, func(_ nic.Queue, batch []nic.Completion) error {
		if n := failures(batch); n > 0 {
			g.failed.Add(uint64(n))
		}
		return nil
	})
	if err != nil {
		return err
	}
	stride := max(g.stride, 1)
	var start time.Time
	sent, done := uint64(0), false
	// In place (SendFunc), only a frame's head is written: the transmit
	// buffer keeps zeros past it from the frames before, as DPDK's
	// txonly writes only headers into mbufs.
	head := 0
	if h, ok := g.src.(headed); ok {
		head = h.head()
	}
	var cur []byte
	fill := func(b []byte) { copy(b, cur[:min(head, len(cur))]) }
	// Frames that stay valid from one call to the next (a pcap's) go to
	// the queue in one SendBurst per round: one lock for the batch.
	var batch [][]byte
	if _, ok := g.src.(kept); ok && head == 0 {
		batch = make([][]byte, 0, lcore.DefaultBatch)
	}
	return core.AddFunc(func() (int, error) {
		if done {
			return 0, nil
		}
		if g.limited && sent >= g.count {
			done = true
			if timer != nil {
				timer.Stop()
			}
			finished()
			return 0, nil
		}
		limit := uint64(lcore.DefaultBatch)
		if g.limited {
			limit = min(limit, g.count-sent)
		}
		if g.rate > 0 {
			if start.IsZero() {
				start = time.Now()
			}
			// Frame i is due i/rate seconds after the start.
			due := uint64(time.Since(start).Seconds()*g.rate) + 1
			if due <= sent {
				if at := start.Add(time.Duration(float64(sent) / g.rate * float64(time.Second))); timer != nil && at != timerAt {
					timerAt = at
					timer.Reset(time.Until(at))
				}
				return 0, nil
			}
			limit = min(limit, due-sent)
		}
		n, err := 0, error(nil)
		if batch != nil {
			batch = batch[:0]
			for i := range limit {
				batch = append(batch, g.src.next(g.first+(sent+i)*stride))
			}
			n, err = g.tx.SendBurst(batch, nil)
		} else {
			for ; uint64(n) < limit; n++ {
				frame := g.src.next(g.first + (sent+uint64(n))*stride)
				if head > 0 {
					cur = frame
					err = g.tx.SendFunc(len(frame), nil, fill)
				} else {
					err = g.tx.Send(frame, nil)
				}
				if err != nil {
					break
				}
			}
		}
		sent += uint64(n)
		if n > 0 {
			g.blocked = false
			g.sent.Store(sent)
		}
		if errors.Is(err, nic.ErrFull) {
			// Counted once per wait: the core polls the ring again
			// (or sleeps on its interrupt) until the device completes some.
			if !g.blocked {
				g.full.Add(1)
				g.blocked = true
			}
			err = nil
		}
		return n, err
	})
}

// coreNote says how the polling core runs.
func coreNote(c *lcore.Core) string {
	cfg := c.Config()
	if cfg.CPU == lcore.AnyCPU {
		return fmt.Sprintf("polling in %s mode on a thread of its own (not pinned)", cfg.Mode)
	}
	return fmt.Sprintf("polling in %s mode on a thread pinned to CPU %d", cfg.Mode, cfg.CPU)
}

func vlanNote(vlan int) string {
	if vlan < 0 {
		return ""
	}
	return fmt.Sprintf(", VLAN %d", vlan)
}

// rateNote says which rate pktgen runs at.
func rateNote(rate float64, size float64) string {
	if rate <= 0 {
		return "as fast as the NIC takes them"
	}
	return fmt.Sprintf("at %.0f pps (%.2f Mbit/s)", rate, rate*size*8/1e6)
}

// stopNote says what ends the run.
func stopNote(count int, d time.Duration) string {
	switch {
	case count > 0 && d > 0:
		return fmt.Sprintf("until %d frames are sent or %v passes, whichever comes first", count, d)
	case count > 0:
		return fmt.Sprintf("until %d frames are sent", count)
	case d > 0:
		return fmt.Sprintf("for %v", d)
	default:
		return "until interrupted (Ctrl-C)"
	}
}

// frameSource gives frame i of a run (valid until the next call).
type frameSource interface {
	next(i uint64) []byte
}

// kept is a frameSource whose frames stay valid after the next call, so
// that a round's frames can be gathered and posted in one SendBurst.
type kept interface {
	kept()
}

// headed is a frameSource whose frames differ only in their first head()
// bytes and hold zeros after them (0: not so): pktgen, the only sender on
// its queue, then writes only the head into a transmit buffer, which
// holds zeros past it from the frames sent from it before (or from new).
type headed interface {
	head() int
}

// seqFrame is one frame whose 8 bytes at seqOff carry the sequence number.
type seqFrame struct {
	frame  []byte
	seqOff int
}

// head implements headed when the frame is zeros past its sequence number.
func (f *seqFrame) head() int { return zeroPast(f.frame, f.seqOff+8) }

// zeroPast is head when b's bytes from head on are zeros, else 0.
func zeroPast(b []byte, head int) int {
	for _, c := range b[min(head, len(b)):] {
		if c != 0 {
			return 0
		}
	}
	return head
}

func (f *seqFrame) next(i uint64) []byte {
	binary.BigEndian.PutUint64(f.frame[f.seqOff:], i)
	return f.frame
}

func sizeNote(s sizeSeq) string {
	switch {
	case len(s.mix) > 0:
		return "a mix of " + s.txt + " byte"
	case s.r.n > 1:
		return s.r.String() + "-byte"
	}
	return fmt.Sprintf("%d-byte", s.r.lo)
}

// srcNote names the source MAC and port when they are not the defaults.
func srcNote(srcMAC string, port numRange) string {
	s := ""
	if port.n > 1 || port.lo != 9000 {
		s += " from port " + port.String()
	}
	if srcMAC != "" {
		s += " from MAC " + srcMAC
	}
	return s
}

func macRangeNote(r numRange) string {
	if r.n <= 1 {
		return macOf(r.lo).String()
	}
	return macOf(r.lo).String() + "-" + macOf(r.lo+r.n-1).String()
}

// parseFlows reads the address and port flags into spec and checks the
// sizes against the headers they make.
func parseFlows(spec *flowSpec, dstMAC, srcMAC, srcIP, dstIP, port, srcPort string) error {
	var err error
	if spec.dstMAC, err = parseMACRange("dst-mac", dstMAC); err != nil {
		return err
	}
	if srcMAC != "" {
		if spec.srcMAC, err = parseMACRange("src-mac", srcMAC); err != nil {
			return err
		}
	}
	if spec.srcIP, err = parseIPRange("src-ip", srcIP); err != nil {
		return err
	}
	if spec.dstIP, err = parseIPRange("dst-ip", dstIP); err != nil {
		return err
	}
	if spec.srcIP.v6 != spec.dstIP.v6 {
		return fmt.Errorf("%w: -src-ip %s and -dst-ip %s: both IPv4 or both IPv6", errUsage, srcIP, dstIP)
	}
	if spec.dstPort, err = parseNumRange("port", port, 1, 65535); err != nil {
		return err
	}
	if spec.srcPort, err = parseNumRange("src-port", srcPort, 1, 65535); err != nil {
		return err
	}
	lo, hi := spec.sizes.bounds()
	if lo < spec.minSize() || hi > 65535 {
		return fmt.Errorf("%w: sizes %d to %d: a frame takes %d to 65535 bytes here (headers and an 8-byte sequence number)",
			errUsage, lo, hi, spec.minSize())
	}
	return nil
}

// replayFrames sends a pcap's frames in order, over and over.
type replayFrames struct{ frames [][]byte }

func (r *replayFrames) next(i uint64) []byte { return r.frames[i%uint64(len(r.frames))] }

// kept implements kept: the frames are loaded once.
func (r *replayFrames) kept() {}

// maxReplayBytes bounds what -replay loads into memory.
const maxReplayBytes = 1 << 30

// readFrames loads the frames of a pcap or pcapng file of Ethernet frames.
func readFrames(path string) ([][]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var magic [4]byte
	if _, err := io.ReadFull(f, magic[:]); err != nil {
		return nil, fmt.Errorf("%s: not a pcap file: %v", path, err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	var read func() ([]byte, gopacket.CaptureInfo, error)
	if binary.BigEndian.Uint32(magic[:]) == 0x0a0d0d0a { // pcapng section header
		r, err := pcapgo.NewNgReader(f, pcapgo.DefaultNgReaderOptions)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", path, err)
		}
		if r.LinkType() != layers.LinkTypeEthernet {
			return nil, fmt.Errorf("%s: link type %v, not Ethernet", path, r.LinkType())
		}
		read = r.ReadPacketData
	} else {
		r, err := pcapgo.NewReader(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", path, err)
		}
		if r.LinkType() != layers.LinkTypeEthernet {
			return nil, fmt.Errorf("%s: link type %v, not Ethernet", path, r.LinkType())
		}
		read = r.ReadPacketData
	}
	var frames [][]byte
	total := 0
	for {
		data, _, err := read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: frame %d: %v", path, len(frames)+1, err)
		}
		if total += len(data); total > maxReplayBytes {
			return nil, fmt.Errorf("%s: more than %d bytes of frames", path, maxReplayBytes)
		}
		frames = append(frames, append([]byte(nil), data...))
	}
	if len(frames) == 0 {
		return nil, fmt.Errorf("%s holds no frames", path)
	}
	return frames, nil
}

// frameBounds returns the shortest and longest of frames.
func frameBounds(frames [][]byte) (lo, hi int) {
	lo = len(frames[0])
	for _, f := range frames {
		lo, hi = min(lo, len(f)), max(hi, len(f))
	}
	return lo, hi
}

func meanLen(frames [][]byte) float64 {
	t := 0
	for _, f := range frames {
		t += len(f)
	}
	return float64(t) / float64(len(frames))
}
