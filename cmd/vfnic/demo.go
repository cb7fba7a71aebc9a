package main

import (
	"context"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vfnic/vfnic/qemu"
)

func runDemo(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlags("demo", "[-console]")
	console := fs.Bool("console", false, "also show the guest's serial console")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("%w: demo takes no arguments", errUsage)
	}
	if err := qemu.Available(ctx); err != nil {
		return err
	}
	bin, cleanup, err := guestBinary(ctx)
	if err != nil {
		return err
	}
	defer cleanup()

	cfg := qemu.Config{
		NICs: []qemu.NIC{
			{Model: qemu.VirtioNet, Packed: true, Slot: 4, Bind: qemu.BindVFIO},
			{Model: qemu.E1000E, Slot: 5, Bind: qemu.BindVFIO},
		},
		Output:  prefixWriter(out, "guest| "),
		Timeout: 3 * time.Minute,
	}
	if *console {
		cfg.Console = prefixWriter(out, "console| ")
	}
	fmt.Fprintf(out, "vfnic demo: booting a q35 guest (TCG, intel-iommu) with %s\n", qemu.FormatNICs(cfg.NICs))
	fmt.Fprintln(out, "guest| $ vfnic probe -all")
	res, err := qemu.Run(ctx, cfg, qemu.Command{Path: bin, Args: []string{"probe", "-all"}})
	if res != nil {
		fmt.Fprintf(out, "vfnic demo: guest kernel %s, boot %v, whole run %v, exit status %d\n",
			res.KernelVersion, res.Boot.Round(time.Millisecond), res.Duration.Round(time.Millisecond), res.ExitCode)
	}
	return err
}

// guestBinary returns a static vfnic binary for the guest: this executable
// when it is static, or a fresh CGO_ENABLED=0 build of this command.
func guestBinary(ctx context.Context) (string, func(), error) {
	if self, err := os.Executable(); err == nil && isStatic(self) {
		return self, func() {}, nil
	}
	dir, err := os.MkdirTemp("", "vfnic-demo-")
	if err != nil {
		return "", nil, err
	}
	bin := filepath.Join(dir, "vfnic")
	if err := qemu.BuildBinary(ctx, "github.com/vfnic/vfnic/cmd/vfnic", bin); err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("build a static vfnic for the guest (run from the source tree): %w", err)
	}
	return bin, func() { os.RemoveAll(dir) }, nil
}

func isStatic(path string) bool {
	f, err := elf.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return false
		}
	}
	return true
}

// prefixWriter writes each line to w behind prefix.
func prefixWriter(w io.Writer, prefix string) io.Writer {
	return &lineWriter{w: w, prefix: prefix}
}

type lineWriter struct {
	w      io.Writer
	prefix string
	buf    strings.Builder
}

func (l *lineWriter) Write(p []byte) (int, error) {
	for _, b := range p {
		if b == '\n' {
			if _, err := fmt.Fprintf(l.w, "%s%s\n", l.prefix, l.buf.String()); err != nil {
				return 0, err
			}
			l.buf.Reset()
			continue
		}
		l.buf.WriteByte(b)
	}
	return len(p), nil
}
