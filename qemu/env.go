package qemu

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// Sentinel errors for a missing or unusable environment.
var (
	// ErrNoQEMU means qemu-system-x86_64 was not found or does not run.
	ErrNoQEMU = errors.New("qemu: qemu-system-x86_64 not found (" + SetupHint + ")")
	// ErrNoKernel means no guest kernel with a modules directory is in the cache.
	ErrNoKernel = errors.New("qemu: guest kernel not found (" + SetupHint + ")")
	// ErrNoBusybox means no static busybox was found for the initramfs.
	ErrNoBusybox = errors.New("qemu: static busybox not found (" + SetupHint + ")")
)

// SetupHint names what a user runs to install QEMU, busybox and the
// kernel: the Go entry point from any module, make in a vfnic checkout.
const SetupHint = "run `go run github.com/vfnic/vfnic/qemu/cmd/vmsetup` as root; in a vfnic checkout `make setup` (scripts/setup.sh)"

// CacheDir returns the vfnic cache directory: $VFNIC_CACHE, else
// $XDG_CACHE_HOME/vfnic, else ~/.cache/vfnic.
func CacheDir() string {
	if d := os.Getenv("VFNIC_CACHE"); d != "" {
		return d
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "vfnic")
	}
	home, err := os.UserHomeDir()
	if err != nil || home == "" {
		home = "/root"
	}
	return filepath.Join(home, ".cache", "vfnic")
}

// FindQEMU returns the path of qemu-system-x86_64: $VFNIC_QEMU if set,
// else the one in PATH.
func FindQEMU() (string, error) {
	if p := os.Getenv("VFNIC_QEMU"); p != "" {
		if err := checkExecutable(p); err != nil {
			return "", fmt.Errorf("%w: $VFNIC_QEMU=%s: %v", ErrNoQEMU, p, err)
		}
		return p, nil
	}
	p, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		return "", fmt.Errorf("%w: looked in PATH=%s", ErrNoQEMU, os.Getenv("PATH"))
	}
	return p, nil
}

func checkExecutable(p string) error {
	st, err := os.Stat(p)
	if err != nil {
		return err
	}
	if st.IsDir() || st.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file", p)
	}
	return nil
}

// Kernel is a guest kernel image with its modules.
type Kernel struct {
	// Image is the bzImage (vmlinuz) path.
	Image string
	// Version is the kernel release, as `uname -r` prints it in the guest.
	Version string
	// ModulesDir is lib/modules/<Version>, holding modules.dep.
	ModulesDir string
}

// FindKernel returns the guest kernel in CacheDir()/kernel: the newest
// boot/vmlinuz-<version> that has lib/modules/<version>/modules.dep.
func FindKernel() (*Kernel, error) {
	return FindKernelIn(filepath.Join(CacheDir(), "kernel"))
}

// FindBackportsKernel returns the second guest kernel, in
// CacheDir()/kernel-bpo: Debian trixie-backports' linux-image-amd64
// (scripts/setup.sh fetches it), for a test that needs a newer kernel
// than the default bookworm one passes it as Config.Kernel. The one
// such test, tests/afxdpvm, needs virtio_net's and igb's AF_XDP
// zero-copy (Linux 6.13 and 6.14: bookworm's newest, 6.12, refuses
// XDP_ZEROCOPY).
func FindBackportsKernel() (*Kernel, error) {
	return FindKernelIn(filepath.Join(CacheDir(), "kernel-bpo"))
}

// FindKernelIn is FindKernel for a root laid out like an unpacked kernel
// package (boot/vmlinuz-<v>, lib/modules/<v>/).
func FindKernelIn(root string) (*Kernel, error) {
	images, _ := filepath.Glob(filepath.Join(root, "boot", "vmlinuz-*"))
	if len(images) == 0 {
		return nil, fmt.Errorf("%w: no %s", ErrNoKernel, filepath.Join(root, "boot", "vmlinuz-*"))
	}
	var found []*Kernel
	var missing []string
	for _, img := range images {
		v := strings.TrimPrefix(filepath.Base(img), "vmlinuz-")
		md := filepath.Join(root, "lib", "modules", v)
		if _, err := os.Stat(filepath.Join(md, "modules.dep")); err != nil {
			missing = append(missing, filepath.Join(md, "modules.dep"))
			continue
		}
		found = append(found, &Kernel{Image: img, Version: v, ModulesDir: md})
	}
	if len(found) == 0 {
		return nil, fmt.Errorf("%w: %s present but no %s", ErrNoKernel, strings.Join(images, ", "), strings.Join(missing, ", "))
	}
	sort.Slice(found, func(i, j int) bool { return versionLess(found[i].Version, found[j].Version) })
	return found[len(found)-1], nil
}

// versionLess orders kernel releases by their numeric fields ("6.1.0-56"
// before "6.1.0-112"), falling back to string order.
func versionLess(a, b string) bool {
	split := func(s string) []string {
		return strings.FieldsFunc(s, func(r rune) bool { return r == '.' || r == '-' || r == '+' || r == '_' })
	}
	fa, fb := split(a), split(b)
	for i := 0; i < len(fa) && i < len(fb); i++ {
		na, ea := strconv.Atoi(fa[i])
		nb, eb := strconv.Atoi(fb[i])
		if ea == nil && eb == nil {
			if na != nb {
				return na < nb
			}
			continue
		}
		if fa[i] != fb[i] {
			return fa[i] < fb[i]
		}
	}
	return len(fa) < len(fb)
}

// FindBusybox returns a statically linked busybox: $VFNIC_BUSYBOX if set,
// else /bin/busybox, else busybox in PATH. It must be static because the
// initramfs holds no shared libraries.
func FindBusybox() (string, error) {
	var cands []string
	if p := os.Getenv("VFNIC_BUSYBOX"); p != "" {
		cands = []string{p}
	} else {
		cands = []string{"/bin/busybox", "/usr/bin/busybox"}
		if p, err := exec.LookPath("busybox"); err == nil {
			cands = append(cands, p)
		}
	}
	var why []string
	for _, p := range cands {
		if err := checkExecutable(p); err != nil {
			why = append(why, err.Error())
			continue
		}
		if err := checkStatic(p); err != nil {
			why = append(why, err.Error()+" (install busybox-static)")
			continue
		}
		return p, nil
	}
	return "", fmt.Errorf("%w: %s", ErrNoBusybox, strings.Join(why, "; "))
}

// checkStatic fails for an ELF file with a program interpreter (a dynamic executable).
func checkStatic(p string) error {
	f, err := elf.Open(p)
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked", p)
		}
	}
	return nil
}
