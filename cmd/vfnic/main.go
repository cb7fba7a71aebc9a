// Command vfnic lists, binds and drives NICs from userspace through VFIO.
//
//	vfnic list [-json]              NICs with driver, IOMMU group and binding
//	vfnic bind [-force] ADDR...     give NICs to vfio-pci
//	vfnic unbind [-force] ADDR...   give vfio-pci NICs back to their kernel drivers
//	vfnic doctor [-json] [ADDR...]  check that VFIO can work and say what stops it
//	vfnic probe [ADDR...]           open vfio-bound NICs and exercise them
//	vfnic echo -ip IP ADDR          answer ARP/ICMP echo for IP, echo UDP
//	vfnic pktgen [flags] ADDR       send frames as fast as the NIC takes them
//	vfnic capture -w FILE ADDR      write received frames to a pcap file
//	vfnic udpping IP:PORT           kernel-stack UDP client for an echo server
//	vfnic demo                      boot a QEMU guest and run vfnic in it
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"syscall"
)

// errUsage marks a malformed command line: exit status 2.
var errUsage = errors.New("usage")

type command struct {
	summary string
	run     func(ctx context.Context, args []string, out io.Writer) error
}

var commands = map[string]command{
	"list":    {"list NICs with driver, IOMMU group and binding", runList},
	"bind":    {"bind NICs to vfio-pci (refuses NICs in use unless -force)", runBind},
	"unbind":  {"unbind NICs from vfio-pci and give them back to the kernel", runUnbind},
	"doctor":  {"check that VFIO can work here and say what stops it", runDoctor},
	"probe":   {"open vfio-bound NICs, map DMA memory, take interrupts, report", runProbe},
	"demo":    {"boot a QEMU guest with emulated NICs and run vfnic against them", runDemo},
	"echo":    {"answer ARP and ICMP echo for an IP and echo UDP datagrams", runEcho},
	"pktgen":  {"send frames at the highest rate the NIC takes", runPktgen},
	"capture": {"write received frames to a pcap file", runCapture},
	"udpping": {"send UDP datagrams through the kernel's stack and check their echoes", runUDPPing},
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
	fmt.Fprintln(w, "\nRun 'vfnic <command> -h' for a command's flags.")
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, out, errw io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(errw)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(errw, "vfnic: unknown command %q\n", args[0])
		usage(errw)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := c.run(ctx, args[1:], out)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		fmt.Fprintf(errw, "vfnic %s: %v\n", args[0], err)
		return 2
	default:
		fmt.Fprintf(errw, "vfnic %s: %v\n", args[0], err)
		return 1
	}
}

// newFlags returns a flag set whose parse errors come back as errUsage.
func newFlags(name, args string) *flag.FlagSet {
	fs := flag.NewFlagSet("vfnic "+name, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: vfnic %s %s\n", name, args)
		fs.PrintDefaults()
	}
	return fs
}

func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	return nil
}
