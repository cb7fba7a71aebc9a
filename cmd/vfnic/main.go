// Command vfnic lists, binds and drives NICs from userspace through VFIO,
// and host interfaces through AF_XDP or AF_PACKET sockets.
//
//	vfnic list [-json]              NICs with driver, IOMMU group and binding; host interfaces
//	vfnic bind [-force] ADDR...     give NICs to vfio-pci
//	vfnic unbind [-force] ADDR...   give vfio-pci NICs back to their kernel drivers
//	vfnic doctor [-json] [ADDR...]  check that VFIO, AF_XDP and AF_PACKET can work and say what stops them
//	vfnic probe [-json] [ADDR...]   open vfio-bound NICs and exercise them
//	vfnic info [-json] ADDR         a NIC's MAC, MTU, link, queues, rings, features, offloads
//	vfnic echo -ip IP ADDR          answer ARP/ICMP echo for IP, echo UDP
//	vfnic pktgen [flags] ADDR       send frames at a rate or as fast as the NIC takes them
//	vfnic fwd [-forward io|macswap] A B  forward frames between two NICs, both ways
//	vfnic capture [-w FILE] ADDR [FILTER]  received frames matching a tcpdump filter, to a pcap file
//	                                ("-" for stdout) or as text lines
//	vfnic udpping IP:PORT           kernel-stack UDP client for an echo server
//	vfnic help [COMMAND]            this list, or a command's flags
//	vfnic version                   the module version, build settings and drivers compiled in
//
// ADDR of the traffic commands, info and probe is a PCI address or a host
// interface: afxdp:IF (queue 0, or 0 and up with -queues), afxdp:IF@Q
// (queue Q and up) or afpacket:IF (a socket per queue, -queues). The kernel keeps a host
// interface; with afxdp, -force detaches an XDP program someone else
// attached through netlink, which is refused otherwise.
//
// Flags go before or after the address ("vfnic echo ADDR -ip X" works);
// "--" ends the flags. The traffic commands (echo, pktgen, capture, sink,
// fwd, udpping) print live rates in packets/s and Mbit/s (frame bytes without
// FCS) and a summary; with -json the summary is one JSON object on stdout
// and every human line goes to stderr. echo, pktgen and capture run their
// loop on a polling core (package lcore): -cpu N pins its thread to CPU N,
// -mode busy|adaptive|interrupt says what it does when idle; the summary
// names both and, with -json, the core's polls, sleeps and wake-ups.
//
// Exit status: 0 on success (a traffic command stopped by Ctrl-C, SIGTERM
// or -duration has succeeded); 1 when the command failed (a device that
// cannot be opened, an I/O error, udpping datagrams not echoed intact);
// 2 for a malformed command line.
//
// The guest demo ('make demo') is a separate command, cmd/vfnic-demo, so
// that this binary carries no VM harness.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/vfnic/vfnic/cmd/vfnic/internal/suggest"
)

// Exit statuses.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

// errUsage marks a malformed command line: exit status 2.
var errUsage = errors.New("usage")

// stdio is where a command writes: out for its results, err for
// diagnostics and, when its results are machine-readable (-json, a pcap
// on stdout), for every human line.
type stdio struct {
	out, err io.Writer
}

type command struct {
	summary string
	run     func(ctx context.Context, args []string, o stdio) error
}

// plain adapts a command that writes everything to stdout.
func plain(f func(ctx context.Context, args []string, out io.Writer) error) func(context.Context, []string, stdio) error {
	return func(ctx context.Context, args []string, o stdio) error { return f(ctx, args, o.out) }
}

var commands map[string]command

func init() {
	// Set in init: help and version refer back to the table.
	commands = map[string]command{
		"info":    {"show a NIC's MAC, MTU, link, queues, rings, features and offloads without traffic", runInfo},
		"list":    {"list NICs with driver, IOMMU group, interfaces, MAC and binding", runList},
		"bind":    {"bind NICs to vfio-pci (refuses NICs in use unless -force)", plain(runBind)},
		"unbind":  {"unbind NICs from vfio-pci and give them back to the kernel", plain(runUnbind)},
		"doctor":  {"check that VFIO, AF_XDP and AF_PACKET can work here and say what stops them", plain(runDoctor)},
		"probe":   {"open vfio-bound NICs, map DMA memory, take interrupts, report", runProbe},
		"echo":    {"answer ARP and ICMP echo for an IP and echo UDP datagrams", runEcho},
		"pktgen":  {"send frames at a rate, or at the highest rate the NIC takes", runPktgen},
		"sink":    {"receive and drop frames, counting them (testpmd's rxonly)", runSink},
		"capture": {"print received frames, or write them to a pcap file, through a tcpdump filter", runCapture},
		"udpping": {"send UDP datagrams through the kernel's stack and check their echoes", runUDPPing},
		"fwd":     {"forward frames between two NICs both ways (testpmd's io and macswap modes)", runFwd},
		"help":    {"print this list, or a command's flags ('vfnic help capture')", runHelp},
		"version": {"print vfnic's module version, build settings and the drivers compiled in", runVersion},
	}
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: vfnic <command> [flags] [args]")
	fmt.Fprintln(w, "\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-8s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nFlags go before or after the arguments. Run 'vfnic help <command>' for a command's flags.")
	fmt.Fprintln(w, "Exit status: 0 success (Ctrl-C ends a traffic command successfully), 1 failure, 2 bad command line.")
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, out, errw io.Writer) int {
	if len(args) == 0 {
		usage(errw)
		return exitUsage
	}
	name := args[0]
	if name == "-h" || name == "-help" || name == "--help" {
		name = "help"
	}
	c, ok := commands[name]
	if !ok {
		names := make([]string, 0, len(commands))
		for n := range commands {
			names = append(names, n)
		}
		hint := ""
		if n := suggest.Closest(name, names); n != "" {
			hint = fmt.Sprintf(" (did you mean %q?)", n)
		}
		fmt.Fprintf(errw, "vfnic: unknown command %q%s\n", name, hint)
		usage(errw)
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := c.run(ctx, args[1:], stdio{out: out, err: errw})
	var h *helpError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &h):
		fmt.Fprintf(out, "vfnic %s: %s\n\n%s", name, c.summary, h.usage)
		return exitOK
	case errors.Is(err, errUsage):
		fmt.Fprintf(errw, "vfnic %s: %v\n", name, err)
		fmt.Fprintf(errw, "Run 'vfnic help %s' for its flags.\n", name)
		return exitUsage
	default:
		fmt.Fprintf(errw, "vfnic %s: %v\n", name, err)
		return exitFailure
	}
}

// runHelp prints the command list, or one command's flags.
func runHelp(_ context.Context, args []string, o stdio) error {
	switch len(args) {
	case 0:
		usage(o.out)
		return nil
	case 1:
		c, ok := commands[args[0]]
		if !ok || args[0] == "help" {
			if ok {
				usage(o.out)
				return nil
			}
			return fmt.Errorf("%w: unknown command %q", errUsage, args[0])
		}
		err := c.run(context.Background(), []string{"-h"}, o)
		var h *helpError
		if errors.As(err, &h) {
			fmt.Fprintf(o.out, "vfnic %s: %s\n\n%s", args[0], c.summary, h.usage)
			return nil
		}
		return err
	default:
		return fmt.Errorf("%w: help takes at most one command", errUsage)
	}
}

// flagHint returns " (did you mean -x?)" for an unknown flag near one of
// fs's, or "".
func flagHint(fs *flag.FlagSet, err error) string {
	const unknown = "flag provided but not defined: -"
	msg := err.Error()
	if !strings.HasPrefix(msg, unknown) {
		return ""
	}
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	if n := suggest.Closest(strings.TrimPrefix(msg, unknown), names); n != "" {
		return fmt.Sprintf(" (did you mean -%s?)", n)
	}
	return ""
}

// helpError carries a command's usage text, printed to stdout by run.
type helpError struct{ usage string }

func (h *helpError) Error() string { return "help requested" }

// Is makes errors.Is(err, flag.ErrHelp) true.
func (h *helpError) Is(target error) bool { return target == flag.ErrHelp }

// newFlags returns a flag set whose parse errors come back as errUsage
// and whose -h comes back as a *helpError.
func newFlags(name, args string) *flag.FlagSet {
	fs := flag.NewFlagSet("vfnic "+name, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: vfnic %s %s\n\nflags (before or after the arguments):\n", name, args)
		fs.PrintDefaults()
		if strings.Contains(args, "DEVICE") {
			fmt.Fprintf(fs.Output(), "\n%s\n", hostNames)
		}
	}
	return fs
}

// parse parses flags wherever they sit among the positional arguments,
// as GNU tools do ("vfnic echo ADDR -ip X"); "--" ends the flags. The
// positional arguments end up in fs.Args(). No command takes a negative
// duration: parse refuses one for every duration flag, so that each
// command need not remember to.
func parse(fs *flag.FlagSet, args []string) error {
	fs.SetOutput(io.Discard) // errors come back to run; help goes to stdout
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				var b bytes.Buffer
				fs.SetOutput(&b)
				fs.Usage()
				return &helpError{usage: b.String()}
			}
			return fmt.Errorf("%w: %v%s", errUsage, err, flagHint(fs, err))
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if used := len(args) - len(rest); used > 0 && args[used-1] == "--" {
			pos = append(pos, rest...)
			break
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	var bad error
	fs.Visit(func(f *flag.Flag) {
		if g, ok := f.Value.(flag.Getter); ok && bad == nil {
			if d, ok := g.Get().(time.Duration); ok && d < 0 {
				bad = fmt.Errorf("%w: -%s %v is negative", errUsage, f.Name, d)
			}
		}
	})
	if bad != nil {
		return bad
	}
	// Leave the positional arguments where the commands read them.
	return fs.Parse(append([]string{"--"}, pos...))
}
