package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vfnic/vfnic/lcore"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/nic/afxdp"
	"github.com/vfnic/vfnic/nic/igb"      // registers the igb (Intel 82576) driver
	_ "github.com/vfnic/vfnic/nic/virtio" // registers the virtio-net driver
	"github.com/vfnic/vfnic/pci"
	"github.com/vfnic/vfnic/vfio"
)

// deviceFlags are the flags every traffic command takes.
type deviceFlags struct {
	queueSize  int
	bufferSize int
	force      bool
	json       bool
	interval   time.Duration
	duration   time.Duration
	cpu        int        // -cpu: lcore.AnyCPU for none
	mode       lcore.Mode // -mode
	idle       time.Duration
	batch      int
	queues     int  // -queues, for the commands that take it (registerQueues); 0 means 1
	hasQueues  bool // the command takes -queues

	// extra are the polling cores of queues 1 to queues-1, made by openAt
	// before the device is opened and closed by cleanup after it.
	extra []*lcore.Core
	// kernel is what -force took from the kernel; warn where it is told.
	kernel kernelState
	warn   io.Writer
}

// registerQueues adds -queues: queue pairs, each polled by a core of its
// own.
func (d *deviceFlags) registerQueues(fs *flag.FlagSet, what string) {
	d.hasQueues = true
	fs.IntVar(&d.queues, "queues", 1, "queue pairs, each polled by its own core (with -cpu N, queue i's on CPU N+i);\n"+
		what+"; live lines and the summary count per queue")
}

// nqueues is -queues, at least 1.
func (d *deviceFlags) nqueues() int { return max(d.queues, 1) }

// cleanup runs after the devices are closed: it closes the cores of
// queues 1 and up and gives the kernel's interfaces back what -force
// took from them.
func (d *deviceFlags) cleanup() {
	d.closeExtra()
	if d.warn != nil {
		d.kernel.giveBack(d.warn)
	}
}

// closeExtra closes the cores of queues 1 and up.
func (d *deviceFlags) closeExtra() {
	for _, c := range d.extra {
		_ = c.Close()
	}
	d.extra = nil
}

func (d *deviceFlags) register(fs *flag.FlagSet) {
	fs.IntVar(&d.queueSize, "queue-size", 0, "descriptors per ring (0: driver default)")
	fs.IntVar(&d.bufferSize, "buffer-size", 0, "bytes per receive buffer, driver header included (0: enough for the device's MTU)")
	fs.BoolVar(&d.force, "force", false, "take the NIC even if its kernel interface is up or has addresses")
	fs.BoolVar(&d.json, "json", false, "print the summary as one JSON object on stdout; human lines go to stderr")
	fs.DurationVar(&d.interval, "progress", time.Second, "interval between progress lines (0: none)")
	fs.DurationVar(&d.duration, "duration", 0, "stop after this long (0: until done or interrupted)")
	fs.IntVar(&d.cpu, "cpu", lcore.AnyCPU, "pin the polling thread to CPU `N` (-1: not pinned; the thread is still locked)")
	d.mode = lcore.Adaptive
	fs.Var(modeFlag{&d.mode}, "mode", "what the polling thread does when idle (`busy|adaptive|interrupt`): busy polls on\n"+
		"(lowest latency, one CPU at 100%), adaptive sleeps on the NIC's interrupts after -idle without work,\n"+
		"interrupt sleeps whenever a poll finds nothing")
	fs.DurationVar(&d.idle, "idle", 0, "how long an adaptive polling thread polls without finding work before it sleeps (0: "+lcore.DefaultIdleInterval.String()+")")
	fs.IntVar(&d.batch, "batch", 0, "most completions read from a queue per poll (0: "+fmt.Sprint(lcore.DefaultBatch)+")")
}

// modeFlag is -mode: an lcore.Mode by name.
type modeFlag struct{ m *lcore.Mode }

func (f modeFlag) String() string {
	if f.m == nil {
		return "" // the flag package's zero value, so that -h shows the default
	}
	return f.m.String()
}

func (f modeFlag) Set(s string) error {
	m, err := lcore.ParseMode(s)
	if err != nil {
		return errors.New("want busy, adaptive or interrupt")
	}
	*f.m = m
	return nil
}

// check refuses the device flags no device could take, as usage errors
// (parse has refused negative durations already).
func (d *deviceFlags) check() error {
	switch {
	case d.queueSize < 0:
		return fmt.Errorf("%w: -queue-size %d is negative", errUsage, d.queueSize)
	case d.bufferSize < 0:
		return fmt.Errorf("%w: -buffer-size %d is negative", errUsage, d.bufferSize)
	case d.hasQueues && (d.queues < 1 || d.queues > maxQueues):
		return fmt.Errorf("%w: -queues %d outside [1, %d]", errUsage, d.queues, maxQueues)
	}
	return nil
}

// newCore checks the device flags and returns the polling core for -cpu,
// -mode, -idle and -batch, not started. Commands call it before they open
// the device, so that a bad flag binds nothing.
func (d *deviceFlags) newCore() (*lcore.Core, error) { return d.newCoreOn(d.cpu) }

// cpuFor is the CPU of queue i's core: -cpu plus i, or none.
func (d *deviceFlags) cpuFor(i int) int {
	if d.cpu == lcore.AnyCPU {
		return lcore.AnyCPU
	}
	return d.cpu + i
}

// newCoreOn is newCore for a core pinned to cpu (lcore.AnyCPU: none).
func (d *deviceFlags) newCoreOn(cpu int) (*lcore.Core, error) {
	if err := d.check(); err != nil {
		return nil, err
	}
	switch {
	case cpu < lcore.AnyCPU:
		return nil, fmt.Errorf("%w: -cpu %d: CPUs are numbered from 0 (-1: not pinned)", errUsage, cpu)
	case d.batch < 0 || d.batch > lcore.MaxBatch:
		return nil, fmt.Errorf("%w: -batch %d: not a count from 0 to %d", errUsage, d.batch, lcore.MaxBatch)
	}
	c, err := lcore.New(lcore.Config{CPU: cpu, Mode: d.mode, IdleInterval: d.idle, Batch: d.batch})
	if errors.Is(err, lcore.ErrCPU) {
		allowed := ""
		if cpus, aerr := lcore.AllowedCPUs(); aerr == nil {
			allowed = fmt.Sprintf(" (this process may run on %v)", cpus)
		}
		what := fmt.Sprintf("-cpu %d", d.cpu)
		if cpu != d.cpu {
			what += fmt.Sprintf(" (CPU %d for a queue's core)", cpu)
		}
		return nil, fmt.Errorf("%w: %s: not a CPU this process may run on%s", errUsage, what, allowed)
	}
	return c, err
}

// open makes the polling core for -cpu and -mode, then opens the NIC
// named by the single address argument, so that a bad -cpu binds
// nothing. The caller closes the device, then the core.
func (d *deviceFlags) open(ctx context.Context, fs *flag.FlagSet, cfg nic.Config, warn io.Writer) (*lcore.Core, nic.Device, error) {
	if fs.NArg() != 1 {
		return nil, nil, fmt.Errorf("%w: name one PCI address or host interface (afxdp:IF, afpacket:IF; see 'vfnic list')", errUsage)
	}
	return d.openAt(ctx, fs.Arg(0), cfg, warn)
}

// openAt is open for the NIC at addr. With -force it first warns on warn
// what the kernel loses (forceWarning).
func (d *deviceFlags) openAt(ctx context.Context, addr string, cfg nic.Config, warn io.Writer) (*lcore.Core, nic.Device, error) {
	// A name of a registered scheme ("softnic:lab/0") goes to its driver
	// as it is; anything else must be a PCI address.
	dn, err := parseDevice(addr)
	if err != nil {
		return nil, nil, err
	}
	// The other queues' cores first (the highest CPU is the likeliest
	// refusal), all before the device.
	for i := 1; i < d.nqueues() && len(d.extra) < d.nqueues()-1; i++ {
		c, err := d.newCoreOn(d.cpuFor(i))
		if err != nil {
			d.closeExtra()
			return nil, nil, err
		}
		d.extra = append(d.extra, c)
	}
	core, err := d.newCore()
	if err != nil {
		d.closeExtra()
		return nil, nil, err
	}
	cfg.QueueSize, cfg.BufferSize, cfg.Force = d.queueSize, d.bufferSize, d.force
	if d.queues > 1 {
		cfg.QueuePairs = d.queues
	}
	if d.force && dn.pci { // a host interface stays the kernel's
		d.warn = warn
		d.kernel.take(dn.addr, warn)
	}
	dev, err := openNIC(ctx, addr, cfg)
	if err != nil {
		core.Close()
		d.cleanup()
		return nil, nil, err
	}
	if n := dev.QueuePairs(); n < d.nqueues() {
		dev.Close()
		core.Close()
		d.cleanup()
		return nil, nil, fmt.Errorf("%w: -queues %d: %s has %d queue pair(s)", errUsage, d.queues, addr, n)
	}
	return core, dev, nil
}

// cores is the polling core of each queue: core for queue 0, then the
// extra ones.
func (d *deviceFlags) cores(core *lcore.Core) []*lcore.Core {
	return append([]*lcore.Core{core}, d.extra...)
}

// runCores runs cores[0] with runCore (the live lines) and starts the
// others, until ctx ends, stop is called or a core fails: one failing
// stops them all. The handlers and Funcs are added already. It returns
// the cores' errors, joined (nil when ctx ended them).
func runCores(ctx context.Context, stop context.CancelFunc, cores []*lcore.Core, p *progress) error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for _, c := range cores[1:] {
		if err := c.Start(ctx); err != nil {
			stop()
			wg.Wait()
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.Wait(context.Background()); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
				stop()
			}
		}()
	}
	p.extraCores = cores[1:]
	err := runCore(ctx, cores[0], p)
	stop()
	wg.Wait()
	return errors.Join(append([]error{err}, errs...)...)
}

// openNIC is nic.Open with refusals that say how to go on: a NIC the
// kernel uses gets bind's -force hint, and a NIC another process holds
// is refused naming that process, as unbind does, where VFIO says only
// "device or resource busy".
func openNIC(ctx context.Context, addr string, cfg nic.Config) (nic.Device, error) {
	dev, err := nic.Open(ctx, addr, cfg)
	if err == nil {
		return dev, nil
	}
	if a, perr := pci.ParseAddress(addr); perr == nil {
		err = heldBy(a, err)
	}
	// afxdp's text names Config.Force, which a CLI user does not see.
	switch {
	case errors.Is(err, afxdp.ErrXDPInUse) && !cfg.Force:
		err = fmt.Errorf("%w (vfnic: -force detaches a program attached through netlink, as 'ip link set dev IF xdp off'; never one held by a bpf_link)", err)
	case errors.Is(err, afxdp.ErrXDPInUse):
		err = fmt.Errorf("%w (vfnic: -force could not detach it: a program held by another process's bpf_link stays until its owner removes it)", err)
	}
	return nil, inUseHint(err)
}

// forceWarning says, before -force takes a NIC the kernel uses, what the
// kernel loses: its interfaces go down with it, and come back on exit
// without their addresses and routes. "" when the kernel does not use
// it. ns nil means netlink.
func forceWarning(sys pci.Sysfs, ns pci.NetState, a pci.Address) string {
	reasons, err := sys.InUse(a, ns)
	if err != nil || len(reasons) == 0 {
		return ""
	}
	d, err := sys.Lookup(a)
	if err != nil {
		return ""
	}
	return fmt.Sprintf("warning: -force takes %s from %s although %s: its interfaces go down, and come back on exit, "+
		"where vfnic gives them back their state, addresses and routes (what the kernel refuses is named then)",
		a, driverName(d.Driver), strings.Join(reasons, ", "))
}

// heldBy turns VFIO's "busy" for the device at a into the holder's name
// and PID (pci.Sysfs.CheckHeld, which unbind uses), keeping err's text.
func heldBy(a pci.Address, err error) error {
	if !errors.Is(err, vfio.ErrBusy) && !errors.Is(err, syscall.EBUSY) {
		return err
	}
	if herr := (pci.Sysfs{}).CheckHeld(a); errors.Is(herr, pci.ErrBusy) {
		return fmt.Errorf("%w (%v)", herr, err)
	}
	return err
}

// housekeeping is how often runCore wakes a sleeping core, for progress
// lines and so that a core asleep when the kernel takes the device back
// notices it: the removal closes the queues' interrupt eventfds, which
// then never fire.
const housekeeping = 100 * time.Millisecond

// runCore runs core until ctx ends, a handler or Func stops it, or it
// fails, and returns why (nil for ctx). It adds a Func that prints p's
// progress lines on the core's thread, where the counters they show are
// written, and wakes the core every housekeeping period (or progress
// interval, if shorter) so that the lines come while it sleeps too.
func runCore(ctx context.Context, core *lcore.Core, p *progress) error {
	var due atomic.Bool
	if err := core.AddFunc(func() (int, error) {
		// A load first: a locked swap on every poll would cost the busy loop.
		if due.Load() {
			due.Store(false)
			p.tick()
		}
		return 0, nil
	}); err != nil {
		return err
	}
	period := housekeeping
	if p.interval > 0 && p.interval < period {
		period = p.interval
	}
	p.core = core
	if err := core.Start(ctx); err != nil {
		return err
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				due.Store(true)
				if core.Config().Mode != lcore.Busy { // a busy core never sleeps
					_ = core.Wake()
				}
			}
		}
	}()
	err := core.Wait(context.Background())
	close(stop)
	wg.Wait()
	_ = core.Close() // stopped already: this frees its eventfd before the device closes
	return err
}

// removed returns nic.ErrRemoved's error from q when the core stopped on a
// closed interrupt eventfd because the kernel took the device back (the
// queue says why it is closed), else err.
func removed(err error, q nic.Queue) error {
	if !errors.Is(err, os.ErrClosed) || errors.Is(err, nic.ErrRemoved) {
		return err
	}
	if ferr := q.Flush(); errors.Is(ferr, nic.ErrRemoved) {
		return ferr
	}
	return err
}

// human is where a command's human lines go: stderr when stdout carries
// JSON.
func (d *deviceFlags) human(o stdio) io.Writer {
	if d.json {
		return o.err
	}
	return o.out
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

// mbps is a rate in Mbit/s from bytes over seconds (frame bytes without
// FCS, as testpmd's byte counters).
func mbps(bytes uint64, sec float64) float64 {
	if sec <= 0 {
		return 0
	}
	return float64(bytes) * 8 / sec / 1e6
}

func perSec(n uint64, sec float64) float64 {
	if sec <= 0 {
		return 0
	}
	return float64(n) / sec
}

// progress prints a line of rates and totals every interval, and the
// summary at the end.
type progress struct {
	out    io.Writer // human lines
	dev    nic.Device
	start  time.Time
	last   time.Time
	lastRx nic.QueueStats
	lastTx nic.QueueStats
	// lastRxQ and lastTxQ are per queue, for the per-queue rates.
	lastRxQ, lastTxQ []nic.QueueStats
	extra            func() string
	interval         time.Duration
	promisc          bool        // for the summary's device description
	core             *lcore.Core // the polling core, for the summary (runCore sets it)
	// extraCores poll the other queues (sink -queues): their interrupts
	// count in the summary too.
	extraCores []*lcore.Core
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
	fmt.Fprintf(p.out, "%6.1fs  rx %8.0f pps %8.2f Mbit/s  tx %8.0f pps %8.2f Mbit/s  totals rx %d tx %d  %s\n",
		now.Sub(p.start).Seconds(),
		perSec(s.Rx.Packets-p.lastRx.Packets, dt), mbps(s.Rx.Bytes-p.lastRx.Bytes, dt),
		perSec(s.Tx.Packets-p.lastTx.Packets, dt), mbps(s.Tx.Bytes-p.lastTx.Bytes, dt),
		s.Rx.Packets, s.Tx.Packets, p.extra())
	if len(s.RxQueues) > 1 || len(s.TxQueues) > 1 {
		fmt.Fprintf(p.out, "%6s  per queue rx pps %s  tx pps %s\n", "", queueRates(s.RxQueues, p.lastRxQ, dt),
			queueRates(s.TxQueues, p.lastTxQ, dt))
	}
	p.last, p.lastRx, p.lastTx = now, s.Rx, s.Tx
	p.lastRxQ, p.lastTxQ = s.RxQueues, s.TxQueues
}

// queueRates is each queue's packets/s since last (none before the
// first line), as "[r0 r1 ...]".
func queueRates(qs, last []nic.QueueStats, dt float64) string {
	rs := make([]string, len(qs))
	for i, q := range qs {
		prev := uint64(0)
		if i < len(last) {
			prev = last[i].Packets
		}
		rs[i] = fmt.Sprintf("%.0f", perSec(q.Packets-prev, dt))
	}
	return "[" + strings.Join(rs, " ") + "]"
}

// dirSummary is one direction of a traffic summary.
type dirSummary struct {
	Frames     uint64  `json:"frames"`
	Bytes      uint64  `json:"bytes"`
	Errors     uint64  `json:"errors"`
	PPS        float64 `json:"pps"`
	Mbps       float64 `json:"mbps"`
	Interrupts uint64  `json:"interrupts"`
	Doorbells  uint64  `json:"doorbells"`
	Suppressed uint64  `json:"doorbells_suppressed"`
}

// deviceSummary describes the device a traffic command ran on.
type deviceSummary struct {
	Address     string   `json:"address"`
	Driver      string   `json:"driver"`
	Model       string   `json:"model"`
	MAC         string   `json:"mac"`
	MTU         int      `json:"mtu"`
	MaxRxFrame  int      `json:"max_rx_frame"`
	MaxTxFrame  int      `json:"max_tx_frame"`
	QueuePairs  int      `json:"queue_pairs"`
	QueueSize   int      `json:"queue_size"`
	RxBuffers   int      `json:"rx_buffers"`
	BufferSize  int      `json:"buffer_size"`
	Vectors     int      `json:"msix_vectors"`
	Features    []string `json:"features"`
	Promiscuous bool     `json:"promiscuous"`
}

// trafficSummary is what -json prints when a traffic command ends.
type trafficSummary struct {
	Command string        `json:"command"`
	Device  deviceSummary `json:"device"`
	Core    *coreSummary  `json:"core,omitempty"`
	Seconds float64       `json:"seconds"`
	Rx      dirSummary    `json:"rx"`
	Tx      dirSummary    `json:"tx"`
	// Queues are per queue, with their cores, when there are several.
	Queues []queueSummary `json:"queues,omitempty"`
	// Hardware are the device's own counters since open (igb's
	// statistics registers: frames the MAC missed or refused, which the
	// driver never sees); HardwareNote says why there are none.
	Hardware     *igb.HWStats   `json:"hardware,omitempty"`
	HardwareNote string         `json:"hardware_note,omitempty"`
	Details      map[string]any `json:"details,omitempty"`
}

// queueSummary is one queue pair's counters and the core that polled it.
type queueSummary struct {
	Queue int          `json:"queue"`
	Rx    dirSummary   `json:"rx"`
	Tx    dirSummary   `json:"tx"`
	Core  *coreSummary `json:"core,omitempty"`
}

// coreSummary describes the polling core a traffic command ran on, with
// its counters (lcore.Stats).
type coreSummary struct {
	Mode string `json:"mode"`
	// CPU is the CPU the core's thread was pinned to, -1 for none.
	CPU         int    `json:"cpu"`
	Polls       uint64 `json:"polls"`
	EmptyPolls  uint64 `json:"empty_polls"`
	Completions uint64 `json:"completions"`
	Sleeps      uint64 `json:"sleeps"`
	Wakeups     uint64 `json:"wakeups"`
	// Steered counts the queues whose interrupt the core directed to its
	// CPU; SteerError says why others were not ("" when none failed).
	Steered    int    `json:"steered_interrupts"`
	SteerError string `json:"steer_error,omitempty"`
}

func summarizeCore(c *lcore.Core) *coreSummary {
	if c == nil {
		return nil
	}
	cfg, st := c.Config(), c.Stats()
	s := &coreSummary{Mode: cfg.Mode.String(), CPU: cfg.CPU, Polls: st.Polls, EmptyPolls: st.EmptyPolls,
		Completions: st.Completions, Sleeps: st.Sleeps, Wakeups: st.Wakeups}
	var err error
	if s.Steered, err = c.Steered(); err != nil {
		s.SteerError = err.Error()
	}
	return s
}

// coreInterrupts sums the interrupts core took from dev's receive and
// transmit queues.
func coreInterrupts(core *lcore.Core, dev nic.Device) (rx, tx uint64) {
	for i := range dev.QueuePairs() {
		if q, err := dev.Rx(i); err == nil {
			rx += core.Interrupts(q)
		}
		if q, err := dev.Tx(i); err == nil {
			tx += core.Interrupts(q)
		}
	}
	return rx, tx
}

// String is the summary's human line.
func (c *coreSummary) String() string {
	where := "not pinned"
	if c.CPU != lcore.AnyCPU {
		where = fmt.Sprintf("pinned to CPU %d", c.CPU)
	}
	s := fmt.Sprintf("polling core %s mode, %s: %d polls (%d empty), %d sleeps, %d wake-ups",
		c.Mode, where, c.Polls, c.EmptyPolls, c.Sleeps, c.Wakeups)
	if c.Steered > 0 {
		s += fmt.Sprintf(", %d queue interrupts steered to CPU %d", c.Steered, c.CPU)
	}
	if c.SteerError != "" {
		s += "; not steered: " + c.SteerError
	}
	return s
}

func dirOf(s nic.QueueStats, sec float64) dirSummary {
	return dirSummary{Frames: s.Packets, Bytes: s.Bytes, Errors: s.Errors, PPS: perSec(s.Packets, sec),
		Mbps: mbps(s.Bytes, sec), Interrupts: s.Interrupts, Doorbells: s.Notifies, Suppressed: s.Suppressed}
}

func describeDevice(dev nic.Device, promisc bool) deviceSummary {
	in := dev.Info()
	d := deviceSummary{Address: in.Address, Driver: in.Driver, Model: in.Model, MAC: in.MAC.String(), MTU: in.MTU,
		QueuePairs: in.QueuePairs, QueueSize: in.QueueSize, RxBuffers: in.RxBuffers, BufferSize: in.BufferSize,
		Vectors: in.Vectors, Features: in.Features, Promiscuous: promisc}
	if rx, err := dev.Rx(0); err == nil {
		d.MaxRxFrame = rx.MaxFrame()
	}
	if tx, err := dev.Tx(0); err == nil {
		d.MaxTxFrame = tx.MaxFrame()
	}
	return d
}

// summary prints totals, average rates and the driver's counters to the
// human writer, and as JSON to jsonOut when it is not nil. details are the
// command's own counters for the JSON object.
func (p *progress) summary(what string, jsonOut io.Writer, details map[string]any) error {
	s := p.dev.Stats()
	if p.core != nil {
		// The core reads the queues' interrupt eventfds itself.
		s.Rx.Interrupts, s.Tx.Interrupts = coreInterrupts(p.core, p.dev)
		for _, c := range p.extraCores {
			rx, tx := coreInterrupts(c, p.dev)
			s.Rx.Interrupts, s.Tx.Interrupts = s.Rx.Interrupts+rx, s.Tx.Interrupts+tx
		}
	}
	el := time.Since(p.start).Seconds()
	fmt.Fprintf(p.out, "%s: %.2fs, rx %d frames (%d bytes, %.0f pps, %.2f Mbit/s), tx %d frames (%d bytes, %.0f pps, %.2f Mbit/s), %s\n",
		what, el, s.Rx.Packets, s.Rx.Bytes, perSec(s.Rx.Packets, el), mbps(s.Rx.Bytes, el),
		s.Tx.Packets, s.Tx.Bytes, perSec(s.Tx.Packets, el), mbps(s.Tx.Bytes, el), p.extra())
	fmt.Fprintf(p.out, "%s: completions rx %d tx %d, errors rx %d tx %d, interrupts rx %d tx %d, doorbells rx %d tx %d (suppressed %d)\n",
		what, s.Rx.Packets+s.Rx.Errors, s.Tx.Packets+s.Tx.Errors, s.Rx.Errors, s.Tx.Errors,
		s.Rx.Interrupts, s.Tx.Interrupts, s.Rx.Notifies, s.Tx.Notifies, s.Rx.Suppressed+s.Tx.Suppressed)
	cs := summarizeCore(p.core)
	if cs != nil {
		fmt.Fprintf(p.out, "%s: %s\n", what, cs)
	}
	hw, hwNote := hardwareCounters(p.dev)
	fmt.Fprintf(p.out, "%s: hardware counters: %s\n", what, hardwareText(hw, hwNote))
	qs := p.queues(s, el)
	for _, q := range qs {
		fmt.Fprintf(p.out, "%s: queue %d: rx %d frames (%.0f pps), tx %d frames (%.0f pps), errors rx %d tx %d, interrupts rx %d tx %d\n",
			what, q.Queue, q.Rx.Frames, q.Rx.PPS, q.Tx.Frames, q.Tx.PPS, q.Rx.Errors, q.Tx.Errors, q.Rx.Interrupts, q.Tx.Interrupts)
	}
	if jsonOut == nil {
		return nil
	}
	return json.NewEncoder(jsonOut).Encode(trafficSummary{Command: what, Device: describeDevice(p.dev, p.promisc),
		Core: cs, Seconds: el, Rx: dirOf(s.Rx, el), Tx: dirOf(s.Tx, el), Queues: qs, Hardware: hw, HardwareNote: hwNote,
		Details: details})
}

// queues summarizes each queue pair when there are several, with the
// interrupts its core took and the core (queue i's is cores[i]).
func (p *progress) queues(s nic.Stats, el float64) []queueSummary {
	n := max(len(s.RxQueues), len(s.TxQueues))
	if n < 2 {
		return nil
	}
	cores := append([]*lcore.Core{p.core}, p.extraCores...)
	qs := make([]queueSummary, n)
	for i := range qs {
		qs[i].Queue = i
		var c *lcore.Core
		if i < len(cores) {
			c = cores[i]
		}
		if i < len(s.RxQueues) {
			qs[i].Rx = dirOf(s.RxQueues[i], el)
			if q, err := p.dev.Rx(i); err == nil && c != nil {
				qs[i].Rx.Interrupts = c.Interrupts(q)
			}
		}
		if i < len(s.TxQueues) {
			qs[i].Tx = dirOf(s.TxQueues[i], el)
			if q, err := p.dev.Tx(i); err == nil && c != nil {
				qs[i].Tx.Interrupts = c.Interrupts(q)
			}
		}
		if i > 0 { // queue 0's core is the summary's Core
			qs[i].Core = summarizeCore(c)
		}
	}
	return qs
}

// jsonOut is stdout under -json, else nil.
func (d *deviceFlags) jsonOut(o stdio) io.Writer {
	if d.json {
		return o.out
	}
	return nil
}

// describe prints what was opened.
func describe(out io.Writer, dev nic.Device) {
	in := dev.Info()
	if in.Rebound {
		fmt.Fprintf(out, "bound %s to vfio-pci (was %s); it goes back on exit\n", in.Address, driverName(in.PreviousDriver))
	}
	mtu := fmt.Sprintf(", MTU %d", in.MTU)
	if tx, err := dev.Tx(0); err == nil {
		mtu += fmt.Sprintf(" (frames up to %d bytes)", tx.MaxFrame())
	}
	fmt.Fprintf(out, "%s: %s (%s driver), MAC %s%s, %d queue pair(s) of %d descriptors, %d receive buffers of %d bytes, %d MSI-X vectors, features %v\n",
		in.Address, in.Model, in.Driver, in.MAC, mtu, in.QueuePairs, in.QueueSize, in.RxBuffers, in.BufferSize, in.Vectors, in.Features)
}
