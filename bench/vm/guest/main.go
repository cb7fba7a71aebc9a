// Command guest is bench/vm's payload: in a vfnic guest it runs each
// configuration of the side-by-side benchmark in turn (vfnic's pktgen and
// sink in each polling mode, DPDK testpmd's txonly and rxonly, the Linux
// driver through AF_PACKET) on each NIC, A B A B, and tells the host on
// stdout where each run begins and ends:
//
//	BENCH begin NIC DIR TOOL REP
//	BENCH end NIC DIR TOOL REP RX-RATE STATUS
//
// The host counts a TX run's frames at its socket between the two lines and
// keeps QEMU's socket supplied during an RX run; RX-RATE is the guest's
// count: the median of the tool's per-second receive rates once traffic
// flows, its first and last seconds left out (0 for TX). STATUS is "ok" or
// "error:" and why. Every other line is a tool's output, for the log.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vfnic/vfnic/bench/vm/internal/stats"
	"github.com/vfnic/vfnic/bench/vm/internal/tool"
	"golang.org/x/sys/unix"
)

// Where the host put things (bench/vm's qemu.Config.Files).
const (
	vfnicBin = "/vfnic/bin/vfnic"
	// vfnicBaseBin is the base build's vfnic (bench-vm -base).
	vfnicBaseBin = "/vfnic/bin/vfnic-base"
	testpmd      = "/opt/dpdk/bin/dpdk-testpmd"
	dpdkLibs     = "/opt/dpdk/lib"
	dpdkPMDs     = "/opt/dpdk/pmds"
	frameSize    = 64 // bytes without FCS, as testpmd's txonly default
)

// nicSpec is one NIC under test: a name for the table, its PCI address,
// and its DPDK poll-mode driver plugin.
type nicSpec struct{ name, addr, pmd string }

func main() {
	dur := flag.Duration("dur", 5*time.Second, "traffic time per run")
	reps := flag.Int("reps", 2, "runs of each configuration")
	nics := flag.String("nics", "", "NAME=PCI-ADDR=PMD,... (PMD: the DPDK plugin's file name)")
	tools := flag.String("tools", "dpdk,busy,adaptive,interrupt,linux", "tools, in the order they alternate")
	dirs := flag.String("dirs", "tx,rx", "directions")
	cpu := flag.Int("cpu", 1, "the CPU of the polling thread (vfnic -cpu, testpmd's forwarding lcore)")
	flag.Parse()
	var specs []nicSpec
	for _, s := range strings.Split(*nics, ",") {
		f := strings.Split(s, "=")
		if len(f) != 3 {
			fmt.Fprintf(os.Stderr, "guest: bad -nics entry %q\n", s)
			os.Exit(2)
		}
		specs = append(specs, nicSpec{f[0], f[1], f[2]})
	}
	// DPDK loads plugins only from directories no other user may write
	// to, up to the root (the initramfs's root is world-writable), and
	// wants /var/run.
	if err := os.Chmod("/", 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "guest:", err)
	}
	_ = os.MkdirAll("/var/run", 0o755)
	b := &bench{dur: *dur, cpu: *cpu}
	ts, ds := strings.Split(*tools, ","), strings.Split(*dirs, ",")
	for rep := 1; rep <= *reps; rep++ {
		for _, n := range specs {
			for _, d := range ds {
				for _, t := range ts {
					if t != "linux" {
						b.run(n, d, t, rep)
					}
				}
			}
			if slices.Contains(ts, "linux") {
				b.linux(n, ds, rep)
			}
		}
	}
}

type bench struct {
	dur time.Duration
	cpu int
}

// run runs one configuration on a vfio-bound NIC and reports it.
func (b *bench) run(n nicSpec, dir, name string, rep int) {
	fmt.Printf("BENCH begin %s %s %s %d\n", n.name, dir, name, rep)
	time.Sleep(300 * time.Millisecond) // the host acts on the line over the serial console
	var (
		args []string
		env  []string
		rate *regexp.Regexp // a per-second receive rate in the tool's output
		stop time.Duration  // when to interrupt the tool, 0 if it stops by itself
	)
	core := strconv.Itoa(b.cpu)
	base, idle, baseBuild, err := tool.Parse(name) // adaptive:1ms is adaptive with -idle 1ms
	if err != nil {
		b.end(n, dir, name, rep, 0, err)
		return
	}
	switch base {
	case "dpdk":
		mode := "txonly"
		if dir == "rx" {
			mode = "rxonly"
		}
		// Main lcore 0, one forwarding lcore on the polling CPU; no
		// files in /dev/hugepages or /var/run (--in-memory).
		args = []string{testpmd, "-l", "0," + core, "-n", "1", "--in-memory", "--no-telemetry", "-a", n.addr,
			"-d", filepath.Join(dpdkPMDs, n.pmd), "-d", filepath.Join(dpdkPMDs, "librte_mempool_ring.so.23"),
			"--", "--forward-mode=" + mode, "--nb-cores=1", "--rxq=1", "--txq=1", "--stats-period=1"}
		env = []string{"LD_LIBRARY_PATH=" + dpdkLibs}
		rate = regexp.MustCompile(`Rx-pps:\s+(\d+)`)
		// testpmd forwards until SIGINT; its start-up (EAL, the port)
		// takes a second or two under TCG. Its output to a pipe is
		// block-buffered, so the start cannot be seen as it happens.
		stop = b.dur + 3*time.Second
	case "busy", "adaptive", "interrupt":
		cmd := "pktgen"
		if dir == "rx" {
			cmd = "sink"
		}
		bin := vfnicBin
		if baseBuild {
			bin = vfnicBaseBin
		}
		args = []string{bin, cmd, "-mode", base, "-cpu", core, "-duration", b.dur.String(), "-progress", "1s"}
		if idle != "" {
			args = append(args, "-idle", idle)
		}
		if cmd == "pktgen" {
			args = append(args, "-count", "0", "-size", strconv.Itoa(frameSize))
		}
		args = append(args, n.addr)
		rate = regexp.MustCompile(`\brx\s+(\d+) pps`)
	default:
		b.end(n, dir, name, rep, 0, fmt.Errorf("tool %q does not run on a vfio-bound NIC", name))
		return
	}
	before, t0 := readInterrupts(), time.Now()
	samples, err := b.exec(args, env, rate, stop)
	fmt.Printf("guest: %s %s %s run %d: %s\n", n.name, dir, name, rep, interruptRates(before, readInterrupts(), time.Since(t0)))
	r := 0.0
	if dir == "rx" {
		r = steady(samples)
		if r == 0 && err == nil {
			// No rate is a failed run, not a rate of 0 in the medians.
			err = fmt.Errorf("no per-second receive rate in the tool's output (%d samples)", len(samples))
		}
	}
	b.end(n, dir, name, rep, r, err)
}

func (b *bench) end(n nicSpec, dir, tool string, rep int, rate float64, err error) {
	status := "ok"
	if err != nil {
		status = "error:" + strings.ReplaceAll(err.Error(), "\n", " ")
	}
	fmt.Printf("BENCH end %s %s %s %d %.0f %s\n", n.name, dir, tool, rep, rate, status)
}

// exec runs a tool, echoing its output, and collects the per-second rates
// rate matches. With stop > 0 the tool is interrupted (SIGINT) that long
// after it started, and an exit on that signal is a success.
func (b *bench) exec(args, env []string, rate *regexp.Regexp, stop time.Duration) ([]float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), b.dur+60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGKILL) }
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	waited := make(chan error, 1)
	go func() { err := cmd.Wait(); pw.Close(); waited <- err }()
	var interrupted atomic.Bool
	if stop > 0 {
		t := time.AfterFunc(stop, func() {
			interrupted.Store(true)
			_ = cmd.Process.Signal(syscall.SIGINT)
		})
		defer t.Stop()
	}
	var samples []float64
	var tail []string // the last lines, for an error
	sc := bufio.NewScanner(pr)
	for sc.Scan() {
		l := sc.Text()
		fmt.Println("  | " + l)
		tail = append(tail, l)
		if len(tail) > 5 {
			tail = tail[1:]
		}
		if m := rate.FindStringSubmatch(l); m != nil {
			if v, err := strconv.ParseFloat(m[1], 64); err == nil {
				samples = append(samples, v)
			}
		}
	}
	err := <-waited
	var ee *exec.ExitError
	if errors.As(err, &ee) && interrupted.Load() {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGINT {
			err = nil // it re-raised the SIGINT it was asked to stop with
		}
	}
	if err != nil {
		return samples, fmt.Errorf("%s: %v: %s", filepath.Base(args[0]), err, strings.Join(tail, " / "))
	}
	return samples, nil
}

// steady is the median of per-second rates once traffic flows: leading
// zeros, the first second with traffic (a partial one) and the last (cut
// short) left out.
func steady(s []float64) float64 {
	for len(s) > 0 && s[0] == 0 {
		s = s[1:]
	}
	if len(s) > 3 {
		s = s[1 : len(s)-1]
	}
	return stats.Median(s)
}

// linux gives the NIC to its kernel driver, runs the Linux rows (an
// AF_PACKET sender; the interface's rx_packets), and takes it back.
func (b *bench) linux(n nicSpec, dirs []string, rep int) {
	ifname, err := toKernel(n.addr)
	for _, d := range dirs {
		if err != nil {
			fmt.Printf("BENCH begin %s %s linux %d\n", n.name, d, rep)
			b.end(n, d, "linux", rep, 0, err)
			continue
		}
		fmt.Printf("BENCH begin %s %s linux %d\n", n.name, d, rep)
		time.Sleep(300 * time.Millisecond)
		var r float64
		var rerr error
		if d == "tx" {
			rerr = b.linuxTx(ifname)
		} else {
			r, rerr = b.linuxRx(ifname)
		}
		b.end(n, d, "linux", rep, r, rerr)
	}
	if err := toVFIO(n.addr, ifname); err != nil {
		fmt.Printf("guest: giving %s back to vfio-pci: %v\n", n.addr, err)
		os.Exit(1)
	}
}

func sh(args ...string) error {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// toKernel unbinds the NIC from vfio-pci (vfnic unbind) and waits for the
// kernel driver's interface, which it brings up.
func toKernel(addr string) (string, error) {
	if err := sh(vfnicBin, "unbind", addr); err != nil {
		return "", err
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		// A virtio NIC's interface hangs off its virtio device.
		dev := filepath.Join("/sys/bus/pci/devices", addr)
		m, _ := filepath.Glob(dev + "/net/*")
		v, _ := filepath.Glob(dev + "/virtio*/net/*")
		if m = append(m, v...); len(m) == 1 {
			name := filepath.Base(m[0])
			return name, sh("ip", "link", "set", "dev", name, "up")
		}
	}
	return "", fmt.Errorf("%s: no network interface 10 s after unbinding from vfio-pci", addr)
}

func toVFIO(addr, ifname string) error {
	if ifname != "" {
		_ = sh("ip", "link", "set", "dev", ifname, "down")
	}
	return sh(vfnicBin, "bind", "-force", addr)
}

// linuxTx writes 64-byte broadcast frames to an AF_PACKET socket for dur,
// as fast as the kernel takes them (what a Linux sender without a kernel
// bypass does; the host counts what arrives).
func (b *bench) linuxTx(ifname string) error {
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return err
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0) // protocol 0: send only
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Ifindex: ifi.Index}); err != nil {
		return err
	}
	f := make([]byte, frameSize)
	copy(f, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(f[6:], ifi.HardwareAddr)
	f[12], f[13] = 0x88, 0xb5 // IEEE local experimental
	var sent, refused int
	start := time.Now()
	for time.Since(start) < b.dur {
		for range 256 {
			if _, err := unix.Write(fd, f); err != nil {
				if errors.Is(err, unix.ENOBUFS) || errors.Is(err, unix.EAGAIN) {
					refused++
					continue
				}
				return err
			}
			sent++
		}
	}
	fmt.Printf("  | AF_PACKET on %s: %d frames written in %v, %d refused (ENOBUFS)\n", ifname, sent, b.dur, refused)
	return nil
}

// linuxRx samples the interface's rx_packets every second for dur while
// the host sends.
func (b *bench) linuxRx(ifname string) (float64, error) {
	path := filepath.Join("/sys/class/net", ifname, "statistics", "rx_packets")
	read := func() (uint64, error) {
		v, err := os.ReadFile(path)
		if err != nil {
			return 0, err
		}
		return strconv.ParseUint(strings.TrimSpace(string(v)), 10, 64)
	}
	prev, err := read()
	if err != nil {
		return 0, err
	}
	at := time.Now()
	var samples []float64
	for range int(b.dur / time.Second) {
		time.Sleep(time.Second)
		v, err := read()
		if err != nil {
			return 0, err
		}
		now := time.Now()
		r := float64(v-prev) / now.Sub(at).Seconds()
		fmt.Printf("  | %s rx_packets %d: %.0f pps\n", ifname, v, r)
		samples = append(samples, r)
		prev, at = v, now
	}
	return steady(samples), nil
}

// interruptKinds are the /proc/interrupts rows that tell what a tool costs
// the guest's other CPU: its timer ticks, and the inter-processor
// interrupts of a thread waking another (RES) or of a cross-CPU call (CAL).
var interruptKinds = []string{"LOC", "RES", "CAL"}

// readInterrupts returns the counts of interruptKinds per CPU, nil if
// /proc/interrupts cannot be read.
func readInterrupts() map[string][]uint64 {
	data, err := os.ReadFile("/proc/interrupts")
	if err != nil {
		return nil
	}
	lines := strings.Split(string(data), "\n")
	ncpu := len(strings.Fields(lines[0]))
	m := map[string][]uint64{}
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		if len(f) < ncpu+1 {
			continue
		}
		kind := strings.TrimSuffix(f[0], ":")
		if !slices.Contains(interruptKinds, kind) {
			continue
		}
		for _, v := range f[1 : 1+ncpu] {
			n, _ := strconv.ParseUint(v, 10, 64)
			m[kind] = append(m[kind], n)
		}
	}
	return m
}

// interruptRates formats the per-second rates between two readings, per
// CPU: "cpu0 LOC 250/s RES 3/s CAL 0/s, cpu1 ...".
func interruptRates(a, b map[string][]uint64, d time.Duration) string {
	if a == nil || b == nil || d <= 0 {
		return "interrupts: /proc/interrupts unreadable"
	}
	var cpus []string
	for cpu := 0; cpu < len(b["LOC"]); cpu++ {
		parts := []string{fmt.Sprintf("cpu%d", cpu)}
		for _, k := range interruptKinds {
			if cpu < len(a[k]) && cpu < len(b[k]) {
				parts = append(parts, fmt.Sprintf("%s %.0f/s", k, float64(b[k][cpu]-a[k][cpu])/d.Seconds()))
			}
		}
		cpus = append(cpus, strings.Join(parts, " "))
	}
	return "interrupts " + strings.Join(cpus, ", ")
}
