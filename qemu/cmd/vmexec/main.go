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
// What a test binary writes for the host comes back from the guest: the
// files of -test.coverprofile, -test.cpuprofile, -test.memprofile,
// -test.blockprofile, -test.mutexprofile, -test.trace and
// -test.testlogfile, and the directories of -test.gocoverdir,
// -test.outputdir and $GOCOVERDIR. So `go test -exec vmexec -cover
// -coverprofile=c.out -cpuprofile=cpu.out` works as it does on the host.
//
// Environment:
//
//	VFNIC_NICS        guest NICs, qemu.ParseNICs syntax, QEMU device
//	                  properties included ("virtio,host_mtu=9000")
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
	"regexp"
	"slices"
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
	if cmd.Args, cfg.Collect, cmd.Env, err = mapOutputs(cmd.Args, os.Getenv("GOCOVERDIR")); err != nil {
		return cfg, cmd, err
	}
	cfg.Modules = strings.FieldsFunc(os.Getenv("VFNIC_MODULES"), func(r rune) bool { return r == ',' || r == ' ' })
	cfg.KernelArgs = strings.Fields(os.Getenv("VFNIC_KERNEL_ARGS"))
	cmd.Env = append(cmd.Env, strings.Fields(os.Getenv("VFNIC_GUEST_ENV"))...)
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

// Test flags whose values are host paths the test binary writes.
var (
	fileFlags = []string{"test.coverprofile", "test.cpuprofile", "test.memprofile", "test.blockprofile",
		"test.mutexprofile", "test.trace", "test.testlogfile"}
	dirFlags = []string{"test.gocoverdir", "test.outputdir"}
)

// unsafeChars are what a guest file name does without: the host name is
// only a hint there.
var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9._-]`)

// guestOut is where the guest writes what comes back to the host.
const guestOut = "/vfnic/out"

// mapOutputs rewrites the host paths in a test binary's output flags (and
// $GOCOVERDIR) to guest paths, and returns the Collect entries that bring
// them back. A relative profile path is relative to -test.outputdir when
// given, as the testing package reads it, else to the current directory.
func mapOutputs(args []string, gocoverdir string) ([]string, []qemu.Collect, []string, error) {
	out := append([]string(nil), args...)
	type flagAt struct{ i, v int } // index of the flag, of its value
	found := map[string]flagAt{}
	for i := 0; i < len(out); i++ {
		a := strings.TrimLeft(out[i], "-")
		if a == "args" || a == out[i] { // -args, or the first non-flag
			break
		}
		name, _, hasValue := strings.Cut(a, "=")
		if !slices.Contains(fileFlags, name) && !slices.Contains(dirFlags, name) {
			continue
		}
		if hasValue {
			found[name] = flagAt{i, i}
		} else if i+1 < len(out) {
			found[name] = flagAt{i, i + 1}
			i++
		}
	}
	value := func(f flagAt) string {
		if f.i == f.v {
			_, v, _ := strings.Cut(out[f.i], "=")
			return v
		}
		return out[f.v]
	}
	set := func(name string, f flagAt, v string) {
		if f.i == f.v {
			out[f.i] = "-" + name + "=" + v
		} else {
			out[f.v] = v
		}
	}
	var collect []qemu.Collect
	guestDirs := map[string]string{} // host dir -> guest dir
	mapDir := func(host string) (string, error) {
		abs, err := filepath.Abs(host)
		if err != nil {
			return "", err
		}
		if g, ok := guestDirs[abs]; ok {
			return g, nil
		}
		g := fmt.Sprintf("%s/d%d", guestOut, len(guestDirs))
		guestDirs[abs] = g
		collect = append(collect, qemu.Collect{Guest: g, Host: abs, Dir: true})
		return g, nil
	}
	outputDir := ""
	if f, ok := found["test.outputdir"]; ok {
		outputDir = value(f)
	}
	for _, name := range dirFlags {
		if f, ok := found[name]; ok && value(f) != "" {
			g, err := mapDir(value(f))
			if err != nil {
				return nil, nil, nil, fmt.Errorf("-%s: %w", name, err)
			}
			set(name, f, g)
		}
	}
	for n, name := range fileFlags {
		f, ok := found[name]
		if !ok || value(f) == "" {
			continue
		}
		host := value(f)
		if !filepath.IsAbs(host) && outputDir != "" {
			host = filepath.Join(outputDir, host)
		}
		host, err := filepath.Abs(host)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("-%s: %w", name, err)
		}
		g := fmt.Sprintf("%s/f%d/%s", guestOut, n, unsafeChars.ReplaceAllString(filepath.Base(host), "_"))
		set(name, f, g)
		collect = append(collect, qemu.Collect{Guest: g, Host: host})
	}
	var env []string
	if gocoverdir != "" {
		g, err := mapDir(gocoverdir)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("GOCOVERDIR: %w", err)
		}
		env = append(env, "GOCOVERDIR="+g)
	}
	return out, collect, env, nil
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
