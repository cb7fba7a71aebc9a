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

var (
	propsMu    sync.Mutex
	propsCache = map[string]map[string]string{} // qemu path + "\x00" + model
)

var propRe = regexp.MustCompile(`^\s+([A-Za-z0-9_.-]+)=<([^>]+)>`)

// DeviceProps returns the properties of a -device model with their types
// ("bool", "uint16", "str", ...), as `qemuPath -machine none -device
// MODEL,help` lists them. Results are cached for the life of the process.
func DeviceProps(ctx context.Context, qemuPath string, model NICModel) (map[string]string, error) {
	key := qemuPath + "\x00" + string(model)
	propsMu.Lock()
	defer propsMu.Unlock()
	if p, ok := propsCache[key]; ok {
		return p, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	help, err := runProbe(ctx, qemuPath, "-machine", "none", "-device", string(model)+",help")
	if err != nil {
		return nil, err
	}
	p := parseDeviceProps(help)
	propsCache[key] = p
	return p, nil
}

func parseDeviceProps(help string) map[string]string {
	p := map[string]string{}
	for _, line := range strings.Split(help, "\n") {
		if m := propRe.FindStringSubmatch(line); m != nil {
			p[m[1]] = m[2]
		}
	}
	return p
}

// checkPropValue checks a property value against the type QEMU lists for
// it, for the types whose syntax is plain; QEMU checks the others at boot.
func checkPropValue(typ, v string) error {
	switch typ {
	case "bool":
		switch v {
		case "on", "off", "true", "false", "yes", "no":
			return nil
		}
		return fmt.Errorf("%q is not a bool (on or off)", v)
	case "uint8", "uint16", "uint32", "uint64":
		bits, _ := strconv.Atoi(strings.TrimPrefix(typ, "uint"))
		if _, err := strconv.ParseUint(v, 0, bits); err != nil {
			return fmt.Errorf("%q is not a %s (0 to %d)", v, typ, uint64(1)<<bits-1)
		}
	case "int8", "int16", "int32", "int64":
		bits, _ := strconv.Atoi(strings.TrimPrefix(typ, "int"))
		if _, err := strconv.ParseInt(v, 0, bits); err != nil {
			return fmt.Errorf("%q is not an %s", v, typ)
		}
	}
	return nil
}

// checkNICProps checks a NIC's properties against what QEMU offers for its model.
func checkNICProps(ctx context.Context, qemuPath string, info *QEMUInfo, n NIC) error {
	if len(n.Props) == 0 {
		return nil
	}
	have, err := DeviceProps(ctx, qemuPath, n.Model)
	if err != nil {
		return err
	}
	for _, k := range sortedKeys(n.Props) {
		typ, ok := have[k]
		if !ok {
			return fmt.Errorf("%w: QEMU %s's %s has no property %q (it has: %s)",
				ErrBadConfig, info.Version, n.Model, k, strings.Join(sortedKeys(have), ", "))
		}
		if err := checkPropValue(typ, n.Props[k]); err != nil {
			return fmt.Errorf("%w: %s property %s: %v", ErrBadConfig, n.Model, k, err)
		}
	}
	return nil
}
