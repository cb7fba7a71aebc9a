// Command vmexec runs a program, typically a Go test binary, inside a vfnic
// QEMU guest (TCG, emulated Intel IOMMU, emulated NICs bound to vfio-pci)
// and exits with the program's exit status. It is meant for
//
//	go test -exec vmexec ./some/pkg
//	go test -exec "go run github.com/vfnic/vfnic/qemu/cmd/vmexec" ./some/pkg
//
// The program's output is streamed to stdout as the guest prints it. When
// the current directory has a testdata folder it is copied into the guest
// and the program runs in its parent, as `go test` would run it.
//
// Environment:
//
//	VFNIC_NICS        guest NICs, qemu.ParseNICs syntax
//	                  (default "virtio,packed=on,net=hub:0;e1000e,net=hub:0")
//	VFNIC_MEM         guest RAM in MiB (default 1024)
//	VFNIC_CPUS        guest CPUs (default 2)
//	VFNIC_HUGEPAGES   2 MiB hugepages to reserve (default 64, -1 for none)
//	VFNIC_AWBITS      vIOMMU address width, 39 or 48 (default 48)
//	VFNIC_MODULES     extra guest kernel modules, comma or space separated
//	VFNIC_KERNEL_ARGS extra kernel command-line words
//	VFNIC_GUEST_ENV   KEY=VALUE words added to the program's environment
//	VFNIC_TIMEOUT     run timeout (Go duration); default -test.timeout + 1m, else 10m
//	VFNIC_CONSOLE=1   also copy the whole guest console to stderr
//
// Exit status: the program's own, or 125 when the guest could not run it.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vfnic/vfnic/qemu"
)

// DefaultNICs is the guest's NIC list when VFNIC_NICS is unset: two NICs of
// different families, bound to vfio-pci, on one emulated wire.
const DefaultNICs = "virtio,packed=on,net=hub:0;e1000e,net=hub:0"

// exitInfra is the status for a guest that could not run the program,
// distinct from the statuses a test binary uses (0, 1, 2).
const exitInfra = 125

func main() {
	os.Exit(run())
}

func run() int {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: vmexec PROGRAM [ARGS...] (see `go doc github.com/vfnic/vfnic/qemu/cmd/vmexec`)")
		return 2
	}
	cfg, cmd, err := configure(os.Args[1], os.Args[2:])
	if err != nil {
		fmt.Fprintf(os.Stderr, "vmexec: %v\n", err)
		return exitInfra
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGQUIT)
	defer stop()
	res, err := qemu.Run(ctx, cfg, cmd)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, qemu.ErrPayloadFailed):
		return res.ExitCode
	}
	fmt.Fprintf(os.Stderr, "vmexec: %v\n", err)
	return exitInfra
}

// configure builds the guest configuration from the environment.
func configure(prog string, args []string) (qemu.Config, qemu.Command, error) {
	var cfg qemu.Config
	cmd := qemu.Command{Path: prog, Args: args}
	spec := os.Getenv("VFNIC_NICS")
	if spec == "" {
		spec = DefaultNICs
	}
	nics, err := qemu.ParseNICs(spec)
	if err != nil {
		return cfg, cmd, fmt.Errorf("VFNIC_NICS: %w", err)
	}
	cfg.NICs = nics
	ints := []struct {
		env string
		dst *int
	}{{"VFNIC_MEM", &cfg.MemoryMB}, {"VFNIC_CPUS", &cfg.CPUs}, {"VFNIC_HUGEPAGES", &cfg.Hugepages}, {"VFNIC_AWBITS", &cfg.AWBits}}
	for _, i := range ints {
		if v := os.Getenv(i.env); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil {
				return cfg, cmd, fmt.Errorf("%s=%q: not a number", i.env, v)
			}
			*i.dst = n
		}
	}
	cfg.Modules = strings.FieldsFunc(os.Getenv("VFNIC_MODULES"), func(r rune) bool { return r == ',' || r == ' ' })
	cfg.KernelArgs = strings.Fields(os.Getenv("VFNIC_KERNEL_ARGS"))
	cmd.Env = strings.Fields(os.Getenv("VFNIC_GUEST_ENV"))
	cfg.Timeout = 10 * time.Minute
	if d, ok := testTimeout(args); ok && d > 0 {
		cfg.Timeout = d + time.Minute
	}
	if v := os.Getenv("VFNIC_TIMEOUT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return cfg, cmd, fmt.Errorf("VFNIC_TIMEOUT=%q: not a positive duration", v)
		}
		cfg.Timeout = d
	}
	// stdout carries only the program's output, which go test parses.
	cfg.Output = os.Stdout
	if os.Getenv("VFNIC_CONSOLE") == "1" {
		cfg.Console = os.Stderr
	}
	if st, err := os.Stat("testdata"); err == nil && st.IsDir() {
		abs, err := filepath.Abs("testdata")
		if err != nil {
			return cfg, cmd, err
		}
		cfg.Files = append(cfg.Files, qemu.File{Host: abs, Guest: "/vfnic/pkg/testdata"})
		cmd.Dir = "/vfnic/pkg"
	}
	return cfg, cmd, nil
}

// testTimeout finds -test.timeout in a test binary's arguments.
func testTimeout(args []string) (time.Duration, bool) {
	for i, a := range args {
		a = strings.TrimLeft(a, "-")
		if a == "args" {
			break
		}
		v, ok := strings.CutPrefix(a, "test.timeout=")
		if !ok && a == "test.timeout" && i+1 < len(args) {
			v, ok = args[i+1], true
		}
		if ok {
			d, err := time.ParseDuration(v)
			return d, err == nil
		}
	}
	return 0, false
}
