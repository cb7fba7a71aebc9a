package virtiovm

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The rate benchmarks share two host cores between QEMU's threads (one
// per vCPU, the main loop that emulates the devices), this test's host
// side and whatever else runs on the machine. These helpers tell where the
// time went during a benchmark, so that a figure can be read against its
// bound: CPU time per QEMU thread, this process's CPU time, and the state
// of QEMU's receiving socket (datagrams it dropped, bytes queued).

// qemuPID finds the QEMU process whose command line holds the dgram
// netdev that receives on port.
func qemuPID(port int) int {
	key := []byte(fmt.Sprintf("local.port=%d,", port))
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cl, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(cl, []byte("qemu-system")) && bytes.Contains(cl, key) {
			return pid
		}
	}
	return 0
}

// cpuSnap is the CPU time of each QEMU thread (by name) and of this
// process, at one moment.
type cpuSnap struct {
	at      time.Time
	threads map[string]time.Duration
	self    time.Duration
}

const clockTick = 100 // USER_HZ on Linux

func takeCPU(pid int) cpuSnap {
	s := cpuSnap{at: time.Now(), threads: map[string]time.Duration{}}
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) == nil {
		s.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	if pid == 0 {
		return s
	}
	dir := fmt.Sprintf("/proc/%d/task", pid)
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "stat"))
		if err != nil {
			continue
		}
		// comm is in parentheses and may hold spaces.
		lp, rp := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
		if lp < 0 || rp < lp {
			continue
		}
		name := string(b[lp+1 : rp])
		f := strings.Fields(string(b[rp+1:]))
		if len(f) < 13 {
			continue
		}
		ut, _ := strconv.ParseUint(f[11], 10, 64)
		st, _ := strconv.ParseUint(f[12], 10, 64)
		s.threads[name] += time.Duration(ut+st) * time.Second / clockTick
	}
	return s
}

// since describes the CPU used between a and b as shares of the wall
// time: QEMU's busiest threads, this process, and the machine's load.
func (b cpuSnap) since(a cpuSnap) string {
	wall := b.at.Sub(a.at)
	if wall <= 0 {
		return ""
	}
	type kv struct {
		name string
		d    time.Duration
	}
	var ts []kv
	for n, d := range b.threads {
		if dd := d - a.threads[n]; dd > 0 {
			ts = append(ts, kv{n, dd})
		}
	}
	sort.Slice(ts, func(i, j int) bool { return ts[i].d > ts[j].d })
	var sb strings.Builder
	sb.WriteString("CPU over ")
	sb.WriteString(wall.Round(time.Millisecond).String())
	sb.WriteString(":")
	for i, t := range ts {
		if i == 5 {
			break
		}
		fmt.Fprintf(&sb, " qemu %q %.0f%%,", t.name, 100*t.d.Seconds()/wall.Seconds())
	}
	fmt.Fprintf(&sb, " host test %.0f%%", 100*(b.self-a.self).Seconds()/wall.Seconds())
	if la, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(la)); len(f) > 0 {
			sb.WriteString(", load average " + f[0])
		}
	}
	return sb.String()
}
