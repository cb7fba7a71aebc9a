package qemu

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// Errors of guest test runs.
var (
	// ErrBuild means `go build` or `go test -c` failed on the host.
	ErrBuild = errors.New("qemu: building for the guest failed")
	// ErrNoTests means the guest ran no tests (none matched, or no test files).
	ErrNoTests = errors.New("qemu: no tests ran in the guest")
	// ErrTestsFailed means at least one guest test failed or did not finish.
	ErrTestsFailed = errors.New("qemu: guest tests failed")
	// ErrTestsSkipped means at least one guest test skipped (and skips were not allowed).
	ErrTestsSkipped = errors.New("qemu: guest tests skipped")
)

// goTool is the go command: the one in PATH (go test puts its own there), else $GOROOT/bin/go.
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	if r := os.Getenv("GOROOT"); r != "" {
		return filepath.Join(r, "bin", "go")
	}
	return "go"
}

// guestBuildEnv makes a static linux/amd64 binary: the guest has no libc.
func guestBuildEnv() []string {
	return append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
}

func runGo(ctx context.Context, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, goTool(), args...)
	cmd.Env = guestBuildEnv()
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%w: go %s: %v\n%s", ErrBuild, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// BuildBinary builds the main package pkg (an import path or a ./dir, as
// `go build` takes it, relative to the current directory) into out as a
// static binary for the guest. flags go to `go build` (e.g. "-tags=x").
func BuildBinary(ctx context.Context, pkg, out string, flags ...string) error {
	args := append([]string{"build", "-o", out}, flags...)
	_, err := runGo(ctx, append(args, pkg)...)
	return err
}

// BuildTest compiles the test binary of pkg into out with `go test -c`, as a
// static binary for the guest. It returns ErrNoTests when pkg has no tests.
func BuildTest(ctx context.Context, pkg, out string, flags ...string) error {
	args := append([]string{"test", "-c", "-o", out}, flags...)
	if _, err := runGo(ctx, append(args, pkg)...); err != nil {
		return err
	}
	if _, err := os.Stat(out); err != nil {
		return fmt.Errorf("%w: %s has no test files", ErrNoTests, pkg)
	}
	return nil
}

// packageDir returns the source directory of pkg.
func packageDir(ctx context.Context, pkg string) (string, error) {
	out, err := runGo(ctx, "list", "-f", "{{.Dir}}", pkg)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(out), nil
}

// GoTest is a package's tests to run in a guest.
type GoTest struct {
	// Package is an import path or a ./dir, as `go test` takes it.
	Package string
	// Run is the -test.run pattern; empty runs all tests.
	Run string
	// Args are further test flags ("-test.count=2", "-test.bench=.") and
	// then, after "-args" if the test wants them, its own arguments.
	Args []string
	// BuildFlags go to `go test -c` ("-tags=x", "-race" is not possible: no cgo).
	BuildFlags []string
	// Env is added to the test binary's environment in the guest.
	Env []string
	// AllowSkip accepts guest tests that skip; by default a skip is a failure,
	// because a test meant for the VM that skips there tested nothing.
	AllowSkip bool
}

// guestPkgDir is where the package's testdata goes; tests run there, as
// `go test` runs them in their package directory.
const guestPkgDir = "/vfnic/pkg"

// RunGoTest builds gt.Package's test binary on the host, runs it with
// -test.v=test2json in a guest described by cfg and reads the results
// through `go tool test2json` (see ParseTestOutput). The error
// wraps ErrTestsFailed, ErrTestsSkipped or ErrNoTests when the tests did
// not all pass, or the run's own error (ErrBootFailed, ...) when the guest
// did not get that far. The report is returned whenever the guest ran.
func RunGoTest(ctx context.Context, cfg Config, gt GoTest) (*TestReport, error) {
	dir, err := os.MkdirTemp(cfg.TempDir, "vfnic-gotest-")
	if err != nil {
		return nil, fmt.Errorf("qemu: temp dir: %w", err)
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, testBinaryName(gt.Package))
	if err := BuildTest(ctx, gt.Package, bin, gt.BuildFlags...); err != nil {
		return nil, err
	}
	cmd := Command{Path: bin, Env: gt.Env, Dir: guestPkgDir}
	if pdir, err := packageDir(ctx, gt.Package); err == nil {
		if st, err := os.Stat(filepath.Join(pdir, "testdata")); err == nil && st.IsDir() {
			cfg.Files = append(slices.Clip(cfg.Files), File{Host: filepath.Join(pdir, "testdata"), Guest: guestPkgDir + "/testdata"})
		}
	}
	cmd.Args = TestArgs(cfg, gt)
	if cfg.Output != nil {
		cfg.Output = stripFraming{cfg.Output}
	}
	res, runErr := Run(ctx, cfg, cmd)
	if res == nil {
		return nil, runErr
	}
	rep := &TestReport{Package: gt.Package, Result: res, AllowSkip: gt.AllowSkip}
	tests, parseErr := ParseTestOutput(ctx, gt.Package, res.Output)
	rep.Tests = tests
	if runErr != nil && !errors.Is(runErr, ErrPayloadFailed) {
		rep.Err = runErr
		return rep, runErr
	}
	if parseErr != nil {
		rep.Err = parseErr
		return rep, parseErr
	}
	rep.Err = rep.verdict(runErr)
	return rep, rep.Err
}

// TestArgs returns the test binary's arguments for gt: -test.v=test2json
// (the framing test2json reads without guessing), -test.run,
// a -test.timeout 20 s short of the guest's (so a hung test prints its
// goroutines before the guest is killed), then gt.Args.
func TestArgs(cfg Config, gt GoTest) []string {
	args := []string{"-test.v=test2json"}
	if gt.Run != "" {
		args = append(args, "-test.run="+gt.Run)
	}
	has := func(flag string) bool {
		return slices.ContainsFunc(gt.Args, func(a string) bool {
			a = strings.TrimLeft(a, "-")
			return a == flag || strings.HasPrefix(a, flag+"=")
		})
	}
	timeout := cfg.Timeout
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	if !has("test.timeout") && timeout > 40*time.Second {
		args = append(args, "-test.timeout="+(timeout-20*time.Second).String())
	}
	return append(args, gt.Args...)
}

func testBinaryName(pkg string) string {
	base := filepath.Base(strings.TrimRight(pkg, "/."))
	if base == "" || base == "." || base == "/" {
		base = "pkg"
	}
	return base + ".test"
}

// TestStatus is the outcome of one test.
type TestStatus string

// Test outcomes.
const (
	TestPass TestStatus = "PASS"
	TestFail TestStatus = "FAIL"
	TestSkip TestStatus = "SKIP"
)

// TestResult is one test (or subtest) of a guest run.
type TestResult struct {
	// Name is the full test name ("TestX/sub").
	Name string
	// Status is PASS, FAIL or SKIP; a test that started but never reported
	// (a panic, a timeout) is FAIL.
	Status TestStatus
	// Elapsed is the time the test reported.
	Elapsed time.Duration
	// Output holds the lines the test logged.
	Output string
}

// TestReport is a guest test run.
type TestReport struct {
	// Package is the package tested.
	Package string
	// Result is the guest run.
	Result *Result
	// Tests are the tests and subtests in the order they started.
	Tests []TestResult
	// AllowSkip is copied from GoTest.
	AllowSkip bool
	// Err is the verdict RunGoTest returned.
	Err error
	// Streamed says the guest's lines were logged as they came (go test
	// -v): Report then repeats a test's output only if it failed.
	Streamed bool
}

// ParseTestOutput converts a test binary's -test.v output (best with
// -test.v=test2json, whose framing is unambiguous; plain -test.v=true text
// works too) to per-test results with `go tool test2json`, the converter
// `go test -json` uses. pkg names the package in the events.
func ParseTestOutput(ctx context.Context, pkg, out string) ([]TestResult, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, goTool(), "tool", "test2json", "-t", "-p", pkg)
	// test2json holds a test's result until the next framing line or the
	// binary's final PASS/FAIL line; a binary that died after its last
	// result never prints that line, so one is added (a package-level
	// event, which ParseTestEvents ignores).
	if out != "" && !strings.HasSuffix(out, "\n") {
		out += "\n"
	}
	cmd.Stdin = strings.NewReader(out + "\x16FAIL\n")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("qemu: go tool test2json: %v: %s", err, strings.TrimSpace(stderr.String()))
	}
	return ParseTestEvents(&stdout)
}

// TestEvent is one event of test2json's stream (`go doc test2json`).
type TestEvent struct {
	Time    time.Time `json:",omitempty"`
	Action  string
	Package string  `json:",omitempty"`
	Test    string  `json:",omitempty"`
	Elapsed float64 `json:",omitempty"` // seconds
	Output  string  `json:",omitempty"`
}

// stripFraming drops the ^V (0x16) that -test.v=test2json puts before
// framing lines, so live output reads like `go test -v`.
type stripFraming struct{ w io.Writer }

// lineLogger hands each whole line written to it to logf, prefixed
// "guest: " so that the guest's own "--- PASS" lines are not taken for
// the host's by go test's output parser.
type lineLogger struct {
	logf func(format string, args ...any)
	mu   sync.Mutex
	part []byte
}

func (l *lineLogger) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.part = append(l.part, p...)
	for {
		i := bytes.IndexByte(l.part, '\n')
		if i < 0 {
			return len(p), nil
		}
		l.logf("guest: %s", bytes.TrimRight(l.part[:i], "\r"))
		l.part = l.part[i+1:]
	}
}

func (s stripFraming) Write(p []byte) (int, error) {
	if bytes.IndexByte(p, 0x16) < 0 {
		return s.w.Write(p)
	}
	if _, err := s.w.Write(bytes.ReplaceAll(p, []byte{0x16}, nil)); err != nil {
		return 0, err
	}
	return len(p), nil
}

// framing lines are test2json's copies of the test binary's own RUN, PAUSE,
// CONT, NAME and result lines: the events already say what they say.
var framing = []string{"=== RUN", "=== PAUSE", "=== CONT", "=== NAME", "--- PASS:", "--- FAIL:", "--- SKIP:"}

// ParseTestEvents reads a test2json event stream (`go test -json`,
// `go tool test2json`) into per-test results, in the order the tests
// started. Tests that started but never reported a result are FAIL.
func ParseTestEvents(r io.Reader) ([]TestResult, error) {
	var order []string
	byName := map[string]*TestResult{}
	get := func(name string) *TestResult {
		t, ok := byName[name]
		if !ok {
			t = &TestResult{Name: name}
			byName[name] = t
			order = append(order, name)
		}
		return t
	}
	dec := json.NewDecoder(r)
	for {
		var e TestEvent
		if err := dec.Decode(&e); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("qemu: test2json stream: %w", err)
		}
		if e.Test == "" {
			continue // package-level events
		}
		t := get(e.Test)
		switch e.Action {
		case "pass", "fail", "skip":
			t.Status = TestStatus(strings.ToUpper(e.Action))
			t.Elapsed = seconds(e.Elapsed)
		case "output":
			line := strings.TrimLeft(e.Output, " ")
			if !slices.ContainsFunc(framing, func(f string) bool { return strings.HasPrefix(line, f) }) {
				t.Output += e.Output
			}
		}
	}
	res := make([]TestResult, 0, len(order))
	for _, n := range order {
		t := byName[n]
		if t.Status == "" { // started, never reported
			t.Status = TestFail
			t.Output += noResult + "\n"
		}
		res = append(res, *t)
	}
	return res, nil
}

// emulatorFault says why a guest run says nothing of its tests, or ""
// if it does: QEMU died of a signal it was not sent while no guest test
// had reported a failure (those cut short by the crash report none), or
// the kernel never reached /init.
func emulatorFault(rep *TestReport, err error) string {
	if errors.Is(err, ErrBootFailed) {
		return "the guest did not boot"
	}
	if rep == nil || rep.Result == nil || rep.Result.Signal == "" {
		return ""
	}
	if slices.ContainsFunc(rep.Tests, func(tr TestResult) bool {
		return tr.Status == TestFail && !strings.Contains(tr.Output, noResult)
	}) {
		return ""
	}
	return fmt.Sprintf("QEMU crashed (signal: %s) %v into the run, no guest test having failed before it",
		rep.Result.Signal, rep.Result.Duration.Round(time.Millisecond))
}

// noResult ends the output of a test that started and never reported.
const noResult = "(no result reported: the test binary crashed, panicked or timed out)"

// seconds converts a reported elapsed time to a Duration, saturating: a
// float64 beyond int64's range would otherwise convert to a negative one.
func seconds(s float64) time.Duration {
	switch d := s * float64(time.Second); {
	case d != d || d <= 0: // NaN, or nothing
		return 0
	case d >= math.MaxInt64:
		return math.MaxInt64
	default:
		return time.Duration(d)
	}
}

// Count returns how many results have the status.
func (r *TestReport) Count(s TestStatus) int {
	n := 0
	for _, t := range r.Tests {
		if t.Status == s {
			n++
		}
	}
	return n
}

func (r *TestReport) names(s TestStatus) []string {
	var n []string
	for _, t := range r.Tests {
		if t.Status == s {
			n = append(n, t.Name)
		}
	}
	return n
}

// verdict turns the parsed results and the run error into the report's error.
func (r *TestReport) verdict(runErr error) error {
	switch {
	case r.Count(TestFail) > 0:
		return fmt.Errorf("%w: %s: %s", ErrTestsFailed, r.Package, strings.Join(r.names(TestFail), ", "))
	case runErr != nil:
		// Non-zero exit with no failed test: a crash outside any test,
		// TestMain, or a flag error.
		return fmt.Errorf("%w: %s: test binary failed outside any test: %w", ErrTestsFailed, r.Package, runErr)
	case len(r.Tests) == 0:
		return fmt.Errorf("%w: %s", ErrNoTests, r.Package)
	case r.Count(TestSkip) > 0 && !r.AllowSkip:
		return fmt.Errorf("%w: %s: %s", ErrTestsSkipped, r.Package, strings.Join(r.names(TestSkip), ", "))
	}
	return nil
}

// Report makes each guest test a subtest of t (named like the guest test,
// subtests nested), passing, failing or skipping as it did in the guest,
// with its log. A guest skip fails unless AllowSkip. t fails if the guest
// run failed or no test ran.
func (r *TestReport) Report(t *testing.T) {
	t.Helper()
	if r.Result != nil {
		t.Logf("guest: kernel %s, boot %v, run %v", r.Result.KernelVersion, r.Result.Boot.Round(time.Millisecond), r.Result.Duration.Round(time.Millisecond))
	}
	children := map[string][]TestResult{}
	for _, tr := range r.Tests {
		parent := ""
		if i := strings.LastIndexByte(tr.Name, '/'); i >= 0 {
			parent = tr.Name[:i]
		}
		children[parent] = append(children[parent], tr)
	}
	var run func(t *testing.T, tr TestResult)
	run = func(t *testing.T, tr TestResult) {
		leaf := tr.Name[strings.LastIndexByte(tr.Name, '/')+1:]
		t.Run(leaf, func(t *testing.T) {
			for _, c := range children[tr.Name] {
				run(t, c)
			}
			switch {
			case tr.Output == "":
			case !r.Streamed:
				t.Logf("guest output:\n%s", tr.Output)
			case tr.Status == TestFail:
				t.Logf("guest output (streamed above; repeated beside the failure):\n%s", tr.Output)
			}
			switch tr.Status {
			case TestFail:
				t.Errorf("guest test %s failed (%v)", tr.Name, tr.Elapsed)
			case TestSkip:
				if r.AllowSkip {
					t.Skipf("guest test %s skipped", tr.Name)
				}
				t.Errorf("guest test %s skipped in the guest, where it must run", tr.Name)
			}
		})
	}
	for _, tr := range children[""] {
		run(t, tr)
	}
	if r.Err != nil && !errors.Is(r.Err, ErrTestsFailed) && !errors.Is(r.Err, ErrTestsSkipped) {
		t.Errorf("%v", r.Err)
	} else if r.Err != nil && r.Count(TestFail) == 0 && r.Count(TestSkip) == 0 {
		t.Errorf("%v\n--- guest output ---\n%s", r.Err, r.outputTail())
	}
}

func (r *TestReport) outputTail() string {
	if r.Result == nil {
		return ""
	}
	// -test.v=test2json marks framing lines with ^V (0x16).
	out := strings.ReplaceAll(r.Result.Output, "\x16", "")
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) > 40 {
		lines = lines[len(lines)-40:]
	}
	return strings.Join(lines, "\n")
}

// RunGoTestT is RunGoTest for a host test: it fails t (or, outside CI,
// skips it) when no VM can run, then reports every guest test as a subtest
// of t (see Report). The guest console is logged when the run failed.
// Under go test -v (and when cfg.Output is nil) the guest test binary's
// output is logged line by line as the guest prints it. If QEMU itself
// crashes (Result.Signal) before any guest test failed, or the guest does
// not boot (ErrBootFailed, Config.BootTimeout), that is logged and the
// guest run once more; a second such fault fails t.
//
// The test binary is built static (CGO_ENABLED=0, GOOS=linux,
// GOARCH=amd64) whatever the caller's environment: the guest has no
// shared libraries.
func RunGoTestT(t *testing.T, cfg Config, gt GoTest) *TestReport {
	t.Helper()
	RequireVM(t)
	ctx := t.Context()
	streamed := cfg.Output == nil && testing.Verbose()
	if streamed {
		// go test -v: the guest's lines as they come, so that a slow run
		// is told from a stuck one (the report comes at the end).
		cfg.Output = &lineLogger{logf: t.Logf}
	}
	rep, err := RunGoTest(ctx, cfg, gt)
	if why := emulatorFault(rep, err); why != "" && ctx.Err() == nil {
		// Nothing of the guest's tests is judged by a run the emulator
		// spoiled: they run once more, and a second fault is the
		// verdict. QEMU 10's TCG aborts now and then on
		// "iotlb_to_section: Assertion `section_index <
		// d->map.sections_nb' failed" behind the vIOMMU (2 of 75 runs
		// of tests/virtiovm's packed conformance guest, one of them
		// before the guest's /init ran), and a guest's vCPU 0 once
		// stopped taking timer interrupts during the kernel's boot.
		t.Logf("%s; running the guest once more: %v", why, err)
		rep, err = RunGoTest(ctx, cfg, gt)
	}
	if rep == nil {
		t.Fatalf("guest test run of %s: %v", gt.Package, err)
		return nil
	}
	rep.Streamed = streamed
	rep.Report(t)
	if t.Failed() && rep.Result != nil && !errors.Is(err, ErrTestsFailed) && !errors.Is(err, ErrTestsSkipped) {
		t.Logf("guest console:\n%s", rep.Result.Console)
	}
	return rep
}
