package qemu

import (
	"bytes"
	"context"
	"crypto/rand"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vfnic/vfnic/qemu/initramfs"
)

// Errors that say how a run went wrong. Run's error wraps exactly one of them.
var (
	// ErrBootFailed means QEMU did not start or the guest never reached /init.
	ErrBootFailed = errors.New("qemu: guest did not boot")
	// ErrPayloadNotStarted means /init ran but failed before starting the
	// payload (a module, the hugepages, a NIC binding); the error names the step.
	ErrPayloadNotStarted = errors.New("qemu: guest setup failed, payload never started")
	// ErrPayloadIncomplete means the guest stopped while the payload ran
	// (a kernel panic, or the payload killed the guest).
	ErrPayloadIncomplete = errors.New("qemu: guest stopped before the payload finished")
	// ErrTimeout means the run hit its timeout; the error says in which phase.
	ErrTimeout = errors.New("qemu: guest timed out")
	// ErrPayloadFailed means the payload ran and exited with a non-zero status.
	ErrPayloadFailed = errors.New("qemu: payload exited non-zero")
)

// Defaults for the zero Config.
const (
	DefaultMemoryMB  = 1024            // guest RAM, MiB
	DefaultCPUs      = 2               // guest CPUs
	DefaultAWBits    = 48              // vIOMMU address width (QEMU 7.2 defaults to 39)
	DefaultHugepages = 64              // 2 MiB pages: 128 MiB
	DefaultTimeout   = 3 * time.Minute // whole run, boot included
	// DefaultBootTimeout is Config.BootTimeout's default: a guest boots
	// in 3 to 5 s under TCG, and in up to about 20 s on a busy host.
	DefaultBootTimeout = time.Minute
)

// BaseKernelArgs start every guest's kernel command line. no_timer_check:
// on a loaded host the emulated timer can miss the boot-time check, which
// with interrupt remapping on is a panic ("timer doesn't work through
// Interrupt-remapped IO-APIC").
//
// clocksource=tsc tsc=reliable: under TCG the kernel otherwise picks the
// HPET, and every clock read by a guest program (the Go runtime reads it
// constantly) then waits on QEMU's big lock; 64-byte TX went from about 80k
// to 125k frames/s with the TSC.
var BaseKernelArgs = []string{"console=ttyS0", "intel_iommu=on", "quiet", "panic=-1", "no_timer_check",
	"clocksource=tsc", "tsc=reliable"}

// vfioModules are loaded into every guest; modules.dep supplies the rest of
// the chain (irqbypass, vfio, vfio_virqfd, vfio-pci-core).
var vfioModules = []string{"vfio_pci", "vfio_iommu_type1"}

// Config describes a guest. The zero Config is a 1 GiB, 2-CPU guest with no
// NICs, 64 hugepages (2 MiB) and a 3-minute timeout.
type Config struct {
	// QEMU is the qemu-system-x86_64 binary; empty means FindQEMU.
	QEMU string
	// Kernel is the guest kernel; nil means FindKernel.
	Kernel *Kernel
	// Busybox is a static busybox; empty means FindBusybox.
	Busybox string
	// MemoryMB is the guest RAM in MiB; 0 means DefaultMemoryMB.
	MemoryMB int
	// CPUs is the number of guest CPUs; 0 means DefaultCPUs.
	CPUs int
	// AWBits is the vIOMMU's address width (intel-iommu aw-bits; QEMU
	// accepts 39 or 48); 0 means DefaultAWBits.
	AWBits int
	// NICs are the guest's emulated NICs, in order (see ResolveNICs for slots).
	NICs []NIC
	// Modules are extra kernel modules to load (dependencies are added).
	// The VFIO modules and the drivers of BindLinux NICs are always loaded.
	Modules []string
	// Files are host files or directory trees copied into the guest.
	Files []File
	// Collect are guest files or directory trees copied back to the host
	// once the payload exits (pcaps, profiles, coverage); see Collect.
	Collect []Collect
	// Hugepages is the number of 2 MiB hugepages /init reserves; 0 means
	// DefaultHugepages (at most MemoryMB/16) and a negative number none.
	Hugepages int
	// KernelArgs are appended to BaseKernelArgs.
	KernelArgs []string
	// QEMUArgs are appended to QEMU's command line.
	QEMUArgs []string
	// Timeout bounds the whole run on top of the context; 0 means DefaultTimeout.
	Timeout time.Duration
	// BootTimeout bounds the kernel's boot, until /init runs; 0 means
	// DefaultBootTimeout. A guest past it is killed with ErrBootFailed
	// rather than waited for until Timeout: a kernel that boots in 3 to
	// 5 s and not in a minute has hung (a vCPU that stopped taking timer
	// interrupts under TCG was seen), and nothing of the payload ran.
	BootTimeout time.Duration
	// Console, when set, receives the whole serial console as it arrives.
	Console io.Writer
	// Output, when set, receives the payload's output as it arrives, a line at a time.
	Output io.Writer
	// TempDir is where the initramfs is written; empty means os.TempDir().
	TempDir string
	// NoPVH boots the compressed bzImage instead of the cached vmlinux
	// (see Kernel.PVHImage); slower, for checking the boot path itself.
	NoPVH bool
	// OneTCGThread runs every vCPU on one host thread (-accel
	// tcg,thread=single) instead of one thread per vCPU. The igb
	// conformance suite froze multi-threaded TCG guests in about one run
	// of four (an idle vCPU's timer interrupt never arrives: RCU stall
	// reports "timer wakeup didn't happen", QEMU idle) and in none of ten
	// runs with one thread, at about the same speed.
	OneTCGThread bool
	// Monitor, when set, is served by QEMU (Monitor.Args) so the caller
	// can send it commands while the guest runs.
	Monitor *Monitor
}

// File copies a host file, or a directory tree, into the guest.
type File struct {
	// Host is the host path: a regular file or a directory.
	Host string
	// Guest is the absolute path in the guest.
	Guest string
	// Mode overrides a regular file's permission bits; 0 keeps the host's.
	Mode fs.FileMode
}

// Command is the payload run in the guest.
type Command struct {
	// Path is a host binary (static: the guest has no libraries), copied
	// to /vfnic/bin/<base name> and run.
	Path string
	// GuestPath runs a program already in the guest instead (e.g. one from
	// Config.Files, or "/bin/sh"). Exactly one of Path and GuestPath is set.
	GuestPath string
	// Args are the arguments after the program name.
	Args []string
	// Env holds KEY=VALUE pairs added to the payload's environment, which
	// always has VFNIC_GUEST=1, VFNIC_GUEST_NICS, HOME, TMPDIR and PATH.
	Env []string
	// Dir is the working directory in the guest; empty means /tmp.
	Dir string
}

// Result is what a run produced. Run returns it whenever QEMU was started,
// even with an error, so the console can be inspected.
type Result struct {
	// ExitCode is the payload's exit status, -1 if it did not finish.
	ExitCode int
	// Output is the payload's stdout and stderr (interleaved as written).
	Output string
	// Console is the whole serial console, markers and kernel messages included.
	Console string
	// KernelLog holds the kernel messages logged while the payload ran.
	KernelLog string
	// KernelVersion is the guest's `uname -r`.
	KernelVersion string
	// NICs are the NICs as resolved (slots, MACs, bindings).
	NICs []NIC
	// Bound lists /init's reports of bound NICs ("VFNIC-VFIO: 0000:00:04.0 group 1").
	Bound []string
	// Boot is the time from starting QEMU until /init ran.
	Boot time.Duration
	// Duration is the time of the whole run, initramfs building included.
	Duration time.Duration
	// Args is QEMU's command line (without the binary).
	Args []string
	// Collected are the host paths of the files brought back (Config.Collect).
	Collected []string
	// Signal names the signal that ended QEMU itself ("aborted",
	// "killed") when it died of one that Run did not send: the emulator
	// crashed (a failed assertion in it) or was killed from outside (the
	// kernel's OOM killer); empty otherwise.
	Signal string
}

// plan is a checked Config with everything looked up.
type plan struct {
	cfg     Config
	qemu    string
	info    *QEMUInfo
	kernel  *Kernel
	busybox string
	image   string // kernel image QEMU boots
	nics    []NIC
	modDB   *initramfs.Modules
	modules []initramfs.Module
	argv    []string
	cmd     Command
	collect string // the collect disk image, when Config.Collect is set
	taps    int    // NetTap NICs (their taps are opened by Run)
}

var envNameRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)

func newPlan(ctx context.Context, cfg Config, cmd Command) (*plan, error) {
	p := &plan{cfg: cfg, cmd: cmd}
	c := &p.cfg
	if c.MemoryMB == 0 {
		c.MemoryMB = DefaultMemoryMB
	}
	if c.CPUs == 0 {
		c.CPUs = DefaultCPUs
	}
	if c.AWBits == 0 {
		c.AWBits = DefaultAWBits
	}
	if c.Hugepages == 0 {
		// An eighth of a small guest at most, so the default always fits.
		c.Hugepages = min(DefaultHugepages, c.MemoryMB/16)
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.BootTimeout == 0 {
		c.BootTimeout = DefaultBootTimeout
	}
	switch {
	case c.MemoryMB < 128:
		return nil, fmt.Errorf("%w: MemoryMB %d (want at least 128)", ErrBadConfig, c.MemoryMB)
	case c.CPUs < 1 || c.CPUs > 64:
		return nil, fmt.Errorf("%w: CPUs %d", ErrBadConfig, c.CPUs)
	case c.AWBits < 39 || c.AWBits > 64:
		return nil, fmt.Errorf("%w: AWBits %d (QEMU accepts 39 or 48)", ErrBadConfig, c.AWBits)
	case c.Hugepages > 0 && c.Hugepages*2 >= c.MemoryMB:
		return nil, fmt.Errorf("%w: %d hugepages do not fit in %d MiB", ErrBadConfig, c.Hugepages, c.MemoryMB)
	case c.Timeout < 0 || c.BootTimeout < 0:
		return nil, fmt.Errorf("%w: Timeout %v, BootTimeout %v", ErrBadConfig, c.Timeout, c.BootTimeout)
	}
	if (cmd.Path == "") == (cmd.GuestPath == "") {
		return nil, fmt.Errorf("%w: Command needs exactly one of Path and GuestPath", ErrBadConfig)
	}
	if cmd.GuestPath != "" && !path.IsAbs(cmd.GuestPath) {
		return nil, fmt.Errorf("%w: GuestPath %q is not absolute", ErrBadConfig, cmd.GuestPath)
	}
	if cmd.Dir != "" && !path.IsAbs(cmd.Dir) {
		return nil, fmt.Errorf("%w: Dir %q is not absolute", ErrBadConfig, cmd.Dir)
	}
	for _, e := range cmd.Env {
		if !envNameRe.MatchString(e) {
			return nil, fmt.Errorf("%w: environment entry %q is not KEY=VALUE", ErrBadConfig, e)
		}
	}
	for _, f := range c.Files {
		if f.Host == "" || !path.IsAbs(f.Guest) {
			return nil, fmt.Errorf("%w: File{Host: %q, Guest: %q} needs a host path and an absolute guest path", ErrBadConfig, f.Host, f.Guest)
		}
	}
	if err := checkCollect(c.Collect); err != nil {
		return nil, err
	}
	nics, err := ResolveNICs(c.NICs)
	if err != nil {
		return nil, err
	}
	p.nics = nics
	p.taps = assignTapFDs(p.nics)

	if p.qemu = c.QEMU; p.qemu == "" {
		if p.qemu, err = FindQEMU(); err != nil {
			return nil, err
		}
	}
	if p.info, err = Probe(ctx, p.qemu); err != nil {
		return nil, err
	}
	for i, n := range nics {
		if !p.info.HasNIC(n.Model) {
			return nil, fmt.Errorf("%w: NIC %d: %q is not in `%s -device help` (QEMU %s offers %s)",
				ErrNICUnavailable, i, n.Model, p.qemu, p.info.Version, strings.Join(p.info.NICModels, ", "))
		}
		if err := checkNICProps(ctx, p.qemu, p.info, n); err != nil {
			return nil, fmt.Errorf("NIC %d: %w", i, err)
		}
	}
	if p.kernel = c.Kernel; p.kernel == nil {
		if p.kernel, err = FindKernel(); err != nil {
			return nil, err
		}
	}
	p.image = p.kernel.Image
	if !c.NoPVH {
		// A failed extraction only costs boot time: keep the bzImage.
		if img, err := p.kernel.PVHImage(ctx); err == nil {
			p.image = img
		}
	}
	if p.busybox = c.Busybox; p.busybox == "" {
		if p.busybox, err = FindBusybox(); err != nil {
			return nil, err
		}
	}
	if p.modDB, err = initramfs.LoadModules(p.kernel.ModulesDir); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoKernel, err)
	}
	want := append([]string{}, vfioModules...)
	for _, n := range nics {
		if n.Bind == BindLinux {
			want = append(want, LinuxModules(n.Model)...)
		}
	}
	if len(c.Collect) > 0 {
		want = append(want, collectModules...)
	}
	want = append(want, c.Modules...)
	if p.modules, err = p.modDB.Resolve(want...); err != nil {
		return nil, fmt.Errorf("%w: %v (kernel %s)", ErrBadConfig, err, p.kernel.ModulesDir)
	}
	if cmd.Path != "" {
		if _, err := os.Stat(cmd.Path); err != nil {
			return nil, fmt.Errorf("%w: payload: %v", ErrBadConfig, err)
		}
		// The guest has no shared libraries: catch a dynamic binary here
		// rather than as a cryptic "not found" from the guest's shell.
		if f, err := elf.Open(cmd.Path); err == nil {
			f.Close()
			if err := checkStatic(cmd.Path); err != nil {
				return nil, fmt.Errorf("%w: payload %v (built with cgo?): the guest has no shared libraries; "+
					"build it static with CGO_ENABLED=0 (go test: CGO_ENABLED=0 go test -exec vmexec ./pkg)", ErrBadConfig, err)
			}
		}
		p.argv = []string{"/vfnic/bin/" + filepath.Base(cmd.Path)}
	} else {
		p.argv = []string{cmd.GuestPath}
	}
	p.argv = append(p.argv, cmd.Args...)
	return p, nil
}

// qemuArgs is QEMU's command line for the plan, booting initrd.
func (p *plan) qemuArgs(initrd string) []string {
	c := p.cfg
	accel := "tcg"
	if c.OneTCGThread {
		accel = "tcg,thread=single"
	}
	args := []string{
		"-machine", "q35",
		"-accel", accel,
		"-cpu", "max",
		"-m", strconv.Itoa(c.MemoryMB),
		"-smp", strconv.Itoa(c.CPUs),
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-chardev", "stdio,id=con0,signal=off",
		"-serial", "chardev:con0",
		// The vIOMMU must precede the PCI devices it translates for.
		"-device", fmt.Sprintf("intel-iommu,intremap=on,caching-mode=on,aw-bits=%d", c.AWBits),
		"-kernel", p.image,
		"-initrd", initrd,
		"-append", strings.Join(append(append([]string{}, BaseKernelArgs...), c.KernelArgs...), " "),
	}
	for i, n := range p.nics {
		args = append(args, n.qemuArgs(i)...)
	}
	args = append(args, c.QEMUArgs...)
	if c.Monitor != nil {
		args = append(args, c.Monitor.Args()...)
	}
	if p.collect != "" {
		// Last, so QEMU gives it a slot none of the above asked for.
		args = append(args, collectArgs(p.collect)...)
	}
	return args
}

var (
	appletMu    sync.Mutex
	appletCache = map[string][]string{}
)

// fallbackApplets are what /init itself uses, for a busybox that cannot list its applets.
var fallbackApplets = []string{"bin/sh", "bin/mount", "bin/mkdir", "bin/uname", "bin/ip", "bin/cat",
	"bin/ls", "bin/readlink", "bin/basename", "bin/sleep", "bin/sync", "bin/dmesg", "bin/tail",
	"bin/wc", "bin/env", "sbin/insmod", "sbin/poweroff", "bin/echo"}

// applets lists busybox's applets with their install paths ("bin/sh").
func applets(ctx context.Context, busybox string) []string {
	appletMu.Lock()
	defer appletMu.Unlock()
	if a, ok := appletCache[busybox]; ok {
		return a
	}
	out, err := exec.CommandContext(ctx, busybox, "--list-full").Output()
	a := strings.Fields(string(out))
	if err != nil || len(a) == 0 {
		a = fallbackApplets
	} else {
		appletCache[busybox] = a
	}
	return a
}

// archive builds the initramfs.
func (p *plan) archive(ctx context.Context, nonce string) (*initramfs.Archive, error) {
	a := initramfs.NewArchive()
	for _, d := range []string{"bin", "sbin", "usr/bin", "usr/sbin", "dev", "proc", "sys", "run", "etc", "root", "vfnic/bin", "lib/modules"} {
		if err := a.AddDir(d, 0o755); err != nil {
			return nil, err
		}
	}
	if err := a.AddDir("tmp", 0o1777|fs.ModeSticky); err != nil {
		return nil, err
	}
	// The kernel opens /dev/console for /init before devtmpfs is mounted.
	if err := a.AddCharDev("dev/console", 0o600, 5, 1); err != nil {
		return nil, err
	}
	if err := a.AddCharDev("dev/null", 0o666, 1, 3); err != nil {
		return nil, err
	}
	// Go's resolver reads /etc/hosts for "localhost"; os/user reads passwd.
	etc := map[string]string{
		"etc/hosts":  "127.0.0.1 localhost\n::1 localhost\n",
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\n",
		"etc/group":  "root:x:0:\n",
	}
	for name, body := range etc {
		if err := a.AddFile(name, 0o644, []byte(body)); err != nil {
			return nil, err
		}
	}
	for _, f := range p.cfg.Files {
		st, err := os.Stat(f.Host)
		if err != nil {
			return nil, fmt.Errorf("%w: file %q: %v", ErrBadConfig, f.Host, err)
		}
		if st.IsDir() {
			err = a.AddHostTree(f.Guest, f.Host)
		} else {
			err = a.AddHostFile(f.Guest, f.Host, f.Mode)
		}
		if err != nil {
			return nil, err
		}
	}
	if p.cmd.Path != "" {
		if err := a.AddHostFile(p.argv[0], p.cmd.Path, 0o755); err != nil {
			return nil, err
		}
	}
	if err := a.AddModules(ctx, p.modDB, p.kernel.Version, p.modules); err != nil {
		return nil, err
	}
	if err := a.AddHostFile("bin/busybox", p.busybox, 0o755); err != nil {
		return nil, err
	}
	// Applet links are made here rather than by `busybox --install` at
	// boot, which costs time under TCG. Caller files win over applets.
	for _, ap := range applets(ctx, p.busybox) {
		if ap == "bin/busybox" || a.Has(ap) {
			continue
		}
		if err := a.AddSymlink(ap, "/bin/busybox"); err != nil {
			return nil, err
		}
	}
	if err := a.AddFile("init", 0o755, []byte(p.initScript(nonce))); err != nil {
		return nil, err
	}
	return a, nil
}

func (p *plan) initScript(nonce string) string {
	mods := make([]string, len(p.modules))
	for i, m := range p.modules {
		mods[i] = m.GuestPath(p.kernel.Version)
	}
	env := []string{"VFNIC_GUEST_NICS=" + FormatNICs(p.nics)}
	return initScript(initParams{
		Modules:   mods,
		Hugepages: p.cfg.Hugepages,
		NICs:      p.nics,
		Argv:      p.argv,
		Env:       append(env, p.cmd.Env...),
		Dir:       p.cmd.Dir,
		Nonce:     nonce,
		Collect:   p.cfg.Collect,
	})
}

// Run boots a guest described by cfg, runs cmd in it and returns its result.
// The guest is killed and its temporary files removed when ctx ends or the
// timeout passes. The error wraps ErrBootFailed, ErrPayloadNotStarted,
// ErrPayloadIncomplete, ErrTimeout, ErrPayloadFailed or, when the payload
// succeeded but Config.Collect's files did not all come back, ErrCollect
// (or a setup error such as ErrNoQEMU, ErrNoKernel, ErrNICUnavailable,
// ErrBadConfig, in which case the Result is nil). Collected files come
// back whenever the payload finished, whatever its exit status.
func Run(ctx context.Context, cfg Config, cmd Command) (*Result, error) {
	start := time.Now()
	p, err := newPlan(ctx, cfg, cmd)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()

	var nb [8]byte
	if _, err := rand.Read(nb[:]); err != nil {
		return nil, fmt.Errorf("qemu: marker nonce: %w", err)
	}
	nonce := hex.EncodeToString(nb[:])

	dir, err := os.MkdirTemp(p.cfg.TempDir, "vfnic-qemu-")
	if err != nil {
		return nil, fmt.Errorf("qemu: temp dir: %w", err)
	}
	defer os.RemoveAll(dir)
	if len(p.cfg.Collect) > 0 {
		p.collect = filepath.Join(dir, "collect.img")
		if err := createCollectImage(p.collect); err != nil {
			return nil, err
		}
	}
	initrd := filepath.Join(dir, "initrd.cpio")
	if err := p.writeInitrd(ctx, initrd, nonce); err != nil {
		return nil, err
	}

	var taps *tapWires
	if p.taps > 0 {
		if taps, err = openTapWires(p.nics); err != nil {
			return nil, err
		}
		defer taps.Close()
	}
	args := p.qemuArgs(initrd)
	con := newConsole(nonce, p.cfg.Console, p.cfg.Output)
	var stderr bytes.Buffer
	c := exec.Command(p.qemu, args...)
	if taps != nil {
		c.ExtraFiles = taps.files // fd 3 upwards, as assignTapFDs numbered them
	}
	c.Stdout = con
	c.Stderr = &limitedBuffer{buf: &stderr, max: 64 << 10}
	// glibc's fatal messages (heap corruption, a failed assertion) go
	// to stderr, which the error quotes, rather than to a terminal.
	c.Env = append(os.Environ(), "LIBC_FATAL_STDERR_=1")
	// If this process dies, QEMU goes with it instead of running on.
	c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	res := &Result{ExitCode: -1, NICs: p.nics, Args: args}
	if err := c.Start(); err != nil {
		res.Duration = time.Since(start)
		return res, fmt.Errorf("%w: start %s: %v", ErrBootFailed, p.qemu, err)
	}
	waitErr := make(chan error, 1)
	go func() { waitErr <- c.Wait() }()
	var qerr error
	bootTimer := time.NewTimer(p.cfg.BootTimeout)
	defer bootTimer.Stop()
	bootHung := false
wait:
	for {
		select {
		case qerr = <-waitErr:
			break wait
		case <-ctx.Done():
			_ = c.Process.Kill()
			qerr = <-waitErr
			break wait
		case <-bootTimer.C:
			con.mu.Lock()
			bootHung = con.phase == phaseBoot
			con.mu.Unlock()
			if bootHung {
				_ = c.Process.Kill()
				qerr = <-waitErr
				break wait
			}
		}
	}
	con.flush()
	if ctx.Err() == nil && !bootHung {
		res.Signal = exitSignal(qerr)
	}

	con.mu.Lock()
	res.ExitCode = con.exitCode
	res.Output = con.out.String()
	res.Console = con.all.String()
	res.KernelLog = con.klog.String()
	res.KernelVersion = con.kernelVersion
	res.Boot = con.bootTime
	res.Bound = append([]string(nil), con.info...)
	phase, setupErr, haveExit := con.phase, con.setupErr, con.haveExit
	collectStatus, missing := con.collect, con.missing
	con.mu.Unlock()
	res.Duration = time.Since(start)

	diag := func() string {
		s := "\n--- console (last lines) ---\n" + con.tail(30)
		if e := strings.TrimSpace(stderr.String()); e != "" {
			s += "\n--- qemu stderr ---\n" + e
		}
		return s
	}
	if bootHung {
		return res, fmt.Errorf("%w: the kernel did not reach /init within %v (BootTimeout)%s", ErrBootFailed, p.cfg.BootTimeout, diag())
	}
	if ctx.Err() != nil && !haveExit {
		what := map[int]string{
			phaseBoot:    "while the kernel booted",
			phaseSetup:   "during /init setup, before the payload started",
			phasePayload: "while the payload ran",
		}[phase]
		if what == "" {
			what = "after the payload exited"
		}
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return res, fmt.Errorf("%w %s (after %v, timeout %v): %w%s", ErrTimeout, what,
				res.Duration.Round(time.Millisecond), p.cfg.Timeout, ctx.Err(), diag())
		}
		return res, fmt.Errorf("qemu: run canceled %s: %w", what, ctx.Err())
	}
	var collectErr error
	if p.collect != "" && haveExit {
		res.Collected, collectErr = p.bringBack(collectStatus, missing)
	}
	switch {
	case phase == phaseBoot:
		return res, fmt.Errorf("%w: qemu exited (%v) before /init ran%s", ErrBootFailed, exitDesc(qerr), diag())
	case phase == phaseSetup:
		if setupErr == "" {
			setupErr = "guest stopped during /init setup"
		}
		return res, fmt.Errorf("%w: %s%s", ErrPayloadNotStarted, setupErr, diag())
	case !haveExit:
		return res, fmt.Errorf("%w: no exit status from %s (qemu %v)%s", ErrPayloadIncomplete, p.argv[0], exitDesc(qerr), diag())
	case res.ExitCode != 0:
		if collectErr != nil {
			return res, fmt.Errorf("%w: %s exited with status %d (and %v)", ErrPayloadFailed, p.argv[0], res.ExitCode, collectErr)
		}
		return res, fmt.Errorf("%w: %s exited with status %d", ErrPayloadFailed, p.argv[0], res.ExitCode)
	}
	return res, collectErr
}

// bringBack extracts what the guest wrote to the collect disk, and reports
// the paths it did not have and a failed transfer as an ErrCollect error.
func (p *plan) bringBack(status string, missing []string) ([]string, error) {
	var why []string
	if status != "ok" {
		if status == "" {
			status = "the guest stopped before writing them"
		}
		why = append(why, status)
	}
	written, err := extractCollect(p.collect, p.cfg.Collect)
	if err != nil {
		why = append(why, strings.TrimPrefix(err.Error(), ErrCollect.Error()+": "))
	}
	if len(missing) > 0 {
		why = append(why, "the guest has no "+strings.Join(missing, ", "))
	}
	if len(why) > 0 {
		return written, fmt.Errorf("%w: %s", ErrCollect, strings.Join(why, "; "))
	}
	return written, nil
}

// exitSignal names the signal a command died of, given Wait's error;
// empty if it exited.
func exitSignal(err error) string {
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		if ws, ok := exitErr.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return ws.Signal().String()
		}
	}
	return ""
}

func exitDesc(err error) string {
	if err == nil {
		return "status 0"
	}
	return err.Error()
}

func (p *plan) writeInitrd(ctx context.Context, name, nonce string) error {
	a, err := p.archive(ctx, nonce)
	if err != nil {
		return err
	}
	f, err := os.Create(name)
	if err != nil {
		return fmt.Errorf("qemu: create initramfs: %w", err)
	}
	if _, err := a.WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("qemu: write initramfs %s: %w", name, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("qemu: write initramfs %s: %w", name, err)
	}
	return nil
}

// limitedBuffer keeps the first max bytes written and drops the rest, so a
// chatty QEMU cannot grow memory without bound.
type limitedBuffer struct {
	mu  sync.Mutex
	buf *bytes.Buffer
	max int
}

// Write keeps what fits and always reports success, so QEMU never blocks on stderr.
func (l *limitedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if room := l.max - l.buf.Len(); room > 0 {
		if len(p) > room {
			l.buf.Write(p[:room])
		} else {
			l.buf.Write(p)
		}
	}
	return len(p), nil
}
