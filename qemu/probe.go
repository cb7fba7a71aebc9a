package qemu

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// QEMUInfo is what an installed qemu-system-x86_64 offers.
type QEMUInfo struct {
	// Path is the binary probed.
	Path string
	// Version is the version string ("10.0.2").
	Version string
	// Major and Minor are Version's first two numbers (10 and 0).
	Major, Minor int
	// NICModels lists the PCI network device models of `-device help`, sorted.
	NICModels []string
}

// HasNIC reports whether the model (a -device name such as "igb") is offered.
func (q *QEMUInfo) HasNIC(model NICModel) bool {
	i := sort.SearchStrings(q.NICModels, string(model))
	return i < len(q.NICModels) && q.NICModels[i] == string(model)
}

var (
	probeMu    sync.Mutex
	probeCache = map[string]*QEMUInfo{}
)

// Probe runs the QEMU binary once with -version and once with -device help
// and caches the result for the life of the process.
func Probe(ctx context.Context, qemuPath string) (*QEMUInfo, error) {
	probeMu.Lock()
	defer probeMu.Unlock()
	if q, ok := probeCache[qemuPath]; ok {
		return q, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ver, err := runProbe(ctx, qemuPath, "-version")
	if err != nil {
		return nil, err
	}
	help, err := runProbe(ctx, qemuPath, "-device", "help")
	if err != nil {
		return nil, err
	}
	q := &QEMUInfo{Path: qemuPath}
	q.Version, q.Major, q.Minor = parseVersion(ver)
	q.NICModels = parseNICModels(help)
	probeCache[qemuPath] = q
	return q, nil
}

func runProbe(ctx context.Context, qemuPath string, args ...string) (string, error) {
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, qemuPath, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%w: probe %s %s: %v: %s", ErrNoQEMU, qemuPath, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return out.String(), nil
}

var versionRe = regexp.MustCompile(`version (\d+)\.(\d+)(\.\d+)?`)

func parseVersion(s string) (string, int, int) {
	m := versionRe.FindStringSubmatch(s)
	if m == nil {
		return "", 0, 0
	}
	major, _ := strconv.Atoi(m[1])
	minor, _ := strconv.Atoi(m[2])
	return m[1] + "." + m[2] + m[3], major, minor
}

var deviceRe = regexp.MustCompile(`^name "([^"]+)", bus PCI`)

// parseNICModels picks the PCI devices of the "Network devices:" section.
func parseNICModels(help string) []string {
	var out []string
	in := false
	for _, line := range strings.Split(help, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasSuffix(line, "devices:"):
			in = line == "Network devices:"
			continue
		case !in:
			continue
		}
		if m := deviceRe.FindStringSubmatch(line); m != nil {
			out = append(out, m[1])
		}
	}
	sort.Strings(out)
	return out
}
