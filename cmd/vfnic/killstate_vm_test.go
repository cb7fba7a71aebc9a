package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/dma"
	"github.com/vfnic/vfnic/doorbell"
	"github.com/vfnic/vfnic/hugepage"
	"github.com/vfnic/vfnic/internal/qmpask"
	"github.com/vfnic/vfnic/pci"
	"github.com/vfnic/vfnic/qemu"
	"github.com/vfnic/vfnic/vfio"
)

// commonCfg maps a virtio device's common configuration structure.
func commonCfg(t *testing.T, d *vfio.Device) doorbell.Window {
	t.Helper()
	cs, err := pci.ReadConfig(d.ConfigReader())
	require.NoError(t, err)
	caps, err := cs.VirtioCaps()
	require.NoError(t, err)
	for _, c := range caps {
		if c.CfgType == pci.VirtioCommonCfg {
			m, err := d.MapRegion(int(c.Bar))
			require.NoError(t, err)
			b, err := m.Slice(c.Offset, c.Length)
			require.NoError(t, err)
			return doorbell.NewWindow(b)
		}
	}
	t.Fatal("no virtio common configuration capability")
	return doorbell.Window{}
}

// Offsets in virtio's common configuration structure (4.1.4.3) and igb's
// BAR0 that deviceLeft reads.
const (
	vDeviceStatus = 20
	vNumQueues    = 18
	vQueueSelect  = 22
	vQueueEnable  = 28
	vQueueDesc    = 32
	vStatusOK     = 4 // DRIVER_OK

	igbRCTL  = 0x100
	igbTCTL  = 0x400
	igbRDBAL = 0xC000
	igbRDLEN = 0xC008
	igbEN    = 2 // RCTL.EN, TCTL.EN
)

// deviceLeft opens the device a killed process left as the next Open
// finds it, before any reset, and checks what QEMU and vfio-pci left
// there: vfio-pci turned bus mastering off when the process's device fd
// was released; igb has a function reset (FLR), which vfio-pci ran then,
// so nothing is enabled and no ring is left; virtio-net has none, so its
// queues keep the dead process's ring addresses and only DRIVER_OK is
// gone (QEMU's virtio-pci clears it with bus mastering), until the
// driver's status-0 reset. Then it does what Open did before it reset
// first: bus mastering on, here with DMA memory poisoned at the IOVAs the
// dead process used and the peer sending. No byte may change: on QEMU
// the old order did no harm (the nic/igb and nic/virtio
// TestBusMasterAfterReset cases hold the new order, for devices that
// keep running without bus mastering or a function reset).
func deviceLeft(t *testing.T, w killWire, addr string) {
	a, err := pci.ParseAddress(addr)
	require.NoError(t, err)
	pd, err := pci.Lookup(a)
	require.NoError(t, err)
	c, err := vfio.OpenContainer()
	require.NoError(t, err)
	defer c.Close()
	g, err := c.OpenGroup(pd.IOMMUGroup)
	require.NoError(t, err)
	d, err := g.OpenDevice(addr)
	require.NoError(t, err)
	cmd, err := d.ReadConfig16(4)
	require.NoError(t, err)
	require.Zero(t, cmd&4, "bus mastering of the killed process's device, off after vfio-pci's release (command %#x)", cmd)
	rm, _ := os.ReadFile("/sys/bus/pci/devices/" + addr + "/reset_method")
	resets := d.Info().Flags&vfio.DeviceFlagReset != 0
	var left string
	if w.model == qemu.IGB {
		require.True(t, resets, "igb has a VFIO reset (reset_method %q)", rm)
		m, err := d.MapRegion(0)
		require.NoError(t, err)
		b, err := m.Slice(0, 0x10000)
		require.NoError(t, err)
		win := doorbell.NewWindow(b)
		rd := func(off uintptr) uint32 { v, _ := win.Read32(off); return v }
		left = fmt.Sprintf("RCTL %#x TCTL %#x RDBAL0 %#x RDLEN0 %d", rd(igbRCTL), rd(igbTCTL), rd(igbRDBAL), rd(igbRDLEN))
		require.Zero(t, rd(igbRCTL)&igbEN|rd(igbTCTL)&igbEN|rd(igbRDLEN), "igb after the FLR: %s", left)
	} else {
		require.False(t, resets, "virtio-net has no VFIO reset (reset_method %q)", rm)
		win := commonCfg(t, d)
		st, _ := win.Read8(vDeviceStatus)
		nq, _ := win.Read16(vNumQueues)
		left = fmt.Sprintf("status %#x", st)
		enabled := 0
		for q := range nq {
			_ = win.Write16(vQueueSelect, q)
			en, _ := win.Read16(vQueueEnable)
			lo, _ := win.Read32(vQueueDesc)
			hi, _ := win.Read32(vQueueDesc + 4)
			desc := uint64(hi)<<32 | uint64(lo)
			if en != 0 {
				enabled++
				left += fmt.Sprintf(", queue %d enabled at %#x", q, desc)
			}
		}
		require.Zero(t, st&vStatusOK, "virtio status after bus mastering went off: %s", left)
		require.Positive(t, enabled, "virtio keeps the dead process's queues until reset: %s", left)
	}
	space, err := dma.NewVFIOSpace(c, 4<<30) // the drivers' default IOVA floor
	require.NoError(t, err)
	defer space.Close()
	r, err := space.Alloc(8<<20, hugepage.Options{PageSize: hugepage.Size4K})
	require.NoError(t, err)
	mem := r.Bytes()
	for i := range mem {
		mem[i] = 0x5a
	}
	faults := dmarFaults()
	require.NoError(t, d.SetBusMaster(true))
	time.Sleep(300 * time.Millisecond)
	changed := 0
	for _, b := range mem {
		if b != 0x5a {
			changed++
		}
	}
	require.NoError(t, d.SetBusMaster(false))
	t.Logf("%s: the device the killed process left: reset_method %q, VFIO reset %v, %s; with bus mastering on and DMA memory poisoned at IOVA %#x: %d bytes changed, %d DMA faults",
		w.name, strings.TrimSpace(string(rm)), resets, left, r.IOVA(), changed, dmarFaults()-faults)
	require.Zero(t, changed, "bytes of poisoned DMA memory written by the device before any reset")
	require.Zero(t, dmarFaults()-faults, "DMA faults")
}

// txStalled reports whether Linux's watchdog found a transmit queue of
// ifc stuck since the dmesg line count before.
func txStalled(ifc string, before int) bool {
	out, _ := exec.Command("dmesg").Output()
	lines := strings.Split(string(out), "\n")
	for _, l := range lines[min(before, len(lines)):] {
		if strings.Contains(l, ifc+": NETDEV WATCHDOG") || strings.Contains(l, ifc+": TX timeout") {
			return true
		}
	}
	return false
}

func dmesgLines() int {
	out, _ := exec.Command("dmesg").Output()
	return strings.Count(string(out), "\n")
}

// killStall: while the Linux NIC pings echo 0 every 10 ms, both echoes
// are SIGKILLed, so that no NIC on the hub can take a frame for 3 s (a
// virtio device loses DRIVER_OK when vfio-pci turns its bus mastering
// off; the peer's transmit ring of 256 fills meanwhile), deviceLeft
// checks what the killed process left, and both echoes are started again.
// Both must answer then, except where the Linux NIC has packed rings:
// there it stalls for good, which this asserts (see below).
func killStall(t *testing.T, w killWire) {
	ifc := netIf(t, pciAddr(w.slots[2]))
	ips := [2]string{w.subnet + ".1", w.subnet + ".2"}
	var echo [2]*vfnicProc
	start := func(i int) {
		echo[i] = startVfnic(t, "echo", "-ip", ips[i], "-progress", "0", pciAddr(w.slots[i]))
		echo[i].waitReady(t)
	}
	answers := func(ip string) int {
		out, _ := exec.Command("ping", "-c", "5", "-i", "0.05", "-W", "2", "-I", ifc, ip).CombinedOutput()
		m := pingReceived.FindStringSubmatch(string(out))
		if m == nil {
			return 0
		}
		n, _ := strconv.Atoi(m[2])
		return n
	}
	start(0)
	start(1)
	for i := range 2 {
		require.Equal(t, 5, answers(ips[i]), "echo %d before the kill", i)
	}
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	flood := exec.CommandContext(ctx, "sh", "-c", fmt.Sprintf("while :; do ping -q -i 0.01 -W 1 -I %s %s >/dev/null 2>&1; sleep 0.05; done", ifc, ips[0]))
	flood.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	flood.Cancel = func() error { return syscall.Kill(-flood.Process.Pid, syscall.SIGKILL) }
	require.NoError(t, flood.Start())
	defer func() { _ = flood.Wait() }()
	defer stop()
	time.Sleep(500 * time.Millisecond)

	lines := dmesgLines()
	for i := range 2 {
		require.NoError(t, echo[i].cmd.Process.Kill())
		_, ended := echo[i].wait(10 * time.Second)
		require.True(t, ended, "echo %d still running 10 s after SIGKILL", i)
	}
	deviceLeft(t, w, pciAddr(w.slots[0]))
	time.Sleep(3 * time.Second) // the peer keeps sending; nothing on the hub can take it
	start(0)
	start(1)
	var got [2]int
	for i := range 2 {
		got[i] = answers(ips[i])
	}
	if w.peerPacked {
		time.Sleep(2 * time.Second)
		for i := range 2 {
			got[i] += answers(ips[i])
		}
	}
	stalled := txStalled(ifc, lines)
	peer := "igb"
	if w.model == qemu.VirtioNet {
		peer = map[bool]string{true: "packed", false: "split"}[w.peerPacked] + "-ring virtio"
	}
	t.Logf("%s (Linux NIC: %s): after the restart, echo 0 answered %d and echo 1 %d (of 5, 10 with a packed peer); Linux's transmit watchdog fired: %v",
		w.name, peer, got[0], got[1], stalled)
	if w.peerPacked {
		// QEMU held the peer's frames while no NIC on the hub could take
		// them, and completed them once one could
		// (virtio_net_tx_complete): that turns the transmit queue's
		// notifications on, then takes what the peer queued meanwhile;
		// when that is less than a burst, notifications stay on with the
		// event where they were turned on, which a packed ring's take
		// does not move (the behaviour nic/virtio's kickNeeded allows
		// for since e2ab62e). Linux's virtqueue_kick_prepare_packed
		// kicks only for an event inside the batch it has just
		// published, so it never kicks again and every frame the peer
		// sends stays in its ring: the lost peer of issue 30 item 5,
		// where a restart came while the other echo could take nothing
		// (its ring full on a loaded host). stallEvidence shows it from
		// both sides: QEMU's monitor finds the queue idle, every frame
		// it took completed (as many as Linux counts), and, with
		// VFNIC_KILL_PT=1, 238 frames in the ring it never saw and its
		// device event 91 descriptors behind its own position (one run:
		// device at 144, event at 53, both wrap 0). It does not happen
		// every time (3 runs of 6: it needs QEMU to be holding a frame
		// when a port can receive again), so a run without it is
		// logged; when it happens, the evidence must hold.
		if got != [2]int{} {
			t.Logf("the stall of a packed-ring Linux peer did not happen this run (answers %v, watchdog %v)", got, stalled)
		} else {
			stallEvidence(t, w, ifc, ips)
		}
	} else {
		require.False(t, stalled, "Linux's transmit watchdog fired on %s", ifc)
		require.Positive(t, got[0], "replies from echo 0 after the restart")
		require.Positive(t, got[1], "replies from echo 1 after the restart")
	}
	for i := range 2 {
		require.NoError(t, echo[i].cmd.Process.Signal(syscall.SIGINT))
		err, ended := echo[i].wait(10 * time.Second)
		require.True(t, ended)
		require.NoError(t, err, echo[i].output())
	}
}

// linuxTxView is the guest Linux's view of ifc's first transmit queue:
// frames completed (virtio-net counts them when the device has used
// them), watchdog timeouts, and the interrupt counts of the queue's
// vectors.
func linuxTxView(ifc, addr string) (txPackets int, view string) {
	out, _ := exec.Command("sh", "-c", "cd /sys/class/net/"+ifc+" && echo tx_packets $(cat statistics/tx_packets) tx_timeout $(cat queues/tx-0/tx_timeout) carrier $(cat carrier); "+
		"v=$(basename /sys/bus/pci/devices/"+addr+"/virtio*); grep \"$v-\" /proc/interrupts | tr -s ' '").CombinedOutput()
	view = strings.TrimSpace(string(out))
	f := strings.Fields(view)
	if len(f) > 1 {
		txPackets, _ = strconv.Atoi(f[1])
	}
	return txPackets, view
}

// waitCarrier waits up to 20 s for ifc's carrier to be up (or down).
func waitCarrier(ifc string, up bool) bool {
	want := map[bool]string{true: "1", false: "0"}[up]
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		b, _ := os.ReadFile("/sys/class/net/" + ifc + "/carrier")
		if strings.TrimSpace(string(b)) == want {
			return true
		}
	}
	return false
}

// stallEvidence shows the stalled packed-ring peer as Linux and QEMU see
// it, and what brings it back. Linux completes nothing more; QEMU's
// monitor (qmpask.Helper, on the host) finds the transmit queue idle
// with every frame it took completed, as many as Linux counts, and, with
// VFNIC_KILL_PT=1, the ring full of frames QEMU never saw and its device
// event where Linux cannot reach it. Neither a link flap from QEMU
// (set_link) nor `ip link set down/up` kicks the queue (Linux 6.1's
// virtio-net neither resets nor kicks on open or on its TX timeout);
// rebinding the driver, which resets the device, does.
func stallEvidence(t *testing.T, w killWire, ifc string, ips [2]string) {
	addr := pciAddr(w.slots[2])
	answered := func(ifc string) [2]int {
		var n [2]int
		for i, ip := range ips {
			out, _ := exec.Command("ping", "-c", "5", "-i", "0.05", "-W", "2", "-I", ifc, ip).CombinedOutput()
			if m := pingReceived.FindStringSubmatch(string(out)); m != nil {
				n[i], _ = strconv.Atoi(m[2])
			}
		}
		return n
	}
	tx0, v0 := linuxTxView(ifc, addr)
	time.Sleep(time.Second)
	tx1, v1 := linuxTxView(ifc, addr)
	t.Logf("Linux, stalled: %s; 1 s later: %s", v0, v1)
	require.Equal(t, tx0, tx1, "frames completed on the stalled queue")
	qmpask.Ask("stalled", w.slots[2], tx1)
	time.Sleep(3 * time.Second) // the host's reads, logged there

	qmpask.Ask("flap", w.slots[2], 1000)
	down, up := waitCarrier(ifc, false), waitCarrier(ifc, true)
	require.True(t, down && up, "carrier down %v, up %v after set_link off/on", down, up)
	flap := answered(ifc)
	_, v := linuxTxView(ifc, addr)
	t.Logf("after set_link off/on from QEMU: echoes answered %v of 5; Linux: %s", flap, v)

	require.NoError(t, exec.Command("ip", "link", "set", ifc, "down").Run())
	require.NoError(t, exec.Command("ip", "link", "set", ifc, "up").Run())
	waitCarrier(ifc, true)
	updown := answered(ifc)
	_, v = linuxTxView(ifc, addr)
	t.Logf("after ip link set down/up: echoes answered %v of 5; Linux: %s", updown, v)

	drv := "/sys/bus/pci/drivers/virtio-pci/"
	require.NoError(t, os.WriteFile(drv+"unbind", []byte(addr), 0o200))
	require.NoError(t, os.WriteFile(drv+"bind", []byte(addr), 0o200))
	ifc2 := netIf(t, addr)
	require.NoError(t, exec.Command("ip", "addr", "add", w.subnet+".10/24", "dev", ifc2).Run())
	require.NoError(t, exec.Command("ip", "link", "set", ifc2, "up").Run())
	waitCarrier(ifc2, true)
	rebound := answered(ifc2)
	_, v = linuxTxView(ifc2, addr)
	t.Logf("after rebinding virtio-pci (%s): echoes answered %v of 5; Linux: %s", ifc2, rebound, v)
	require.Equal(t, [2]int{}, flap, "the stalled peer after set_link off/on")
	require.Equal(t, [2]int{}, updown, "the stalled peer after ip link set down/up")
	require.Positive(t, rebound[0], "echo 0 answers the peer whose driver was rebound")
	require.Positive(t, rebound[1], "echo 1 answers the peer whose driver was rebound")
}
