package netstackvm

import (
	"encoding/binary"
	"errors"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vfnic/vfnic/internal/qmpask"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/qemu"
)

// The peer-stall wires: a vfnic NIC with packed rings and a Linux NIC on
// each hub; the Linux NIC has split rings on one and packed on the other.
var peerStallNICs = []qemu.NIC{
	{Model: qemu.VirtioNet, Packed: true, Slot: 8, Net: qemu.Hub(2), Bind: qemu.BindVFIO},
	{Model: qemu.VirtioNet, Packed: false, Slot: 9, Net: qemu.Hub(2), Bind: qemu.BindLinux, IPv4: "10.0.21.2/24"},
	{Model: qemu.VirtioNet, Packed: true, Slot: 10, Net: qemu.Hub(3), Bind: qemu.BindVFIO},
	{Model: qemu.VirtioNet, Packed: true, Slot: 11, Net: qemu.Hub(3), Bind: qemu.BindLinux, IPv4: "10.0.22.2/24"},
}

// TestVMPeerStall boots a guest with peerStallNICs and runs
// TestGuestPeerStall there, serving its requests for QEMU's view of the
// queues (qmpask.Helper). The guest's Linux NICs get guest-physical DMA
// addresses (iommu=pt) so that QEMU's monitor can read their rings. It
// shows what stalled netstack on virtio packed rings: not vfnic's ring, a
// packed-ring Linux peer's transmit queue (QEMU's, with Linux 6.1's
// driver). On request (VFNIC_NETSTACK_PEERSTALL=1): it demonstrates a
// QEMU fault, which no change of vfnic's can fix.
func TestVMPeerStall(t *testing.T) {
	if qemu.InGuest() {
		t.Skip("host side: boots the guest that runs TestGuestPeerStall")
	}
	if os.Getenv("VFNIC_NETSTACK_PEERSTALL") != "1" {
		t.Skip("QEMU's packed-ring peer stall, shown on request: VFNIC_NETSTACK_PEERSTALL=1")
	}
	qemu.RequireVM(t)
	mon, err := qemu.NewMonitor()
	require.NoError(t, err)
	defer mon.Close()
	qh := &qmpask.Helper{Mon: mon, Ctx: t.Context(), NICs: peerStallNICs, PhysRings: true}
	if testing.Verbose() {
		qh.Logf = t.Logf
	}
	cfg := qemu.Config{NICs: peerStallNICs, Timeout: 3 * time.Minute, OneTCGThread: true,
		Monitor: mon, Output: qh, KernelArgs: []string{"iommu=pt"}}
	qemu.RunGoTestT(t, cfg, qemu.GoTest{
		Package: "github.com/vfnic/vfnic/tests/netstackvm",
		Run:     "^TestGuestPeerStall$",
		Args:    []string{"-test.timeout=150s"},
	})
	qh.Report(t)
}

// TestGuestPeerStall: on each hub, the Linux NIC sends UDP datagrams to
// the vfnic NIC (packed rings) while vfnic's receive ring has no buffer,
// first before vfnic posts any (the moment between Open and the first
// fill, when netstack stalled), then with the ring used up and not
// reposted (a receiver that falls behind); each time vfnic then posts
// buffers and Linux sends 100 more. QEMU holds a peer's frames while a
// port on its hub can take none, and completes them when vfnic's
// notification comes; its packed ring's device event is then left behind
// (see qmpask.Helper's "stalled"), and Linux 6.1 kicks only for an event
// inside the batch it has just published. So the split-ring Linux NIC
// must deliver all 100 each time, and the packed-ring one may stop
// transmitting for good: when it does, Linux completes nothing more and
// QEMU's monitor must find its queue idle with every frame it took
// completed and its device event out of Linux's reach (checked on the
// host), while vfnic's receive queue holds every buffer posted.
func TestGuestPeerStall(t *testing.T) {
	if !qemu.InGuest() {
		t.Skip("needs the guest's NICs: runs inside the QEMU guest booted by TestVMPeerStall")
	}
	nics, err := qemu.GuestNICs()
	require.NoError(t, err)
	for _, vf := range nics {
		if vf.Bind == qemu.BindLinux {
			continue
		}
		for _, lx := range nics {
			if lx.Bind == qemu.BindLinux && lx.Net == vf.Net {
				name := "split-peer"
				if lx.Packed {
					name = "packed-peer"
				}
				t.Run(name, func(t *testing.T) { peerStall(t, vf, lx) })
			}
		}
	}
}

// stallPort is the UDP port of the datagrams peerStall sends: discard.
const stallPort = 9

func peerStall(t *testing.T, vf, lx qemu.NIC) {
	ifc := linuxInterface(t, lx.GuestAddr())
	lxIP, _, err := net.ParseCIDR(lx.IPv4)
	require.NoError(t, err)
	vfIP := lxIP.To4()
	vfIP = net.IPv4(vfIP[0], vfIP[1], vfIP[2], 1)

	dev, err := nic.Open(t.Context(), vf.GuestAddr(), nic.Config{})
	require.NoError(t, err)
	defer dev.Close()
	rx, err := dev.Rx(0)
	require.NoError(t, err)
	// A static neighbour: Linux sends at once, and nothing but the
	// datagrams has to cross.
	sh(t, "arp -i "+ifc+" -s "+vfIP.String()+" "+dev.MAC().String())
	conn, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: vfIP, Port: stallPort})
	require.NoError(t, err)
	defer conn.Close()
	send := func(from, n int) {
		b := make([]byte, 64)
		copy(b, "vfnic-stall")
		for seq := from; seq < from+n; seq++ {
			binary.BigEndian.PutUint32(b[12:], uint32(seq))
			_, _ = conn.Write(b) // a full queue drops: the count says it
			time.Sleep(time.Millisecond)
		}
	}
	seen := map[int]bool{}
	var held []uintptr
	// receive polls for d, taking the datagrams; repost false keeps the
	// buffers, so that the ring runs out.
	receive := func(d time.Duration, repost bool) {
		cs := make([]nic.Completion, 64)
		for end := time.Now().Add(d); time.Now().Before(end); {
			n := rx.Poll(cs)
			if n == 0 {
				time.Sleep(100 * time.Microsecond)
				continue
			}
			for _, c := range cs[:n] {
				if c.Err != nil {
					continue
				}
				if seq, ok := stallSeq(c.Data); ok {
					seen[seq] = true
				}
				if repost {
					require.NoError(t, rx.Repost(c.Buf, nil))
				} else {
					held = append(held, c.Buf)
				}
			}
			if repost {
				require.NoError(t, rx.Flush())
			}
		}
	}
	count := func(from, n int) int {
		k := 0
		for seq := from; seq < from+n; seq++ {
			if seen[seq] {
				k++
			}
		}
		return k
	}
	// then sends 100 datagrams from seq while vfnic takes and reposts
	// for 3 s, and says how many arrived; a packed-ring peer that
	// delivered fewer is checked for the stall.
	then := func(phase string, seq int) (stalled bool) {
		tx0, _ := linuxTx(ifc)
		var wg sync.WaitGroup
		wg.Go(func() { send(seq, 100) })
		receive(3*time.Second, true)
		wg.Wait()
		tx1, view := linuxTx(ifc)
		got := count(seq, 100)
		t.Logf("%s: vfnic received %d of the next 100 datagrams; Linux completed %d frames meanwhile (%s)", phase, got, tx1-tx0, view)
		if !lx.Packed || got == 100 {
			require.Equal(t, 100, got, "%s: datagrams after vfnic's buffers came back", phase)
			return false
		}
		peerStallEvidence(t, vf, lx, ifc, rx)
		return true
	}

	// Before the first fill: nothing posted.
	send(0, 50)
	for {
		err := rx.PostRecv(nil)
		if errors.Is(err, nic.ErrFull) {
			break
		}
		require.NoError(t, err)
	}
	require.NoError(t, rx.Flush())
	if then("sent before vfnic's first fill", 100) {
		return
	}
	// A receiver that falls behind: the ring is used up and not
	// reposted while Linux sends a ring's worth and more.
	var wg sync.WaitGroup
	wg.Go(func() { send(1000, rx.Size()+100) })
	receive(time.Duration(rx.Size()+100)*time.Millisecond+time.Second, false)
	wg.Wait()
	t.Logf("ring used up: %d buffers held, %d of %d datagrams taken", len(held), count(1000, rx.Size()+100), rx.Size()+100)
	for _, b := range held {
		require.NoError(t, rx.Repost(b, nil))
	}
	held = held[:0]
	require.NoError(t, rx.Flush())
	if then("sent while vfnic's ring was used up", 2000) {
		return
	}
	if lx.Packed {
		t.Logf("the packed-ring peer did not stall this run")
	}
}

// stallSeq is the sequence number of a datagram peerStall sent.
func stallSeq(f []byte) (int, bool) {
	const udp = 14 + 20
	if len(f) < udp+8+16 || binary.BigEndian.Uint16(f[12:]) != 0x0800 || f[14] != 0x45 || f[23] != 17 ||
		binary.BigEndian.Uint16(f[udp+2:]) != stallPort || string(f[udp+8:udp+8+11]) != "vfnic-stall" {
		return 0, false
	}
	return int(binary.BigEndian.Uint32(f[udp+8+12:])), true
}

// peerStallEvidence shows a stalled packed-ring Linux peer from both
// sides: Linux completes no frame in a second, and the host reads QEMU's
// state of its transmit queue and ring (checked there) and of vfnic's
// receive queue (logged).
func peerStallEvidence(t *testing.T, vf, lx qemu.NIC, ifc string, rx nic.RxQueue) {
	tx0, v0 := linuxTx(ifc)
	time.Sleep(time.Second)
	tx1, v1 := linuxTx(ifc)
	t.Logf("Linux, stalled: %s; 1 s later: %s; vfnic's receive queue: %d of %d buffers posted", v0, v1, rx.Outstanding(), rx.Size())
	require.Equal(t, tx0, tx1, "frames Linux completed on the stalled queue")
	require.Equal(t, rx.Size(), rx.Outstanding(), "vfnic's receive buffers posted")
	qmpask.Ask("stalled", lx.Slot, tx1)
	qmpask.Ask("status", vf.Slot, 0) // vfnic's receive queue
	time.Sleep(4 * time.Second)      // the host's reads, logged there
}

// linuxTx is Linux's count of frames completed on ifc (virtio-net counts
// a frame when the device has used it) and a line on its first transmit
// queue: the count and the watchdog's timeouts.
func linuxTx(ifc string) (int, string) {
	b, _ := os.ReadFile("/sys/class/net/" + ifc + "/statistics/tx_packets")
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	to, _ := os.ReadFile("/sys/class/net/" + ifc + "/queues/tx-0/tx_timeout")
	return n, "tx_packets " + strconv.Itoa(n) + " tx_timeout " + strings.TrimSpace(string(to))
}
