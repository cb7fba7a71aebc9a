// Command guest is bench/netstack's payload in the QEMU guest: it runs the
// same Go UDP echo and HTTP server on vfnic with package netstack and on
// the guest's Linux sockets (a NIC of the same kind, in a network
// namespace of its own so that traffic crosses the emulated wire), A B A
// B, loads each from a client on a third NIC, and prints one line per
// measurement ("BENCH ...") and a table.
//
//	guest [-reps N] [-dur D] [-mode M] [-profile FILE]      the orchestrator
//	guest serve -stack netstack|linux [-mode M] [-dev PCI] [-ip A] [-profile FILE]
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/vfnic/vfnic/lcore"
	"github.com/vfnic/vfnic/netstack"
	"github.com/vfnic/vfnic/nic"
	_ "github.com/vfnic/vfnic/nic/igb"
	_ "github.com/vfnic/vfnic/nic/virtio"
	"github.com/vfnic/vfnic/qemu"
)

// Addresses on the emulated wire: the netstack, the client, the Linux
// server (in its own network namespace).
const (
	ipNetstack = "10.0.9.1"
	ipClient   = "10.0.9.2"
	ipLinux    = "10.0.9.3"
	bigSize    = 1 << 20
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "serve" {
		if err := serve(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "serve:", err)
			os.Exit(1)
		}
		return
	}
	reps := flag.Int("reps", 2, "runs of each server (A B A B)")
	dur := flag.Duration("dur", 5*time.Second, "time of each measurement")
	profile := flag.String("profile", "", "profile the netstack server in one more run (not counted), written here")
	mode := flag.String("mode", "adaptive", "the netstack's polling cores: busy, adaptive or interrupt")
	b := flag.String("b", "", "serve flags of a second netstack server (netstack-b, e.g. \"-mode interrupt\"), run in turn with the others: A B C A B C")
	flag.Parse()
	if err := orchestrate(*reps, *dur, *profile, *mode, strings.Fields(*b)); err != nil {
		fmt.Fprintln(os.Stderr, "bench-netstack:", err)
		os.Exit(1)
	}
}

// serve runs the UDP echo server (port 7) and the HTTP server (port 80:
// /small, a short body; /big, 1 MiB) on the chosen stack until SIGTERM.
func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	stack := fs.String("stack", "linux", "netstack or linux")
	dev := fs.String("dev", "", "the vfnic NIC's PCI address (netstack)")
	ip := fs.String("ip", ipNetstack, "the netstack's address")
	profile := fs.String("profile", "", "write a CPU profile here")
	mode := fs.String("mode", "adaptive", "the netstack's polling cores: busy, adaptive or interrupt")
	coreTx := fs.Bool("core", false, "netstack.Config.CoreTransmit: the polling cores write the packets")
	gso := fs.Bool("gso", false, "netstack.Config.GSO: TCP segments of up to 64 KiB, cut into packets before the link")
	noGRO := fs.Bool("no-gro", false, "netstack.Config.NoGRO: no coalescing of received TCP segments")
	_ = fs.Parse(args)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	var ln net.Listener
	var pc net.PacketConn
	var closeAll func()
	switch *stack {
	case "netstack":
		d, err := nic.Open(context.Background(), *dev, nic.Config{})
		if err != nil {
			return err
		}
		m, err := lcore.ParseMode(*mode)
		if err != nil {
			_ = d.Close()
			return err
		}
		n, err := netstack.New(d, netstack.Config{Addrs: []netip.Prefix{netip.MustParsePrefix(*ip + "/24")}, Mode: m, CoreTransmit: *coreTx, GSO: *gso, NoGRO: *noGRO})
		if err != nil {
			_ = d.Close()
			return err
		}
		closeAll = func() { _ = n.Close(); _ = d.Close() }
		if ln, err = n.Listen("tcp", ":80"); err == nil {
			pc, err = n.ListenPacket("udp", ":7")
		}
		if err != nil {
			closeAll()
			return err
		}
	case "linux":
		var err error
		if ln, err = net.Listen("tcp", ":80"); err != nil {
			return err
		}
		if pc, err = net.ListenPacket("udp", ":7"); err != nil {
			return err
		}
		closeAll = func() { _ = ln.Close(); _ = pc.Close() }
	default:
		return fmt.Errorf("unknown stack %q", *stack)
	}
	big := make([]byte, bigSize)
	mux := http.NewServeMux()
	mux.HandleFunc("/small", func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "vfnic\n") })
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(big) })
	mux.HandleFunc("/sink", func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		_, _ = fmt.Fprintf(w, "%d\n", n)
	})
	go func() { _ = http.Serve(ln, mux) }()
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(buf[:n], from)
		}
	}()
	if *profile != "" {
		f, err := os.Create(*profile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer func() { pprof.StopCPUProfile(); _ = f.Close() }()
	}
	fmt.Println("ready")
	<-stop
	closeAll()
	return nil
}

// server is a running server process.
type server struct {
	cmd *exec.Cmd
}

func startServer(ctx context.Context, name string, args ...string) (*server, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		ok := false
		for sc.Scan() {
			if !ok && sc.Text() == "ready" {
				ok = true
				ready <- true
			}
		}
		if !ok {
			ready <- false
		}
	}()
	select {
	case ok := <-ready:
		if !ok {
			_ = cmd.Wait()
			return nil, fmt.Errorf("%s %v: exited before it was ready", name, args)
		}
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, fmt.Errorf("%s %v: not ready after 60 s", name, args)
	}
	return &server{cmd: cmd}, nil
}

func (s *server) stop() error {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- s.cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		return fmt.Errorf("server did not stop on SIGTERM: %w", <-done)
	}
}

// measurement is one cell of one run.
type measurement struct {
	test, metric, stack string
	rep                 int
	value               float64
}

func orchestrate(reps int, dur time.Duration, profile, mode string, b []string) error {
	nics, err := qemu.GuestNICs()
	if err != nil {
		return err
	}
	var vf, srvNIC qemu.NIC
	var haveVF, haveSrv bool
	for _, n := range nics {
		switch {
		case n.Bind == qemu.BindVFIO:
			vf, haveVF = n, true
		case n.Bind == qemu.BindLinux && n.IPv4 == "":
			srvNIC, haveSrv = n, true
		}
	}
	if !haveVF || !haveSrv {
		return fmt.Errorf("want a vfnic NIC and a Linux NIC without an address for the Linux server: %+v", nics)
	}
	ifc, err := linuxInterface(srvNIC.GuestAddr())
	if err != nil {
		return err
	}
	// The Linux server's NIC goes into a network namespace of its own,
	// held by a sleeping process: otherwise the kernel would carry the
	// client's traffic to a local address over loopback.
	holder := exec.Command("unshare", "-n", "sleep", "100000")
	if err := holder.Start(); err != nil {
		return fmt.Errorf("unshare: %w", err)
	}
	defer func() { _ = holder.Process.Kill(); _ = holder.Wait() }()
	pid := strconv.Itoa(holder.Process.Pid)
	time.Sleep(200 * time.Millisecond) // the namespace exists once unshare has run
	if err := sh("ip link set " + ifc + " netns " + pid); err != nil {
		return err
	}
	if err := sh("nsenter -n -t " + pid + " sh -c 'ip link set lo up && ip addr add " + ipLinux + "/24 dev " + ifc + " && ip link set " + ifc + " up'"); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	ctx := context.Background()
	var ms []measurement
	stacks := []string{"netstack", "linux"}
	if len(b) > 0 {
		stacks = []string{"netstack", "netstack-b", "linux"}
	}
	for rep := 1; rep <= reps; rep++ {
		for _, st := range stacks {
			var srv *server
			target := ipLinux
			if st != "linux" {
				args := []string{"serve", "-stack", "netstack", "-mode", mode, "-dev", vf.GuestAddr(), "-ip", ipNetstack}
				if st == "netstack-b" {
					args = append(args, b...) // later flags win
				}
				srv, err = startServer(ctx, self, args...)
				target = ipNetstack
			} else {
				srv, err = startServer(ctx, "nsenter", "-n", "-t", pid, self, "serve", "-stack", "linux")
			}
			if err != nil {
				return err
			}
			got, err := measure(target, dur)
			if serr := srv.stop(); err == nil && serr != nil {
				err = fmt.Errorf("%s server: %w", st, serr)
			}
			if err != nil {
				return fmt.Errorf("%s run %d: %w", st, rep, err)
			}
			for _, m := range got {
				m.stack, m.rep = st, rep
				fmt.Printf("BENCH %s %s %s run %d: %.6g\n", m.test, m.metric, st, rep, m.value)
				ms = append(ms, m)
			}
		}
	}
	table(os.Stdout, ms, stacks)
	if profile != "" {
		// A run of its own, not counted: the profiler's cost stays out
		// of the table.
		fmt.Println("profiling the netstack server (one more run, not counted)")
		srv, err := startServer(ctx, self, "serve", "-stack", "netstack", "-mode", mode, "-dev", vf.GuestAddr(), "-ip", ipNetstack, "-profile", profile)
		if err != nil {
			return err
		}
		_, err = measure(ipNetstack, dur)
		if serr := srv.stop(); err == nil {
			err = serr
		}
		return err
	}
	return nil
}

// measure runs every test against the server at ip.
func measure(ip string, dur time.Duration) ([]measurement, error) {
	var out []measurement
	for _, size := range []int{64, 512} {
		name := fmt.Sprintf("udp-echo-%d", size)
		cpu0 := guestCPU()
		r, err := udpEcho(ip, size, dur)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		cpu := guestCPU() - cpu0
		out = append(out,
			measurement{test: name, metric: "pkts/s", value: float64(r.n) / r.elapsed.Seconds()},
			measurement{test: name, metric: "p50-us", value: us(pct(r.rtt, 50))},
			measurement{test: name, metric: "p99-us", value: us(pct(r.rtt, 99))},
			measurement{test: name, metric: "cpu-us/pkt", value: cpu.Seconds() * 1e6 / float64(max(r.n, 1))})
	}
	upload := make([]byte, bigSize)
	for _, c := range []struct {
		name, path string
		conns      int
		body       []byte
	}{{"http-small", "/small", 4, nil}, {"http-1MiB", "/big", 1, nil}, {"http-up-1MiB", "/sink", 1, upload}} {
		cpu0 := guestCPU()
		r, err := httpLoad("http://"+ip+c.path, c.conns, dur, c.body)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.name, err)
		}
		cpu := guestCPU() - cpu0
		out = append(out, measurement{test: c.name, metric: "req/s", value: float64(r.n) / r.elapsed.Seconds()})
		if c.path != "/small" {
			out = append(out, measurement{test: c.name, metric: "MB/s", value: float64(r.bytes) / r.elapsed.Seconds() / 1e6})
		}
		out = append(out,
			measurement{test: c.name, metric: "p50-us", value: us(pct(r.rtt, 50))},
			measurement{test: c.name, metric: "p99-us", value: us(pct(r.rtt, 99))},
			measurement{test: c.name, metric: "cpu-us/req", value: cpu.Seconds() * 1e6 / float64(max(r.n, 1))})
	}
	return out, nil
}

// result is one load run: completed operations, bytes, latencies.
type result struct {
	n       int
	bytes   int64
	rtt     []time.Duration
	elapsed time.Duration
}

// udpWindow is how many datagrams the UDP client keeps in flight.
const udpWindow = 16

// udpEcho sends size-byte datagrams to ip:7 for dur, udpWindow in
// flight, and times each echo. A datagram not echoed within 100 ms is
// counted lost and its slot reused.
func udpEcho(ip string, size int, dur time.Duration) (result, error) {
	c, err := net.Dial("udp", ip+":7")
	if err != nil {
		return result{}, err
	}
	defer c.Close()
	// A first echo makes sure the path (ARP) is up before the clock runs.
	if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return result{}, err
	}
	buf := make([]byte, 2048)
	for i := 0; ; i++ {
		if _, err := c.Write(make([]byte, size)); err != nil {
			return result{}, err
		}
		if err := c.SetReadDeadline(time.Now().Add(500 * time.Millisecond)); err != nil {
			return result{}, err
		}
		if _, err := c.Read(buf); err == nil {
			break
		} else if i == 20 {
			return result{}, fmt.Errorf("no echo: %w", err)
		}
	}
	start := time.Now()
	end := start.Add(dur)
	tokens := make(chan struct{}, udpWindow)
	for range udpWindow {
		tokens <- struct{}{}
	}
	var stop atomic.Bool
	var sendErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		msg := make([]byte, size)
		for seq := uint64(0); !stop.Load(); seq++ {
			<-tokens
			binary.LittleEndian.PutUint64(msg, seq)
			binary.LittleEndian.PutUint64(msg[8:], uint64(time.Now().UnixNano()))
			if _, err := c.Write(msg); err != nil {
				sendErr = err
				return
			}
		}
	})
	r := result{rtt: make([]time.Duration, 0, 1<<20)}
	for time.Now().Before(end) {
		_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		n, err := c.Read(buf)
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				// Lost: refill the window.
				for len(tokens) < udpWindow {
					tokens <- struct{}{}
				}
				continue
			}
			return r, err
		}
		// The warm-up's datagrams carry no time stamp.
		if sent := int64(binary.LittleEndian.Uint64(buf[8:])); n >= 16 && sent > 0 {
			r.rtt = append(r.rtt, time.Duration(time.Now().UnixNano()-sent))
			r.n++
		}
		select {
		case tokens <- struct{}{}:
		default:
		}
	}
	r.elapsed = time.Since(start)
	stop.Store(true)
	select {
	case tokens <- struct{}{}:
	default:
	}
	wg.Wait()
	return r, sendErr
}

// httpLoad has conns keep-alive clients GET url in a loop for dur, or
// POST body to it when body is not nil (its bytes count as moved).
func httpLoad(url string, conns int, dur time.Duration, body []byte) (result, error) {
	tr := &http.Transport{MaxIdleConnsPerHost: conns, DisableCompression: true}
	defer tr.CloseIdleConnections()
	cl := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	get := func() (int64, error) {
		var resp *http.Response
		var err error
		if body == nil {
			resp, err = cl.Get(url)
		} else {
			resp, err = cl.Post(url, "application/octet-stream", bytes.NewReader(body))
		}
		if err != nil {
			return 0, err
		}
		n, err := io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if err == nil && resp.StatusCode != 200 {
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		if body != nil {
			n = int64(len(body)) // what went up; the reply is its count
		}
		return n, err
	}
	if _, err := get(); err != nil { // warm: connection, ARP
		return result{}, err
	}
	var mu sync.Mutex
	var r result
	var firstErr error
	start := time.Now()
	end := start.Add(dur)
	var wg sync.WaitGroup
	for range conns {
		wg.Go(func() {
			var lat []time.Duration
			var bytes int64
			for time.Now().Before(end) {
				t0 := time.Now()
				n, err := get()
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
				lat = append(lat, time.Since(t0))
				bytes += n
			}
			mu.Lock()
			r.rtt = append(r.rtt, lat...)
			r.n += len(lat)
			r.bytes += bytes
			mu.Unlock()
		})
	}
	wg.Wait()
	r.elapsed = time.Since(start)
	return r, firstErr
}

// guestCPU is the CPU time the guest's CPUs spent busy (user, nice,
// system, irq, softirq), from /proc/stat.
func guestCPU() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	var ticks int64
	for i, v := range f[1:] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		ticks += n
	}
	return time.Duration(ticks) * 10 * time.Millisecond // USER_HZ 100
}

func pct(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)]
}

func us(d time.Duration) float64 { return float64(d) / 1e3 }

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// table prints each cell's median per stack and the ratio netstack/linux,
// with the targets (higher is better for rates, lower for latency and
// CPU); with netstack-b, also its ratios to linux and to netstack.
func table(w io.Writer, ms []measurement, stacks []string) {
	type key struct{ test, metric string }
	var keys []key
	vals := map[key]map[string][]float64{}
	for _, m := range ms {
		k := key{m.test, m.metric}
		if vals[k] == nil {
			vals[k] = map[string][]float64{}
			keys = append(keys, k)
		}
		vals[k][m.stack] = append(vals[k][m.stack], m.value)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	withB := slices.Contains(stacks, "netstack-b")
	head := "test\tmetric\tnetstack\tlinux\tratio\t"
	if withB {
		head += "netstack-b\tb/linux\tb/netstack\t"
	}
	fmt.Fprintln(tw, head+"target\t")
	div := func(a, b float64) float64 {
		if b == 0 {
			return 0
		}
		return a / b
	}
	for _, k := range keys {
		a, b := median(vals[k]["netstack"]), median(vals[k]["linux"])
		ratio := div(a, b)
		extra := ""
		if withB {
			d := median(vals[k]["netstack-b"])
			extra = fmt.Sprintf("%.4g\t%.2fx\t%.2fx\t", d, div(d, b), div(d, a))
		}
		target := ""
		switch {
		case strings.HasPrefix(k.test, "udp") && k.metric == "pkts/s":
			target = verdict(ratio >= 3, ">= 3x")
		case strings.HasPrefix(k.test, "http") && (k.metric == "req/s" || k.metric == "MB/s"):
			target = verdict(ratio >= 1.5, ">= 1.5x")
		case k.metric == "p99-us":
			target = verdict(ratio <= 1, "<= 1x")
		}
		fmt.Fprintf(tw, "%s\t%s\t%.4g\t%.4g\t%.2fx\t%s%s\t\n", k.test, k.metric, a, b, ratio, extra, target)
	}
	_ = tw.Flush()
}

func verdict(ok bool, t string) string {
	if ok {
		return t + " met"
	}
	return t + " MISSED"
}

func sh(cmd string) error {
	out, err := exec.Command("sh", "-c", cmd).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", cmd, err, out)
	}
	return nil
}

// linuxInterface is the interface Linux made for the PCI device at addr.
func linuxInterface(addr string) (string, error) {
	for _, g := range []string{"/sys/bus/pci/devices/" + addr + "/net/*", "/sys/bus/pci/devices/" + addr + "/virtio*/net/*"} {
		m, err := filepath.Glob(g)
		if err != nil {
			return "", err
		}
		if len(m) == 1 {
			return filepath.Base(m[0]), nil
		}
	}
	return "", fmt.Errorf("no network interface on %s", addr)
}
