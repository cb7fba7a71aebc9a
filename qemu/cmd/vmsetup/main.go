// Command vmsetup installs what package qemu needs to boot guests, on a
// Debian (or Ubuntu) host, as root: QEMU (10.0 from bookworm-backports on
// Debian 12, which adds igb; else the release's own), a static busybox,
// kmod's depmod, xz, and the Debian guest kernel, fetched with `apt-get
// download` and unpacked into the cache directory ($VFNIC_CACHE, else
// $XDG_CACHE_HOME/vfnic, else ~/.cache/vfnic), never into /boot. It is
// the setup for a module that uses the harness without a vfnic checkout:
//
//	go run github.com/vfnic/vfnic/qemu/cmd/vmsetup
//
// (in a checkout, `make setup` does the same and installs the project's
// own tools). It is quick when everything is present. With -check it
// installs nothing and says what is missing.
//
// Exit status: 0 ready, 1 something missing or failed, 2 bad usage.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"

	"github.com/vfnic/vfnic/qemu"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, out, errw io.Writer) int {
	fs := flag.NewFlagSet("vmsetup", flag.ContinueOnError)
	fs.SetOutput(errw)
	check := fs.Bool("check", false, "install nothing: say what is present and what is missing")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintln(errw, "vmsetup: takes no arguments")
		return 2
	}
	s := &setup{out: out, check: *check, runner: execRunner{out: errw}}
	if err := s.run(ctx); err != nil {
		fmt.Fprintf(errw, "vmsetup: %v\n", err)
		return 1
	}
	return 0
}

// runner runs host commands; tests replace it.
type runner interface {
	run(ctx context.Context, dir string, name string, args ...string) error
	output(ctx context.Context, name string, args ...string) (string, error)
}

type execRunner struct{ out io.Writer }

func (e execRunner) run(ctx context.Context, dir, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = e.out, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

func (e execRunner) output(ctx context.Context, name string, args ...string) (string, error) {
	b, err := exec.CommandContext(ctx, name, args...).Output()
	if err != nil {
		return "", fmt.Errorf("%s %s: %v", name, strings.Join(args, " "), err)
	}
	return string(b), nil
}

type setup struct {
	out     io.Writer
	check   bool
	runner  runner
	updated bool // apt-get update ran
}

// missing is one thing to install and the Debian package holding it.
type missing struct {
	what, pkg string
	err       error
}

func (s *setup) run(ctx context.Context) error {
	var need []missing
	if _, err := qemu.FindQEMU(); err != nil {
		need = append(need, missing{"QEMU", "qemu-system-x86", err})
	}
	if _, err := qemu.FindBusybox(); err != nil {
		need = append(need, missing{"a static busybox (the guest's shell)", "busybox-static", err})
	}
	if depmod() == "" {
		need = append(need, missing{"depmod (the guest kernel's module index)", "kmod", errors.New("depmod not found")})
	}
	if _, err := exec.LookPath("xz"); err != nil {
		need = append(need, missing{"xz (unpacks vmlinux for the fast PVH boot)", "xz-utils", err})
	}
	kdir := filepath.Join(qemu.CacheDir(), "kernel")
	_, kerr := qemu.FindKernel()
	if s.check {
		for _, m := range need {
			fmt.Fprintf(s.out, "missing: %s (Debian package %s): %v\n", m.what, m.pkg, m.err)
		}
		if kerr != nil {
			fmt.Fprintf(s.out, "missing: the guest kernel in %s (apt-get download of linux-image-amd64's kernel): %v\n", kdir, kerr)
		}
		if len(need) > 0 || kerr != nil {
			return errors.New("not ready: run `go run github.com/vfnic/vfnic/qemu/cmd/vmsetup` as root to install what is missing")
		}
		return s.ready()
	}
	if len(need) > 0 || kerr != nil {
		if os.Geteuid() != 0 {
			return errors.New("installing needs root (apt-get): run it with sudo, or -check to see what is missing")
		}
		if _, err := exec.LookPath("apt-get"); err != nil {
			var what []string
			for _, m := range need {
				what = append(what, m.what)
			}
			if kerr != nil {
				what = append(what, "a Debian guest kernel unpacked into "+kdir)
			}
			return fmt.Errorf("no apt-get: install %s by hand (see `go doc github.com/vfnic/vfnic/qemu`)", strings.Join(what, ", "))
		}
	}
	for _, m := range need {
		if err := s.install(ctx, m.pkg); err != nil {
			return err
		}
	}
	if kerr != nil {
		if err := s.fetchKernel(ctx, kdir); err != nil {
			return err
		}
	}
	if err := s.index(ctx, kdir); err != nil {
		return err
	}
	return s.ready()
}

// ready prints what the harness will use, or why it cannot.
func (s *setup) ready() error {
	q, err := qemu.FindQEMU()
	if err != nil {
		return err
	}
	k, err := qemu.FindKernel()
	if err != nil {
		return err
	}
	b, err := qemu.FindBusybox()
	if err != nil {
		return err
	}
	fmt.Fprintf(s.out, "ready: %s, busybox %s, guest kernel %s (%s)\n", q, b, k.Version, k.Image)
	return nil
}

func (s *setup) aptUpdate(ctx context.Context) error {
	if s.updated {
		return nil
	}
	s.updated = true
	return s.runner.run(ctx, "", "apt-get", "update", "-qq")
}

// install installs a Debian package; QEMU from bookworm-backports on
// Debian 12 (10.0, with igb), else the release's.
func (s *setup) install(ctx context.Context, pkg string) error {
	fmt.Fprintf(s.out, "installing %s\n", pkg)
	if pkg == "qemu-system-x86" && codename() == "bookworm" {
		list := "/etc/apt/sources.list.d/vfnic-backports.list"
		if !hasBackports() {
			if err := os.WriteFile(list, []byte("deb http://deb.debian.org/debian bookworm-backports main\n"), 0o644); err != nil {
				return err
			}
		}
		if err := s.aptUpdate(ctx); err != nil {
			return err
		}
		err := s.runner.run(ctx, "", "apt-get", "install", "-y", "-qq", "-t", "bookworm-backports", "--no-install-recommends", pkg)
		if err == nil {
			return nil
		}
		fmt.Fprintf(s.out, "bookworm-backports' QEMU unavailable (%v): bookworm's 7.2 (no igb)\n", err)
	}
	if err := s.aptUpdate(ctx); err != nil {
		return err
	}
	return s.runner.run(ctx, "", "apt-get", "install", "-y", "-qq", "--no-install-recommends", pkg)
}

// kernelPackage is the versioned package linux-image-amd64 depends on,
// from `apt-cache depends linux-image-amd64`.
func kernelPackage(depends string) (string, error) {
	for _, l := range strings.Split(depends, "\n") {
		dep, ok := strings.CutPrefix(strings.TrimSpace(l), "Depends: ")
		if ok && strings.HasPrefix(dep, "linux-image-") && len(dep) > len("linux-image-") &&
			dep[len("linux-image-")] >= '0' && dep[len("linux-image-")] <= '9' {
			return dep, nil
		}
	}
	return "", errors.New("cannot find the kernel package behind linux-image-amd64 (apt-cache depends linux-image-amd64)")
}

// fetchKernel downloads the kernel package and unpacks it into kdir.
func (s *setup) fetchKernel(ctx context.Context, kdir string) error {
	if err := s.aptUpdate(ctx); err != nil {
		return err
	}
	deps, err := s.runner.output(ctx, "apt-cache", "depends", "linux-image-amd64")
	if err != nil {
		return err
	}
	pkg, err := kernelPackage(deps)
	if err != nil {
		return err
	}
	fmt.Fprintf(s.out, "fetching the guest kernel %s into %s\n", pkg, kdir)
	tmp, err := os.MkdirTemp("", "vmsetup-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if err := s.runner.run(ctx, tmp, "apt-get", "download", "-qq", pkg); err != nil {
		return err
	}
	debs, _ := filepath.Glob(filepath.Join(tmp, "*.deb"))
	if len(debs) != 1 {
		return fmt.Errorf("apt-get download %s left %d .deb files", pkg, len(debs))
	}
	next := kdir + ".new"
	_ = os.RemoveAll(next)
	if err := os.MkdirAll(next, 0o755); err != nil {
		return err
	}
	if err := s.runner.run(ctx, "", "dpkg", "-x", debs[0], next); err != nil {
		return err
	}
	_ = os.RemoveAll(kdir)
	return os.Rename(next, kdir)
}

// index writes modules.dep, which the .deb does not ship (depmod writes it
// at install).
func (s *setup) index(ctx context.Context, kdir string) error {
	mods, _ := filepath.Glob(filepath.Join(kdir, "lib", "modules", "*"))
	for _, m := range mods {
		if st, err := os.Stat(filepath.Join(m, "modules.dep")); err == nil && st.Size() > 0 {
			continue
		}
		d := depmod()
		if d == "" {
			return errors.New("depmod not found (Debian package kmod)")
		}
		if err := s.runner.run(ctx, "", d, "-b", kdir, filepath.Base(m)); err != nil {
			return err
		}
	}
	return nil
}

func depmod() string {
	if p, err := exec.LookPath("depmod"); err == nil {
		return p
	}
	for _, p := range []string{"/sbin/depmod", "/usr/sbin/depmod"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}

// codename is VERSION_CODENAME of /etc/os-release.
func codename() string {
	b, _ := os.ReadFile("/etc/os-release")
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VERSION_CODENAME="); ok {
			return strings.Trim(v, `"`)
		}
	}
	return ""
}

func hasBackports() bool {
	files, _ := filepath.Glob("/etc/apt/sources.list.d/*")
	for _, f := range append(files, "/etc/apt/sources.list") {
		if b, err := os.ReadFile(f); err == nil && bytes.Contains(b, []byte("bookworm-backports")) {
			return true
		}
	}
	return false
}
