// Command vm is the project's side-by-side packet-rate benchmark (make
// bench-vm): one guest, one run, vfnic against DPDK testpmd and the
// guest's Linux driver on the same emulated NICs, 64-byte frames.
//
// It boots a QEMU guest with one NIC per model under test (virtio-net with
// packed rings, virtio-net with split rings, igb), each on its own dgram
// netdev, and runs bench/vm/guest there. For every NIC and direction the
// tools alternate, A B A B: DPDK testpmd (txonly / rxonly, from Debian's
// packages, fetched by fetch-dpdk.sh and put into the guest's initramfs),
// vfnic's pktgen / sink on a polling core in busy, adaptive and interrupt
// mode, and the Linux driver (an AF_PACKET sender; rx_packets). TX is
// counted here at the host socket; RX is counted in the guest while this
// side keeps QEMU's socket supplied (qemu/hostnet.Feed). The table gives
// each configuration's median over its runs and the ratio to DPDK.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/vfnic/vfnic/bench/vm/internal/stats"
	"github.com/vfnic/vfnic/bench/vm/internal/tool"
	"github.com/vfnic/vfnic/qemu"
	"github.com/vfnic/vfnic/qemu/hostnet"
	"golang.org/x/sys/unix"
)

// nicKind is a NIC model the benchmark knows: how QEMU builds it and
// DPDK's plugin for it.
type nicKind struct {
	nic qemu.NIC
	pmd string
}

var kinds = map[string]nicKind{
	"packed": {qemu.NIC{Model: qemu.VirtioNet, Packed: true}, "librte_net_virtio.so.23"},
	"split":  {qemu.NIC{Model: qemu.VirtioNet}, "librte_net_virtio.so.23"},
	"igb":    {qemu.NIC{Model: qemu.IGB}, "librte_net_e1000.so.23"},
}

func main() {
	// 5 s runs of one tool differed by up to 2.3x on a 2-core host; 15 s
	// and three runs give a median that a fourth run rarely moves.
	dur := flag.Duration("dur", 15*time.Second, "traffic time per run")
	reps := flag.Int("reps", 3, "runs of each configuration (A B A B)")
	nics := flag.String("nics", "packed,split,igb", "NICs under test: packed, split (virtio-net), igb")
	tools := flag.String("tools", "dpdk,busy,adaptive,interrupt,linux", "tools, in the order they alternate; a vfnic mode may name its idle interval, as adaptive:1ms (vfnic -idle)")
	dirs := flag.String("dirs", "tx,rx", "directions")
	verbose := flag.Bool("v", false, "print the guest's and the tools' output")
	baseDir := flag.String("base", "", "a checkout of the base build (git worktree add DIR COMMIT): tools ending in "+tool.BaseSuffix+" run its vfnic, as busy"+tool.BaseSuffix)
	flag.Parse()
	if err := checkTools(*tools, *dirs); err != nil {
		fmt.Fprintln(os.Stderr, "bench-vm:", err)
		os.Exit(2)
	}
	if strings.Contains(*tools, tool.BaseSuffix) != (*baseDir != "") {
		fmt.Fprintf(os.Stderr, "bench-vm: -base and tools ending in %s go together\n", tool.BaseSuffix)
		os.Exit(2)
	}
	if err := run(*dur, *reps, strings.Split(*nics, ","), *tools, *dirs, *baseDir, *verbose); err != nil {
		fmt.Fprintln(os.Stderr, "bench-vm:", err)
		os.Exit(1)
	}
}

// checkTools refuses a tool or direction the guest would not know, before
// a guest boots for it.
func checkTools(tools, dirs string) error {
	for _, t := range strings.Split(tools, ",") {
		if _, _, _, err := tool.Parse(t); err != nil {
			return err
		}
	}
	for _, d := range strings.Split(dirs, ",") {
		if d != "tx" && d != "rx" {
			return fmt.Errorf("unknown direction %q (want tx or rx)", d)
		}
	}
	return nil
}

// port is the host's side of one guest NIC.
type port struct {
	name string
	nd   qemu.Netdev
	fd   int // bound to nd.HostPort: the guest's frames arrive here

	mu          sync.Mutex
	counting    bool
	n           int
	first, last time.Time
	feed        context.CancelFunc
	fed         chan hostnet.FeedStats
}

// count reads the guest's frames until ctx ends, counting them while a TX
// run is on.
func (p *port) count(ctx context.Context) {
	r := hostnet.NewBatchReader(p.fd, 64, 2048)
	pfd := []unix.PollFd{{Fd: int32(p.fd), Events: unix.POLLIN}}
	for ctx.Err() == nil {
		k, err := r.Read()
		if err != nil || k == 0 {
			_, _ = unix.Poll(pfd, 100)
			continue
		}
		now := time.Now()
		p.mu.Lock()
		if p.counting {
			if p.n == 0 {
				p.first = now
			}
			p.n += k
			p.last = now
		}
		p.mu.Unlock()
	}
}

func (p *port) beginTx() {
	p.mu.Lock()
	p.counting, p.n = true, 0
	p.mu.Unlock()
}

// endTx stops counting and returns the rate between the first and the
// last batch that arrived.
func (p *port) endTx() (float64, int) {
	time.Sleep(200 * time.Millisecond) // frames still in QEMU's hands
	p.mu.Lock()
	defer p.mu.Unlock()
	p.counting = false
	if p.n < 2 || !p.last.After(p.first) {
		return 0, p.n
	}
	return float64(p.n) / p.last.Sub(p.first).Seconds(), p.n
}

// beginRx keeps QEMU's socket supplied with 64-byte broadcast frames.
func (p *port) beginRx(fd int) {
	f := make([]byte, 64)
	copy(f, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02, 0, 0, 0, 0, 1})
	f[12], f[13] = 0x88, 0xb5 // IEEE local experimental
	w := hostnet.NewBatchWriter(fd, unix.SockaddrInet4{Port: p.nd.QEMUPort, Addr: [4]byte{127, 0, 0, 1}}, f, 64)
	ctx, cancel := context.WithCancel(context.Background())
	p.feed, p.fed = cancel, make(chan hostnet.FeedStats, 1)
	go func() { p.fed <- hostnet.Feed(ctx, w, p.nd.QEMUPort, 0) }()
}

func (p *port) endRx() hostnet.FeedStats {
	if p.feed == nil {
		return hostnet.FeedStats{}
	}
	p.feed()
	p.feed = nil
	return <-p.fed
}

// result is one run.
type result struct {
	nic, dir, tool string
	rep            int
	rate           float64
	err            string
}

func run(dur time.Duration, reps int, nicNames []string, tools, dirs, baseDir string, verbose bool) error {
	toolList, dirList := strings.Split(tools, ","), strings.Split(dirs, ",")
	ctx := context.Background()
	tmp, err := os.MkdirTemp("", "vfnic-bench-vm-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	cfg := qemu.Config{
		MemoryMB:  2048,
		Hugepages: 384, // vfnic's rings and buffers, and testpmd's mbuf pools
		Timeout:   time.Minute + time.Duration(reps*len(nicNames)*len(dirList)*len(toolList))*(dur+15*time.Second),
	}
	// The guest's programs: vfnic's CLI and the payload, static.
	cli, payload := filepath.Join(tmp, "vfnic"), filepath.Join(tmp, "guest")
	fmt.Fprintln(os.Stderr, "bench-vm: building vfnic and the guest payload")
	if err := qemu.BuildBinary(ctx, "github.com/vfnic/vfnic/cmd/vfnic", cli); err != nil {
		return err
	}
	if err := qemu.BuildBinary(ctx, "github.com/vfnic/vfnic/bench/vm/guest", payload); err != nil {
		return err
	}
	cfg.Files = append(cfg.Files, qemu.File{Host: cli, Guest: "/vfnic/bin/vfnic", Mode: 0o755})
	if baseDir != "" {
		// The base build's CLI, built from its own checkout and go.mod.
		baseCLI := filepath.Join(tmp, "vfnic-base")
		cmd := exec.CommandContext(ctx, "go", "build", "-C", baseDir, "-o", baseCLI, "./cmd/vfnic")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("build the base vfnic in %s: %v: %s", baseDir, err, out)
		}
		cfg.Files = append(cfg.Files, qemu.File{Host: baseCLI, Guest: "/vfnic/bin/vfnic-base", Mode: 0o755})
	}
	if strings.Contains(tools, "dpdk") {
		files, err := dpdkFiles(filepath.Join(qemu.CacheDir(), "dpdk"))
		if err != nil {
			return err
		}
		cfg.Files = append(cfg.Files, files...)
	}
	var ports []*port
	var specs []string
	slot := 4
	for _, name := range nicNames {
		k, ok := kinds[name]
		if !ok {
			return fmt.Errorf("unknown NIC %q (want packed, split or igb)", name)
		}
		nd, err := qemu.NewDgram()
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := unix.Bind(fd, &unix.SockaddrInet4{Port: nd.HostPort, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
			return err
		}
		// A TX run's frames must not be dropped here.
		if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 64<<20) != nil {
			_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 8<<20)
		}
		n := k.nic
		n.Slot, n.Net, n.Bind = slot, nd, qemu.BindVFIO
		cfg.NICs = append(cfg.NICs, n)
		// The Linux rows hand the NIC to its kernel driver.
		for _, m := range qemu.LinuxModules(n.Model) {
			if !slices.Contains(cfg.Modules, m) {
				cfg.Modules = append(cfg.Modules, m)
			}
		}
		specs = append(specs, fmt.Sprintf("%s=%s=%s", name, n.GuestAddr(), k.pmd))
		ports = append(ports, &port{name: name, nd: nd, fd: fd})
		slot++
	}
	cctx, stop := context.WithCancel(ctx)
	defer stop()
	for _, p := range ports {
		go p.count(cctx)
	}
	sendFd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(sendFd)

	var results []result
	var mu sync.Mutex
	lines := &lineWriter{fn: func(l string) {
		f := strings.Fields(l)
		if len(f) < 6 || f[0] != "BENCH" {
			if verbose {
				fmt.Fprintln(os.Stderr, "guest| "+l)
			}
			return
		}
		var p *port
		for _, q := range ports {
			if q.name == f[2] {
				p = q
			}
		}
		if p == nil {
			return
		}
		dir, tool := f[3], f[4]
		rep, _ := strconv.Atoi(f[5])
		switch f[1] {
		case "begin":
			if dir == "tx" {
				p.beginTx()
			} else {
				p.beginRx(sendFd)
			}
		case "end":
			if len(f) < 8 {
				return
			}
			r := result{nic: p.name, dir: dir, tool: tool, rep: rep}
			if st := strings.Join(f[7:], " "); st != "ok" {
				r.err = strings.TrimPrefix(st, "error:")
			}
			note := ""
			if dir == "tx" {
				var n int
				r.rate, n = p.endTx()
				note = fmt.Sprintf("host received %d frames", n)
			} else {
				r.rate, _ = strconv.ParseFloat(f[6], 64)
				fs := p.endRx()
				note = fmt.Sprintf("host sent %d frames in %v, QEMU's socket found empty at %d of %d checks",
					fs.Sent, fs.Elapsed.Round(time.Millisecond), fs.Empty, fs.Checks)
			}
			if r.err != "" {
				note += "; FAILED: " + r.err
			}
			fmt.Fprintf(os.Stderr, "bench-vm: %-6s %s %-9s run %d: %8.0f frames/s (%s)\n", p.name, dir, tool, rep, r.rate, note)
			mu.Lock()
			results = append(results, r)
			mu.Unlock()
		}
	}}
	cfg.Output = lines
	args := []string{"-dur", dur.String(), "-reps", strconv.Itoa(reps), "-nics", strings.Join(specs, ","),
		"-tools", tools, "-dirs", dirs}
	fmt.Fprintf(os.Stderr, "bench-vm: booting a guest with %s; %d runs of %v per configuration\n", strings.Join(nicNames, ", "), reps, dur)
	start := time.Now()
	res, err := qemu.Run(ctx, cfg, qemu.Command{Path: payload, Args: args})
	lines.Flush()
	if err != nil {
		if res != nil {
			fmt.Fprintln(os.Stderr, tail(res.Output, 40))
		}
		return err
	}
	fmt.Fprintf(os.Stderr, "bench-vm: done in %v (guest kernel %s)\n", time.Since(start).Round(time.Second), res.KernelVersion)
	table(os.Stdout, results, nicNames, toolList, dirList, dur)
	return nil
}

// dpdkFiles fetches testpmd and its libraries (fetch-dpdk.sh) into dir once
// and returns them as guest files.
func dpdkFiles(dir string) ([]qemu.File, error) {
	_, self, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(self), "fetch-dpdk.sh")
	if _, err := os.Stat(script); err != nil {
		script = "bench/vm/fetch-dpdk.sh" // run from the module root
	}
	cmd := exec.Command("bash", script, dir)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("fetching DPDK from Debian's archive: %w", err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "manifest"))
	if err != nil {
		return nil, err
	}
	var files []qemu.File
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(l)
		if len(f) != 2 {
			return nil, fmt.Errorf("%s/manifest: bad line %q", dir, l)
		}
		files = append(files, qemu.File{Host: f[0], Guest: f[1]})
	}
	return files, nil
}

// table prints the medians per NIC, direction and tool, with the ratio to
// DPDK (for every tool, whatever its place in the order), every run's
// figure and the spread of the runs ((max-min)/median), which says whether
// the runs were long enough to agree.
func table(w io.Writer, rs []result, nics, tools, dirs []string, dur time.Duration) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "\n64-byte frames/s, %v runs; TX counted at the host socket, RX in the guest; median of the runs, ratio to DPDK testpmd, spread (max-min)/median\n", dur)
	fmt.Fprintln(tw, "nic\tdir\ttool\tmedian\tvs dpdk\tspread\truns\t")
	for _, n := range nics {
		for _, d := range dirs {
			type cell struct {
				med, spread float64
				runs        []string
			}
			cells := map[string]cell{}
			for _, t := range tools {
				var v []float64
				var c cell
				for _, r := range rs {
					if r.nic != n || r.dir != d || r.tool != t {
						continue
					}
					if r.err != "" {
						c.runs = append(c.runs, "failed")
						continue
					}
					v = append(v, r.rate)
					c.runs = append(c.runs, fmt.Sprintf("%.0f", r.rate))
				}
				c.med = stats.Median(v)
				if len(v) > 1 && c.med > 0 {
					c.spread = (slices.Max(v) - slices.Min(v)) / c.med
				}
				cells[t] = c
			}
			for _, t := range tools {
				c := cells[t]
				ratio, spread := "-", "-"
				if base := cells["dpdk"].med; base > 0 && t != "dpdk" && c.med > 0 {
					ratio = fmt.Sprintf("%.2fx", c.med/base)
				}
				if len(c.runs) > 1 && c.med > 0 {
					spread = fmt.Sprintf("%.0f%%", 100*c.spread)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%.0f\t%s\t%s\t%s\t\n", n, d, t, c.med, ratio, spread, strings.Join(c.runs, " "))
			}
		}
	}
	tw.Flush()
	var failed []string
	for _, r := range rs {
		if r.err != "" {
			failed = append(failed, fmt.Sprintf("%s %s %s run %d: %s", r.nic, r.dir, r.tool, r.rep, r.err))
		}
	}
	if len(failed) > 0 {
		fmt.Fprintln(w, "\nfailed runs:")
		for _, f := range failed {
			fmt.Fprintln(w, "  "+f)
		}
	}
}

func tail(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

// lineWriter calls fn with each complete line written to it.
type lineWriter struct {
	mu  sync.Mutex
	buf []byte
	fn  func(string)
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := strings.IndexByte(string(w.buf), '\n')
		if i < 0 {
			return len(p), nil
		}
		w.fn(strings.TrimRight(string(w.buf[:i]), "\r"))
		w.buf = w.buf[i+1:]
	}
}

// Flush hands over a last line without a newline.
func (w *lineWriter) Flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.buf) > 0 {
		w.fn(string(w.buf))
		w.buf = nil
	}
}
