package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/internal/qmpask"
	"github.com/vfnic/vfnic/qemu"
)

// killWire is one emulated wire (a QEMU hub) of TestVMKillRestart: two
// NICs driven by vfnic echo and one driven by the guest's Linux.
type killWire struct {
	name   string
	model  qemu.NICModel
	packed bool   // the echoes' virtio NICs use packed rings
	slots  [3]int // echo 0, echo 1, Linux
	subnet string // 10.0.N: echoes at .1 and .2, Linux at .10
	// peerPacked gives the Linux NIC packed rings. Such a peer stalls for
	// good once QEMU has held its frames while no NIC on the hub could
	// take them (see killStall), which is QEMU's and Linux's doing, not
	// vfnic's: that wire only shows the stall, and the kill rounds run
	// with a split-ring peer on the packed wire.
	peerPacked bool
}

// igb NICs sit two slots apart, below 10: QEMU reserves the slot 16 above
// each for its SR-IOV VFs, and slot 31 is the LPC bridge.
var killWires = []killWire{
	{"packed", qemu.VirtioNet, true, [3]int{10, 11, 12}, "10.0.21", false},
	{"split", qemu.VirtioNet, false, [3]int{13, 14, 15}, "10.0.22", false},
	{"igb", qemu.IGB, false, [3]int{4, 6, 8}, "10.0.23", false},
	{"packed-peer", qemu.VirtioNet, true, [3]int{16, 17, 18}, "10.0.24", true},
}

// killRounds is how many times an echo is killed and restarted on each
// wire in make test (kept inside the suite's time budget);
// VFNIC_KILL_ROUNDS sets another count (20 for the evidence runs of
// issue 30 item 5). The packed-peer wire, which shows QEMU's and Linux's
// stall rather than vfnic's behaviour, runs with VFNIC_KILL_STALL=1.
const (
	killRoundsEnv = "VFNIC_KILL_ROUNDS"
	killRounds    = 4
	killStallEnv  = "VFNIC_KILL_STALL"
)

// activeKillWires is killWires without the packed-peer wire unless
// VFNIC_KILL_STALL=1.
func activeKillWires() []killWire {
	if os.Getenv(killStallEnv) == "1" {
		return killWires
	}
	var ws []killWire
	for _, w := range killWires {
		if !w.peerPacked {
			ws = append(ws, w)
		}
	}
	return ws
}

// TestVMKillRestart boots a guest with the wires of killWires and runs
// TestGuestKillRestart there, serving its QEMU monitor requests
// (qmpask.Helper). VFNIC_KILL_WIRE=<name> runs one wire only.
func TestVMKillRestart(t *testing.T) {
	if qemu.InGuest() {
		t.Skip("host side: boots the guest that runs TestGuestKillRestart")
	}
	qemu.RequireVM(t)
	var nics []qemu.NIC
	wires := activeKillWires()
	for h, w := range wires {
		for i, s := range w.slots {
			n := qemu.NIC{Model: w.model, Packed: w.packed, Slot: s, Net: qemu.Hub(10 + h), Bind: qemu.BindVFIO}
			if i == 2 {
				n.Bind, n.IPv4, n.Packed = qemu.BindLinux, w.subnet+".10/24", w.peerPacked
			}
			nics = append(nics, n)
		}
	}
	var env []string
	if os.Getenv(killStallEnv) == "1" {
		env = append(env, killStallEnv+"=1")
	}
	rounds := killRounds
	if r := os.Getenv(killRoundsEnv); r != "" {
		n, err := strconv.Atoi(r)
		require.NoError(t, err, killRoundsEnv)
		rounds = n
		env = append(env, killRoundsEnv+"="+r)
	}
	// A round took 2.5 to 4 s on the loaded 2-core host; killStall about
	// 10 s.
	guestTimeout := time.Minute + time.Duration(rounds*len(wires))*5*time.Second + time.Duration(len(wires))*30*time.Second
	// OneTCGThread as the igb suite (qemu.Config.OneTCGThread);
	// VFNIC_KILL_MTTCG=1 runs a thread per vCPU instead.
	// killStall asks, through a line on its output, for QEMU's view of
	// the stalled peer's queues and a link flap (qmpask.Helper).
	mon, err := qemu.NewMonitor()
	require.NoError(t, err)
	defer mon.Close()
	qh := &qmpask.Helper{Mon: mon, Ctx: t.Context(), NICs: nics}
	cfg := qemu.Config{NICs: nics, Timeout: guestTimeout + time.Minute, OneTCGThread: os.Getenv("VFNIC_KILL_MTTCG") == "",
		Monitor: mon, Output: qh}
	// VFNIC_KILL_PT=1 gives the guest's Linux NICs guest-physical DMA
	// addresses (iommu=pt; vfnic's NICs keep their VFIO domains), so that
	// QEMU's monitor can read their rings (qmpask.Helper.PhysRings).
	if os.Getenv("VFNIC_KILL_PT") != "" {
		cfg.KernelArgs = append(cfg.KernelArgs, "iommu=pt")
		qh.PhysRings = true
	}
	run := "^TestGuestKillRestart$"
	if w := os.Getenv("VFNIC_KILL_WIRE"); w != "" {
		run += "/^" + w + "$" // one wire of killWires, by name
	}
	qemu.RunGoTestT(t, cfg, qemu.GoTest{Package: "github.com/vfnic/vfnic/cmd/vfnic", Run: run,
		Env: env, Args: []string{"-test.timeout=" + guestTimeout.String()}})
	qh.Report(t)
}

// TestGuestKillRestart: on each wire, while the Linux NIC pings one echo
// every 10 ms and sends UDP to the other, each echo in turn is SIGKILLed,
// the Linux peer's neighbour entry for it goes unresolved, and the echo
// is started again on the device the killed process left; after every
// restart both echoes answer the Linux NIC, from the same MAC. Then
// killStall kills both echoes at once (see there); on the wire whose
// Linux NIC has packed rings, only that.
func TestGuestKillRestart(t *testing.T) {
	if !qemu.InGuest() {
		t.Skip("needs VFIO: runs inside the guest booted by TestVMKillRestart")
	}
	rounds := killRounds
	if r := os.Getenv(killRoundsEnv); r != "" {
		n, err := strconv.Atoi(r)
		require.NoError(t, err, killRoundsEnv)
		rounds = n
	}
	for _, w := range activeKillWires() {
		t.Run(w.name, func(t *testing.T) {
			if !w.peerPacked {
				killRestart(t, w, rounds)
			}
			killStall(t, w)
		})
	}
}

func pciAddr(slot int) string { return fmt.Sprintf("0000:00:%02x.0", slot) }

var (
	pingReceived = regexp.MustCompile(`(\d+) packets transmitted, (\d+) packets received`)
	readyMAC     = regexp.MustCompile(`for \S+ at (\S+),`)
	echoCounts   = regexp.MustCompile(`answered arp (\d+) icmp (\d+) udp (\d+)`)
)

// arpState is the Linux neighbour entry for ip on ifc as /proc/net/arp
// shows it: "resolved" (flags has ATF_COM: REACHABLE, STALE, DELAY or
// PROBE), "unresolved" (INCOMPLETE or FAILED) or "none".
func arpState(ifc, ip string) string {
	b, _ := os.ReadFile("/proc/net/arp")
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) == 6 && f[0] == ip && f[5] == ifc {
			if flags, err := strconv.ParseUint(strings.TrimPrefix(f[2], "0x"), 16, 32); err == nil && flags&0x2 != 0 {
				return "resolved"
			}
			return "unresolved"
		}
	}
	return "none"
}

// arpStat sums a column of /proc/net/stat/arp_cache (one line per CPU):
// unresolved_discards counts packets dropped because the queue of an
// unresolved neighbour was full, res_failed the resolutions that failed
// (their queued packets dropped).
func arpStat(name string) int {
	b, _ := os.ReadFile("/proc/net/stat/arp_cache")
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) < 2 {
		return -1
	}
	col := slices.Index(strings.Fields(lines[0]), name)
	if col < 0 {
		return -1
	}
	n := 0
	for _, l := range lines[1:] {
		if f := strings.Fields(l); col < len(f) {
			v, _ := strconv.ParseUint(f[col], 16, 64)
			n += int(v)
		}
	}
	return n
}

// dmarFaults counts the DMA faults the guest kernel logged from the
// vIOMMU: a device still running on a dead process's descriptors would
// fault on its unmapped IOVAs.
func dmarFaults() int {
	out, _ := exec.Command("dmesg").Output()
	return strings.Count(string(out), "DMAR: [DMA ")
}

func killRestart(t *testing.T, w killWire, rounds int) {
	ifc := netIf(t, pciAddr(w.slots[2]))
	ips := [2]string{w.subnet + ".1", w.subnet + ".2"}
	// Short neighbour timers, so that within a second of a kill the
	// Linux peer's entry for the dead echo has been probed by unicast
	// ARP, failed, and is being resolved again by broadcast: each round
	// then takes the path a long outage takes, and a live echo answers a
	// unicast probe every few hundred milliseconds.
	for k, v := range map[string]string{"base_reachable_time_ms": "200", "delay_first_probe_time": "0",
		"retrans_time_ms": "200", "ucast_solicit": "3", "mcast_solicit": "3"} {
		require.NoError(t, os.WriteFile("/proc/sys/net/ipv4/neigh/"+ifc+"/"+k, []byte(v), 0o644), k)
	}
	var echo [2]*vfnicProc
	var mac [2]string
	start := func(i int) {
		echo[i] = startVfnic(t, "echo", "-ip", ips[i], "-progress", "0", pciAddr(w.slots[i]))
		echo[i].waitReady(t)
		m := readyMAC.FindStringSubmatch(echo[i].output())
		require.NotNil(t, m, echo[i].output())
		if mac[i] == "" {
			mac[i] = m[1]
		}
		require.Equal(t, mac[i], m[1], "the restarted echo has the MAC its peer knows")
	}
	start(0)
	start(1)
	diag := func() string {
		out, _ := exec.Command("sh", "-c", "cat /proc/net/arp; grep . /sys/class/net/"+ifc+"/statistics/*; grep -A1 Icmp: /proc/net/snmp; grep -E 'virtio|igb' /proc/interrupts; dmesg | tail -20").CombinedOutput()
		return string(out)
	}
	// answers pings ip 5 times, 50 ms apart, and returns how many came back.
	answers := func(ip string) (int, string) {
		out, _ := exec.Command("ping", "-c", "5", "-i", "0.05", "-W", "2", "-I", ifc, ip).CombinedOutput()
		m := pingReceived.FindStringSubmatch(string(out))
		if m == nil {
			return 0, string(out)
		}
		n, _ := strconv.Atoi(m[2])
		return n, string(out)
	}
	for i := range 2 {
		n, out := answers(ips[i])
		require.Equal(t, 5, n, "before any kill:\n%s", out)
	}

	// The load: a ping every 10 ms to echo 0, UDP every 10 ms to echo 1.
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	flood := exec.CommandContext(ctx, "sh", "-c", fmt.Sprintf("while :; do ping -q -i 0.01 -W 1 -I %s %s >/dev/null 2>&1; sleep 0.05; done", ifc, ips[0]))
	udp := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	udp.Env = append(os.Environ(), helperEnv+"="+strings.Join([]string{"udpping", "-count", "1000000", "-interval", "10ms", "-timeout", "100ms", ips[1] + ":7"}, "\x1f"))
	for _, c := range []*exec.Cmd{flood, udp} {
		c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		c.Cancel = func() error { return syscall.Kill(-c.Process.Pid, syscall.SIGKILL) }
		require.NoError(t, c.Start())
		defer func() { _ = c.Wait() }()
	}
	defer stop() // before the Waits above: the load runs until canceled
	time.Sleep(200 * time.Millisecond)

	failed, partial := 0, 0
	discards, resFailed, faults := arpStat("unresolved_discards"), arpStat("res_failed"), dmarFaults()
	states := map[string]int{}
	var arps, pings, udps [2]int
	for r := range rounds {
		i := r % 2
		require.NoError(t, echo[i].cmd.Process.Kill())
		_, ended := echo[i].wait(10 * time.Second)
		require.True(t, ended, "echo %d still running 10 s after SIGKILL", i)
		// The peer's entry for the dead echo goes unresolved (its probes
		// unanswered); the restart begins after that, or after 2 s.
		st := arpState(ifc, ips[i])
		for deadline := time.Now().Add(2 * time.Second); st == "resolved" && time.Now().Before(deadline); st = arpState(ifc, ips[i]) {
			time.Sleep(20 * time.Millisecond)
		}
		states[st]++
		start(i)
		for j := range 2 {
			n, out := answers(ips[j])
			switch {
			case n == 0:
				failed++
				t.Errorf("round %d (echo %d restarted, peer's entry %s): %s got no reply:\n%s\n%s\necho %d:\n%s", r, i, st, ips[j], out, diag(), j, echo[j].output())
			case n < 5:
				partial++
				t.Logf("round %d: %s answered %d of 5", r, ips[j], n)
			}
		}
	}
	for i := range 2 {
		require.NoError(t, echo[i].cmd.Process.Signal(syscall.SIGINT))
		err, ended := echo[i].wait(10 * time.Second)
		require.True(t, ended)
		require.NoError(t, err, echo[i].output())
		if m := echoCounts.FindStringSubmatch(echo[i].output()); m != nil {
			arps[i], _ = strconv.Atoi(m[1])
			pings[i], _ = strconv.Atoi(m[2])
			udps[i], _ = strconv.Atoi(m[3])
		}
	}
	t.Logf("%s: %d kill-and-restart rounds under load, %d without an answer, %d with some of 5 pings lost "+
		"(Linux: %d packets dropped from a full queue of an unresolved neighbour, %d resolutions failed); the peer's entry for the killed echo before its restart: %v; "+
		"the last echoes answered arp %v icmp %v udp %v; the guest's IOMMU reported %d DMA faults",
		w.name, rounds, failed, partial, arpStat("unresolved_discards")-discards, arpStat("res_failed")-resFailed, states, arps, pings, udps, dmarFaults()-faults)
	require.Zero(t, failed)
	require.Equal(t, rounds, states["unresolved"], "every restart met a peer whose entry had failed")
	require.Positive(t, arps[0]+arps[1], "the restarted echoes answered ARP")
}
