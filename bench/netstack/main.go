// Command netstack is the side-by-side benchmark of package netstack
// against the guest's Linux sockets (make bench-netstack; not part of
// make test): one QEMU guest, one run, three NICs of one kind on one
// emulated wire (a QEMU hub). The same Go programs, a UDP echo server and
// an HTTP server, run on vfnic with netstack and on Linux's sockets
// through its own driver on a NIC of the same kind (in a network
// namespace of its own), A B A B; a client on the third NIC loads each:
// UDP echo with 64- and 512-byte datagrams (packets/s, p50/p99 round
// trip), HTTP with keep-alive (requests/s of a small body with 4
// connections, MB/s of a 1 MiB body, p50/p99), and the guest's CPU time
// per packet or request. See bench/netstack/guest for the payload and
// README.md for how to read the table.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/vfnic/vfnic/qemu"
)

var kinds = map[string]qemu.NIC{
	"packed": {Model: qemu.VirtioNet, Packed: true},
	"split":  {Model: qemu.VirtioNet},
	"igb":    {Model: qemu.IGB},
}

func main() {
	nicName := flag.String("nic", "packed", "NIC kind: packed, split (virtio-net) or igb")
	reps := flag.Int("reps", 2, "runs of each server (A B A B)")
	dur := flag.Duration("dur", 5*time.Second, "time of each measurement")
	profile := flag.Bool("profile", true, "profile the netstack server in one more run (not counted) and print where its CPU time goes")
	mode := flag.String("mode", "adaptive", "netstack's polling cores: busy, adaptive or interrupt (lcore)")
	b := flag.String("b", "", "serve flags of a second netstack server run in turn with the others (netstack-b), e.g. \"-mode interrupt\"")
	verbose := flag.Bool("v", false, "print the guest's console")
	flag.Parse()
	if err := run(*nicName, *reps, *dur, *mode, *b, *profile, *verbose); err != nil {
		fmt.Fprintln(os.Stderr, "bench-netstack:", err)
		os.Exit(1)
	}
}

func run(nicName string, reps int, dur time.Duration, mode, b string, profile, verbose bool) error {
	k, ok := kinds[nicName]
	if !ok {
		return fmt.Errorf("unknown NIC %q (want packed, split or igb)", nicName)
	}
	ctx := context.Background()
	tmp, err := os.MkdirTemp("", "vfnic-bench-netstack-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	payload := filepath.Join(tmp, "guest")
	fmt.Fprintln(os.Stderr, "bench-netstack: building the guest payload")
	if err := qemu.BuildBinary(ctx, "github.com/vfnic/vfnic/bench/netstack/guest", payload); err != nil {
		return err
	}
	hub := qemu.Hub(1)
	// igb NICs sit two slots apart (QEMU keeps slots for their VFs).
	vf, client, server := k, k, k
	vf.Slot, vf.Net, vf.Bind = 4, hub, qemu.BindVFIO
	client.Slot, client.Net, client.Bind, client.IPv4 = 6, hub, qemu.BindLinux, "10.0.9.2/24"
	server.Slot, server.Net, server.Bind = 8, hub, qemu.BindLinux
	// 7 measurements per server run, each dur plus its warm-up.
	perRun := 7*dur + 30*time.Second
	servers := 2 // netstack and Linux, and netstack-b with -b
	if b != "" {
		servers = 3
	}
	cfg := qemu.Config{
		NICs:         []qemu.NIC{vf, client, server},
		MemoryMB:     1536,
		OneTCGThread: true,
		Timeout:      2*time.Minute + time.Duration(servers*reps+1)*perRun,
		Output:       prefixWriter{},
	}
	if verbose {
		cfg.Console = os.Stderr
	}
	const guestProfile = "/tmp/netstack.pprof"
	args := []string{"-reps", fmt.Sprint(reps), "-dur", dur.String(), "-mode", mode, "-b", b}
	if profile {
		args = append(args, "-profile", guestProfile)
		cfg.Collect = []qemu.Collect{{Guest: guestProfile, Host: filepath.Join(tmp, "profile")}}
	}
	fmt.Fprintf(os.Stderr, "bench-netstack: %s, %d runs of each server, %v per measurement, netstack's cores %s\n", nicName, reps, dur, mode)
	res, err := qemu.Run(ctx, cfg, qemu.Command{Path: payload, Args: args})
	if err != nil {
		if res != nil && !verbose {
			fmt.Fprintln(os.Stderr, res.KernelLog)
		}
		return err
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("guest payload exited %d", res.ExitCode)
	}
	if profile && len(res.Collected) > 0 {
		fmt.Println("\nWhere the netstack server's CPU time went (a run of its own, go tool pprof -top):")
		out, err := exec.Command("go", "tool", "pprof", "-top", "-nodecount=30", payload, res.Collected[0]).CombinedOutput()
		fmt.Println(strings.TrimSpace(string(out)))
		if err != nil {
			return fmt.Errorf("pprof: %w", err)
		}
	}
	return nil
}

// prefixWriter prints the payload's lines as they come.
type prefixWriter struct{}

func (prefixWriter) Write(b []byte) (int, error) { return os.Stdout.Write(b) }
