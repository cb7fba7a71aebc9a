package initramfs

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
)

// Errors returned by the module resolver.
var (
	// ErrNoModule is returned when a requested module is neither in modules.dep nor built in.
	ErrNoModule = errors.New("initramfs: kernel module not found")
	// ErrModuleCycle is returned when modules.dep describes a dependency cycle.
	ErrModuleCycle = errors.New("initramfs: kernel module dependency cycle")
	// ErrNoModulesDep is returned when the modules directory has no modules.dep.
	ErrNoModulesDep = errors.New("initramfs: no modules.dep (run depmod)")
)

// Module is one loadable kernel module.
type Module struct {
	// Name is the canonical module name: the file name without ".ko" and
	// compression suffix, with '-' turned into '_' (what lsmod shows).
	Name string
	// Path is the module file relative to the modules directory, as
	// modules.dep names it (e.g. "kernel/drivers/vfio/vfio.ko").
	Path string
}

// GuestPath is where the module lands in the guest: under modules/ with
// any compression suffix removed, since busybox insmod loads plain .ko files.
func (m Module) GuestPath(kernelVersion string) string {
	return path.Join("/lib/modules", kernelVersion, stripCompression(m.Path))
}

// Modules is a parsed modules.dep of one kernel.
type Modules struct {
	// Dir is the modules directory (…/lib/modules/<version>).
	Dir     string
	byName  map[string]Module
	deps    map[string][]string // canonical name -> canonical names of direct/transitive deps
	builtin map[string]bool
}

// CanonicalName maps a module name or file name ("vfio-pci", "vfio_pci.ko.xz")
// to the form the kernel uses ("vfio_pci").
func CanonicalName(name string) string {
	n := path.Base(stripCompression(name))
	n = strings.TrimSuffix(n, ".ko")
	return strings.ReplaceAll(n, "-", "_")
}

// moduleName returns the canonical name of module file p, and false when
// p names no module that Lookup or Resolve could find again: an empty
// name ("/.ko"), a directory ("." or "/"), or one that changes when
// canonicalized again ("a.ko.ko").
func moduleName(p string) (string, bool) {
	n := CanonicalName(p)
	switch n {
	case "", ".", "..", "/":
		return "", false
	}
	return n, CanonicalName(n) == n
}

func stripCompression(p string) string {
	for _, s := range []string{".xz", ".gz", ".zst"} {
		if strings.HasSuffix(p, ".ko"+s) {
			return strings.TrimSuffix(p, s)
		}
	}
	return p
}

// LoadModules reads dir/modules.dep and, when present, dir/modules.builtin.
func LoadModules(dir string) (*Modules, error) {
	f, err := os.Open(filepath.Join(dir, "modules.dep"))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%w: %s", ErrNoModulesDep, filepath.Join(dir, "modules.dep"))
		}
		return nil, fmt.Errorf("initramfs: open modules.dep: %w", err)
	}
	defer f.Close()
	m, err := ParseModulesDep(f)
	if err != nil {
		return nil, fmt.Errorf("initramfs: parse %s: %w", filepath.Join(dir, "modules.dep"), err)
	}
	m.Dir = dir
	if b, err := os.ReadFile(filepath.Join(dir, "modules.builtin")); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if line = strings.TrimSpace(line); line != "" {
				m.builtin[CanonicalName(line)] = true
			}
		}
	}
	return m, nil
}

// ParseModulesDep parses modules.dep text ("path: dep dep ..." per line).
func ParseModulesDep(r io.Reader) (*Modules, error) {
	m := &Modules{byName: map[string]Module{}, deps: map[string][]string{}, builtin: map[string]bool{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	lineNo := 0
	for sc.Scan() {
		lineNo++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		file, rest, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(file) == "" {
			return nil, fmt.Errorf("line %d: no \"path:\" in %q", lineNo, line)
		}
		file = strings.TrimSpace(file)
		name, ok := moduleName(file)
		if !ok {
			return nil, fmt.Errorf("line %d: %q is not a module file", lineNo, file)
		}
		m.byName[name] = Module{Name: name, Path: file}
		var deps []string
		for _, d := range strings.Fields(rest) {
			dn, ok := moduleName(d)
			if !ok {
				return nil, fmt.Errorf("line %d: %q is not a module file", lineNo, d)
			}
			deps = append(deps, dn)
		}
		m.deps[name] = deps
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return m, nil
}

// IsBuiltin reports whether the module is compiled into the kernel.
func (m *Modules) IsBuiltin(name string) bool { return m.builtin[CanonicalName(name)] }

// Lookup returns the module called name.
func (m *Modules) Lookup(name string) (Module, bool) {
	mod, ok := m.byName[CanonicalName(name)]
	return mod, ok
}

// Resolve returns the named modules and everything they depend on, each
// once, in an order where every module comes after its dependencies (the
// order to insmod them). Built-in modules are left out. The order follows
// the dependency graph itself, so it does not rely on how modules.dep
// happens to order a line.
func (m *Modules) Resolve(names ...string) ([]Module, error) {
	const (
		unseen = iota
		visiting
		done
	)
	state := map[string]int{}
	var out []Module
	var visit func(n string, from string) error
	visit = func(n, from string) error {
		switch state[n] {
		case done:
			return nil
		case visiting:
			return fmt.Errorf("%w: %s", ErrModuleCycle, n)
		}
		mod, ok := m.byName[n]
		if !ok {
			if m.builtin[n] {
				state[n] = done
				return nil
			}
			if from != "" {
				return fmt.Errorf("%w: %s (needed by %s)", ErrNoModule, n, from)
			}
			return fmt.Errorf("%w: %s", ErrNoModule, n)
		}
		state[n] = visiting
		// modprobe loads a line's dependencies from last to first; follow
		// that order so the result matches what modprobe would do.
		deps := m.deps[n]
		for i := len(deps) - 1; i >= 0; i-- {
			if err := visit(deps[i], n); err != nil {
				return err
			}
		}
		state[n] = done
		out = append(out, mod)
		return nil
	}
	for _, n := range names {
		if err := visit(CanonicalName(n), ""); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// AddModules adds the module files to the archive under
// /lib/modules/<kernelVersion>/, decompressing .ko.gz in Go and .ko.xz or
// .ko.zst with the host's xz or zstd, since busybox insmod wants plain files.
func (a *Archive) AddModules(ctx context.Context, m *Modules, kernelVersion string, mods []Module) error {
	for _, mod := range mods {
		host := filepath.Join(m.Dir, filepath.FromSlash(mod.Path))
		dst := mod.GuestPath(kernelVersion)
		switch {
		case strings.HasSuffix(mod.Path, ".ko"):
			if err := a.AddHostFile(dst, host, 0o644); err != nil {
				return err
			}
		default:
			data, err := decompress(ctx, host)
			if err != nil {
				return err
			}
			if err := a.AddFile(dst, 0o644, data); err != nil {
				return err
			}
		}
	}
	return nil
}

func decompress(ctx context.Context, host string) ([]byte, error) {
	switch {
	case strings.HasSuffix(host, ".gz"):
		f, err := os.Open(host)
		if err != nil {
			return nil, fmt.Errorf("initramfs: open module %q: %w", host, err)
		}
		defer f.Close()
		zr, err := gzip.NewReader(f)
		if err != nil {
			return nil, fmt.Errorf("initramfs: gunzip module %q: %w", host, err)
		}
		b, err := io.ReadAll(zr)
		if err != nil {
			return nil, fmt.Errorf("initramfs: gunzip module %q: %w", host, err)
		}
		return b, nil
	case strings.HasSuffix(host, ".xz"), strings.HasSuffix(host, ".zst"):
		tool := "xz"
		if strings.HasSuffix(host, ".zst") {
			tool = "zstd"
		}
		var stdout, stderr bytes.Buffer
		cmd := exec.CommandContext(ctx, tool, "-dc", host)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			return nil, fmt.Errorf("initramfs: %s -dc %q: %w: %s", tool, host, err, strings.TrimSpace(stderr.String()))
		}
		return stdout.Bytes(), nil
	}
	return nil, fmt.Errorf("initramfs: module %q: unknown compression", host)
}
