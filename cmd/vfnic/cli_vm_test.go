package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/cmd/vfnic/internal/pcapfilter"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/qemu"
)

// The CLI's guest topology: one vfio NIC wired to the host, one spare NIC
// for list/bind/unbind.
const (
	cliNIC      = "0000:00:04.0"
	cliSpareNIC = "0000:00:05.0"
	cliIGB      = "0000:00:08.0"
	cliIGBPeer  = "0000:00:09.0"
	cliIGB2     = "0000:00:0a.0" // a second 82576 on the wire: multi-queue pktgen
	cliFrames   = 200            // frames capture writes
	cliPktgen   = 20000          // frames pktgen sends
	cliMTU      = 9000           // the vfio NIC's host_mtu
	cliVLAN     = 100            // the tag of pktgen's tagged frames
	cliTagged   = 100            // tagged frames pktgen sends per size
)

// TestVMTools runs vfnic's list, unbind, bind, capture and pktgen in a
// guest. The host streams numbered frames of 14 to 9018 bytes (wireFrame)
// to the NIC for capture and counts what pktgen sends: all of it must
// arrive, in order and intact.
func TestVMTools(t *testing.T) {
	if qemu.InGuest() {
		t.Skip("host side: boots the guest that runs the TestGuestCLI* tests")
	}
	qemu.RequireVM(t)
	nd, err := qemu.NewDgram()
	require.NoError(t, err)
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: nd.HostPort})
	require.NoError(t, err)
	defer conn.Close()
	_ = conn.SetReadBuffer(8 << 20)

	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	var wg sync.WaitGroup
	var sent int
	wg.Add(1)
	go func() {
		defer wg.Done()
		sent = streamMarked(ctx, conn, nd.QEMUPort)
	}()
	got := make(chan pktgenSeen, 1)
	go func() { got <- countPktgen(conn) }()

	cfg := qemu.Config{
		NICs: []qemu.NIC{
			// It offers a 9000-byte MTU (virtio's MTU feature), for the
			// jumbo frames of the capture tests.
			{Model: qemu.VirtioNet, Packed: true, Slot: 4, Bind: qemu.BindVFIO, Net: nd,
				Props: map[string]string{"host_mtu": strconv.Itoa(cliMTU)}},
			{Model: qemu.E1000E, Slot: 5, Bind: qemu.BindNone},
			// Two NICs of the guest's Linux on one wire, for the
			// ownership tests (TestGuestCLIOwnership).
			{Model: qemu.VirtioNet, Packed: true, Slot: 6, Bind: qemu.BindLinux, IPv4: ownLinuxIP + "/24", Net: qemu.Hub(0)},
			{Model: qemu.VirtioNet, Packed: true, Slot: 7, Bind: qemu.BindLinux, Net: qemu.Hub(0)},
			// An Intel 82576 for 'vfnic info' (TestGuestCLIInfo).
			{Model: qemu.IGB, Slot: 8, Bind: qemu.BindVFIO, Net: qemu.Hub(1)},
			// The 82576's wire partner: pktgen's flows into its RSS
			// (TestGuestCLISinkRSS).
			{Model: qemu.VirtioNet, Packed: true, Slot: 9, Bind: qemu.BindVFIO, Net: qemu.Hub(1)},
			// A second 82576 on that wire: 'pktgen -queues 4' sends from
			// its 4 transmit queues (TestGuestCLISinkRSS).
			{Model: qemu.IGB, Slot: 10, Bind: qemu.BindVFIO, Net: qemu.Hub(1)},
		},
		Timeout: 3 * time.Minute,
	}
	// Two Linux NICs joined only by 'vfnic fwd' (TestGuestCLIFwdLinux).
	cfg.NICs = append(cfg.NICs, fwdNICs()...)
	gt := qemu.GoTest{Package: "github.com/vfnic/vfnic/cmd/vfnic", Run: "^TestGuestCLI"}
	if ref, ok := filterReference(t); ok {
		gt.Env = append(gt.Env, filterRefEnv+"="+ref)
	} else {
		gt.Args = append(gt.Args, "-test.skip=^TestGuestCLICaptureFilter$")
	}
	qemu.RunGoTestT(t, cfg, gt)
	stop()
	wg.Wait()
	_ = conn.SetReadDeadline(time.Now())
	seen := <-got
	t.Logf("host streamed %d frames to the guest; pktgen: host received %d frames, %d in sequence, %d malformed",
		sent, seen.frames, seen.inOrder, seen.bad)
	require.Equal(t, cliPktgen, seen.frames, "every pktgen frame reached the host")
	require.Equal(t, cliPktgen, seen.inOrder, "in order")
	require.Zero(t, seen.bad, "intact")
	t.Logf("pktgen -vlan %d: host received frames by size %v", cliVLAN, seen.tagged)
	require.Equal(t, map[int]int{1518: cliTagged, cliMTU + nic.FrameOverhead: cliTagged}, seen.tagged,
		"full-size tagged frames, at 1500 and at the device's MTU")
	f := seen.flows
	t.Logf("pktgen flows: host received %d frames, %d bad checksums; by source %v, source port %v, size %v",
		f.frames, f.badChecksum, f.srcIPs, f.srcPorts, f.sizes)
	require.Equal(t, cliFlowFrames, f.frames, "every frame of the ranges")
	require.Zero(t, f.badChecksum, "IPv6 UDP checksums right after the in-place rewrites")
	require.Equal(t, map[string]int{"2001:db8::1": 80, "2001:db8::2": 80, "2001:db8::3": 80}, f.srcIPs)
	require.Equal(t, map[int]int{1000: 60, 1001: 60, 1002: 60, 1003: 60}, f.srcPorts)
	require.Equal(t, map[string]int{"78": 160, "1514": 80}, f.sizes, "the size mix 78:2,1514:1")
	require.Len(t, f.seqs, cliFlowFrames, "each sequence number once")
}

// captureFilters are the filters TestGuestCLICaptureFilter runs capture
// with, over the host's stream: each kind of primitive, combinations,
// tagged frames.
var captureFilters = []string{
	"ip",
	"ip6 and udp port 9",
	"tcp port 80 or icmp",
	"vlan",
	"vlan 100",
	"vlan 300 and udp dst port 6000 and src host 10.0.0.3",
	"vlan 200 and vlan 100 and ether proto 0x88b5",
	"arp or host 10.0.0.1",
	"not vlan and ether broadcast and not arp",
	"greater 4000 and not vlan",
	"less 100 and (ip or ip6)",
	"net 10.0.0.0/30 and not src net 10.0.0.2/32",
	"ether dst 02:00:00:00:00:99 and not ip6",
	"src host fe80::cc or portrange 70-90",
}

// filterRefEnv carries, into the guest, the frames of one wireCycle that
// libpcap accepts for each of captureFilters (JSON: filter -> indexes).
const filterRefEnv = "VFNIC_CLI_FILTER_REF"

// filterReference runs each of captureFilters through libpcap ('tcpdump
// -r cycle.pcap -w out.pcap FILTER') over one cycle of the host's frames
// and returns the JSON for filterRefEnv. tshark would be the same
// reference: it hands capture filters to libpcap, and only when capturing
// live; reading a file, it takes display filters, another language. Without
// tcpdump the guest test is not run, which fails under CI.
func filterReference(t *testing.T) (string, bool) {
	tcpdump, err := exec.LookPath("tcpdump")
	if err != nil {
		if qemu.InCI() {
			t.Fatal("tcpdump is not installed (apt-get install tcpdump): it is the reference for the capture filter tests")
		}
		t.Log("NOT RUN: TestGuestCLICaptureFilter needs tcpdump on the host as its reference (apt-get install tcpdump)")
		return "", false
	}
	dir := t.TempDir()
	in := filepath.Join(dir, "cycle.pcap")
	f, err := os.Create(in)
	require.NoError(t, err)
	w := pcapgo.NewWriter(f)
	require.NoError(t, w.WriteFileHeader(262144, layers.LinkTypeEthernet))
	for seq := range wireCycle {
		b := wireFrame(seq)
		require.NoError(t, w.WritePacket(gopacket.CaptureInfo{Timestamp: time.Unix(int64(seq), 0), CaptureLength: len(b), Length: len(b)}, b))
	}
	require.NoError(t, f.Close())
	ref := map[string][]int{}
	for _, expr := range captureFilters {
		out := filepath.Join(dir, "out.pcap")
		res, err := exec.Command(tcpdump, "-r", in, "-w", out, expr).CombinedOutput()
		require.NoError(t, err, "tcpdump %q: %s", expr, res)
		o, err := os.Open(out)
		require.NoError(t, err)
		r, err := pcapgo.NewReader(o)
		require.NoError(t, err)
		idx := []int{}
		for {
			data, _, err := r.ReadPacketData()
			if err != nil {
				break
			}
			seq, ok := wireSeq(data)
			require.True(t, ok)
			idx = append(idx, seq)
		}
		o.Close()
		require.NotEmpty(t, idx, "%q takes some of the stream", expr)
		require.Less(t, len(idx), len(wireCycle), "%q refuses some of the stream", expr)
		ref[expr] = idx
	}
	b, err := json.Marshal(ref)
	require.NoError(t, err)
	return string(b), true
}

// streamMarked sends numbered frames (wireFrame) to the guest every 2 ms
// until ctx ends.
func streamMarked(ctx context.Context, conn *net.UDPConn, port int) int {
	dst := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port}
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for n := 0; ; n++ {
		if _, err := conn.WriteToUDP(wireFrame(n), dst); err != nil {
			return n
		}
		select {
		case <-ctx.Done():
			return n + 1
		case <-tick.C:
		}
	}
}

type pktgenSeen struct {
	frames, inOrder, bad int
	tagged               map[int]int // VLAN cliVLAN frames by size
	flows                flowsSeen   // TestGuestCLIPktgenFlows's frames
}

// flowsSeen counts the IPv6 frames of TestGuestCLIPktgenFlows (UDP to
// ports cliFlowPorts): by source address, source port, size, and which
// sequence numbers came, with a valid UDP checksum.
type flowsSeen struct {
	frames, badChecksum int
	srcIPs, sizes       map[string]int
	srcPorts            map[int]int
	seqs                map[uint64]int
}

// TestGuestCLIPktgenFlows's numbers.
const (
	cliFlowFrames = 240
	cliFlowPortLo = 5000 // and 5001
)

// countPktgen reads what the guest sends until the socket's deadline:
// pktgen's UDP frames carry a big-endian sequence number after the headers.
func countPktgen(conn *net.UDPConn) pktgenSeen {
	s := pktgenSeen{tagged: map[int]int{}, flows: flowsSeen{srcIPs: map[string]int{}, sizes: map[string]int{},
		srcPorts: map[int]int{}, seqs: map[uint64]int{}}}
	buf := make([]byte, 65536)
	next := uint64(0)
	for {
		n, _, err := conn.ReadFromUDP(buf)
		if err != nil {
			return s
		}
		p := gopacket.NewPacket(buf[:n], layers.LayerTypeEthernet, gopacket.Default)
		udp, _ := p.Layer(layers.LayerTypeUDP).(*layers.UDP)
		if udp == nil {
			continue // ARP or other chatter
		}
		if tag, ok := p.Layer(layers.LayerTypeDot1Q).(*layers.Dot1Q); ok {
			if tag.VLANIdentifier == cliVLAN && udp.DstPort == 9 {
				s.tagged[n]++
			} else {
				s.bad++
			}
			continue
		}
		if ip6, ok := p.Layer(layers.LayerTypeIPv6).(*layers.IPv6); ok && udp.DstPort >= cliFlowPortLo && udp.DstPort <= cliFlowPortLo+1 {
			f := &s.flows
			f.frames++
			if !udp6Valid(ip6, ip6.Payload) {
				f.badChecksum++
			}
			f.srcIPs[ip6.SrcIP.String()]++
			f.srcPorts[int(udp.SrcPort)]++
			f.sizes[strconv.Itoa(n)]++
			if len(udp.Payload) >= 8 {
				f.seqs[binary.BigEndian.Uint64(udp.Payload)]++
			}
			continue
		}
		if udp.DstPort != 9 || len(udp.Payload) < 8 || n != 64 {
			s.bad++
			continue
		}
		s.frames++
		if binary.BigEndian.Uint64(udp.Payload) == next {
			s.inOrder++
			next++
		}
	}
}

func TestGuestCLIListBind(t *testing.T) {
	if !qemu.InGuest() {
		t.Skip("needs VFIO: runs inside the guest booted by TestVMTools")
	}
	code, out, errw := runCLI("list")
	require.Zero(t, code, errw)
	t.Log("\n" + out)
	require.Regexp(t, cliNIC+`\s+1af4:1041\s+virtio-net \(modern\)\s+vfio-pci\s+\d+\s+-\s+-\s+bound`, out, "no MAC known on vfio-pci")
	// The Linux NICs show their MAC; the legend goes to stderr.
	require.Regexp(t, `0000:00:06.0\s+1af4:1041\s+virtio-net \(modern\)\s+virtio-pci\s+\d+\s+\S+ \*Active\*\s+([0-9a-f]{2}:){5}[0-9a-f]{2}\s+no`, out)
	require.NotContains(t, out, "*Active*: the kernel uses")
	require.Contains(t, errw, "*Active*: the kernel uses this NIC")
	require.Regexp(t, cliSpareNIC+`\s+8086:10d3\s+Intel 82574L \(e1000e\)\s+-\s+\d+`, out)

	code, out, errw = runCLI("bind", cliSpareNIC)
	require.Zero(t, code, errw)
	require.Contains(t, out, "bound "+cliSpareNIC+" to vfio-pci (was no driver)")
	d, err := os.Readlink("/sys/bus/pci/devices/" + cliSpareNIC + "/driver")
	require.NoError(t, err)
	require.Equal(t, "vfio-pci", filepath.Base(d))

	code, out, errw = runCLI("unbind", cliSpareNIC)
	require.Zero(t, code, errw)
	require.Contains(t, out, "unbound "+cliSpareNIC+" from vfio-pci, now no driver", "no e1000e module is loaded to claim it")
	_, err = os.Readlink("/sys/bus/pci/devices/" + cliSpareNIC + "/driver")
	require.True(t, errors.Is(err, os.ErrNotExist))
}

// TestGuestCLICapture: with the default buffers, which hold a tagged
// frame of the device's 9000-byte MTU, every frame of 14 to 9018 bytes is
// written byte-identical, in order, none missing.
func TestGuestCLICapture(t *testing.T) {
	if !qemu.InGuest() {
		t.Skip("needs VFIO: runs inside the guest booted by TestVMTools")
	}
	// In interrupt mode: the core sleeps on MSI-X whenever a poll finds
	// nothing, and the host's frames come 2 ms apart.
	sum, frames := guestCapture(t, cliFrames, "-mode", "interrupt")
	require.Equal(t, "interrupt", sum.Core.Mode)
	require.Equal(t, -1, sum.Core.CPU, "not pinned by default")
	require.Positive(t, sum.Core.Sleeps, "slept between frames")
	require.Positive(t, sum.Core.Wakeups)
	require.Equal(t, cliMTU, sum.Device.MTU, "the MTU the device offers, not 1500")
	require.Equal(t, cliMTU+nic.FrameOverhead, sum.Device.MaxTxFrame)
	require.GreaterOrEqual(t, sum.Device.MaxRxFrame, cliMTU+nic.FrameOverhead)
	require.True(t, sum.Device.Promiscuous, "promiscuous by default")
	tooLong, _ := checkWire(t, frames, sum.Device.MaxRxFrame)
	require.Zero(t, tooLong, "every frame of the cycle fits")
	require.EqualValues(t, 0, sum.Details["too_long"].(map[string]any)["frames"])
	require.EqualValues(t, 0, sum.Details["bad_completions"])
	sizes := map[int]bool{}
	for _, f := range frames {
		sizes[len(f.data)] = true
	}
	for _, w := range wireCycle {
		require.True(t, sizes[w.size], "a %d-byte %s frame was captured", w.size, w.kind)
	}
}

// TestGuestCLICaptureBuffers: with -buffer-size 4096 (frames of up to
// 4084 bytes), every frame that fits is written byte-identical and none is
// missing; each longer one is counted as too long, with its reason, in the
// live line and the summary.
func TestGuestCLICaptureBuffers(t *testing.T) {
	if !qemu.InGuest() {
		t.Skip("needs VFIO: runs inside the guest booted by TestVMTools")
	}
	const bufSize = 4096
	sum, frames := guestCapture(t, 300, "-buffer-size", strconv.Itoa(bufSize))
	require.Equal(t, bufSize, sum.Device.BufferSize)
	maxFrame := sum.Device.MaxRxFrame
	require.Equal(t, bufSize-12, maxFrame, "a 12-byte virtio-net header per buffer")
	expect, most := checkWire(t, frames, maxFrame)
	tl := sum.Details["too_long"].(map[string]any)
	counted := int(tl["frames"].(float64))
	t.Logf("too long for %d-byte buffers: %d counted; the host sent %d in the live stream, %d from the first captured frame on; largest %v bytes; reason %q",
		maxFrame, counted, expect, most, tl["largest_bytes"], tl["reason"])
	require.Greater(t, expect, 50, "the capture saw many frames too long for the buffers")
	require.GreaterOrEqual(t, counted, expect, "every frame too long is counted")
	require.LessOrEqual(t, counted, most, "and only frames too long")
	require.EqualValues(t, 9018, tl["largest_bytes"], "the longest frame of the cycle, measured across its buffers")
	require.Contains(t, tl["reason"], "longer than the 4084 bytes a receive buffer holds")
	require.EqualValues(t, 0, sum.Details["bad_completions"])
}

// TestGuestCLICaptureStdout: '-w -' writes a nanosecond pcap to stdout
// (for 'vfnic capture -w - ADDR | tshark -r -') and every human line to
// stderr.
func TestGuestCLICaptureStdout(t *testing.T) {
	if !qemu.InGuest() {
		t.Skip("needs VFIO: runs inside the guest booted by TestVMTools")
	}
	code, out, errw := runCLI("capture", cliNIC, "-w", "-", "-count", "20", "-duration", "60s", "-snaplen", "100")
	t.Log(errw)
	require.Zero(t, code, errw)
	require.Contains(t, errw, "capture: writing frames to stdout (promiscuous, snap length 100")
	require.Contains(t, errw, "written 20")
	require.Equal(t, []byte{0x4d, 0x3c, 0xb2, 0xa1}, []byte(out[:4]), "nanosecond pcap magic")
	r, err := pcapgo.NewReader(bytes.NewReader([]byte(out)))
	require.NoError(t, err)
	require.Equal(t, uint32(100), r.Snaplen())
	n, subMicro := 0, 0
	for {
		data, ci, err := r.ReadPacketData()
		if err != nil {
			break
		}
		seq, ok := wireSeq(data)
		require.True(t, ok)
		full := wireFrame(seq)
		require.Equal(t, len(full), ci.Length)
		require.Equal(t, min(len(full), 100), ci.CaptureLength, "cut at the snap length")
		require.Equal(t, full[:ci.CaptureLength], data)
		if ci.Timestamp.Nanosecond()%1000 != 0 {
			subMicro++
		}
		n++
	}
	require.Equal(t, 20, n)
	require.Positive(t, subMicro, "timestamps carry nanoseconds")
}

// guestCapture runs 'vfnic capture -json' for count frames and returns its
// summary and the frames of the pcap.
func guestCapture(t *testing.T, count int, extra ...string) (trafficSummary, []pcapFrame) {
	file := filepath.Join(t.TempDir(), "capture.pcap")
	// The address first and flags after it, as people type them.
	args := append([]string{"capture", cliNIC, "-w", file, "-count", strconv.Itoa(count), "-duration", "60s",
		"-progress", "200ms", "-json"}, extra...)
	code, out, errw := runCLI(args...)
	t.Log(errw)
	require.Zero(t, code, errw)
	mode := "(promiscuous"
	if slices.Contains(extra, "-p") {
		mode = "(not promiscuous"
	}
	require.Contains(t, errw, "capture: writing frames to "+file+" "+mode)
	var sum trafficSummary
	require.NoError(t, json.Unmarshal([]byte(out), &sum), out)
	require.Equal(t, "capture", sum.Command)
	require.EqualValues(t, count, sum.Details["written"])
	require.NotNil(t, sum.Core, "the summary describes the polling core")
	t.Logf("core: %+v", *sum.Core)
	require.Contains(t, errw, "capture: polling core "+sum.Core.Mode+" mode")
	if !slices.Contains(extra, "-mode") {
		require.Equal(t, "adaptive", sum.Core.Mode, "the default mode")
	}
	require.GreaterOrEqual(t, sum.Core.Completions, uint64(count))
	require.LessOrEqual(t, sum.Core.EmptyPolls, sum.Core.Polls)
	mf := sum.Device.MaxRxFrame
	require.Contains(t, errw, fmt.Sprintf("too long for the %d-byte buffers", mf), "the live line and the summary count frames too long")

	f, err := os.Open(file)
	require.NoError(t, err)
	defer f.Close()
	r, err := pcapgo.NewReader(f)
	require.NoError(t, err)
	require.Equal(t, layers.LinkTypeEthernet, r.LinkType())
	require.Equal(t, uint32(262144), r.Snaplen())
	var frames []pcapFrame
	for {
		data, ci, err := r.ReadPacketData()
		if err != nil {
			break
		}
		require.Equal(t, ci.CaptureLength, len(data))
		require.Equal(t, ci.Length, len(data), "nothing truncated")
		frames = append(frames, pcapFrame{data: data, ts: ci.Timestamp})
	}
	require.Len(t, frames, count, "the pcap holds -count frames")
	return sum, frames
}

type pcapFrame struct {
	data []byte
	ts   time.Time
}

// checkWire checks captured frames against what the host sent: each is
// byte-identical to its wireFrame, in order, and every frame of at most
// maxFrame bytes the host sent after the backlog is there. It returns how
// many frames longer than maxFrame the host sent in the live stream after
// the backlog (capture must count at least those) and how many it sent in
// all between the first and last captured frame, plus one before (capture
// may count no more).
//
// Gaps are allowed in the backlog, the first 100 frames: while no driver
// runs the NIC (between guest tests), QEMU stops reading its socket, which
// keeps the oldest frames and drops newer ones as it fills; capture
// receives that backlog first, then the live stream, which must have no
// gap over at least 100 frames.
func checkWire(t *testing.T, frames []pcapFrame, maxFrame int) (expect, most int) {
	t.Helper()
	fits := func(seq int) bool { return wireCycle[seq%len(wireCycle)].size <= maxFrame }
	var seqs []int
	for i, f := range frames {
		seq, ok := wireSeq(f.data)
		require.True(t, ok, "frame %d (%d bytes) is the host's", i, len(f.data))
		require.Equal(t, wireFrame(seq), f.data, "frame %d (seq %d, %d bytes) byte-identical", i, seq, len(f.data))
		require.LessOrEqual(t, len(f.data), maxFrame)
		if i > 0 {
			require.False(t, f.ts.Before(frames[i-1].ts), "timestamps in order")
		}
		seqs = append(seqs, seq)
	}
	most = 1 // the frame before the first captured one may be too long
	lastGap := 0
	long := make([]int, len(seqs)) // frames too long sent between i-1 and i
	for i := 1; i < len(seqs); i++ {
		prev, cur := seqs[i-1], seqs[i]
		require.Greater(t, cur, prev, "frames in order")
		missing := 0
		for s := prev + 1; s < cur; s++ {
			if fits(s) {
				missing++
			} else {
				long[i]++
			}
		}
		most += long[i]
		if missing > 0 {
			t.Logf("backlog: %d frames that fit missing after frame %d (seq %d to %d)", missing, i-1, prev, cur)
			require.LessOrEqual(t, i, 100, "no frame that fits is missing after the backlog")
			lastGap = i
		}
	}
	// In the backlog the socket may have dropped a long frame and kept the
	// shorter ones around it: count only from the live stream on.
	for i := lastGap + 1; i < len(seqs); i++ {
		expect += long[i]
	}
	require.GreaterOrEqual(t, len(seqs)-lastGap, 100, "a live stream of at least 100 frames after the backlog")
	return expect, most
}

// wireKind is how a wire frame is built.
type wireKind string

const (
	wirePlain wireKind = "untagged"
	wireVLAN  wireKind = "802.1Q"
	wireQinQ  wireKind = "QinQ"
	wireIPv6  wireKind = "IPv6/UDP"
	// For the filter tests (TestGuestCLICaptureFilter).
	wireTCP4     wireKind = "IPv4/TCP"
	wireUDP4VLAN wireKind = "802.1Q IPv4/UDP"
	wireARP      wireKind = "ARP"
	wireICMP4    wireKind = "IPv4/ICMP"
)

type wireSpec struct {
	size    int
	kind    wireKind
	unicast bool // to a MAC that is not the NIC's: only promiscuous mode sees it
}

// wireCycle is the sequence of frames the host sends, over and over:
// sizes 14 to 9018 including the edges of 1500/9000 MTUs, 2048 and 4096
// buffers, tagged and IPv6, and IPv4 TCP, UDP (tagged), ICMP and ARP
// frames for the filters. Frames longer than 4084 bytes alternate with
// shorter ones, so that no two frames too long for 4096-byte buffers are
// adjacent (checkWire's bounds rely on it).
var wireCycle = func() []wireSpec {
	small := []wireSpec{{14, wirePlain, false}, {15, wirePlain, true}, {60, wirePlain, true}, {64, wireIPv6, false},
		{100, wireVLAN, false}, {1514, wirePlain, false}, {1515, wirePlain, false}, {1518, wireVLAN, true},
		{1522, wireQinQ, false}, {2036, wirePlain, true}, {2037, wirePlain, false}, {3000, wireIPv6, false},
		{4084, wirePlain, false}, {4084, wireQinQ, false}, {1000, wireIPv6, true},
		{74, wireTCP4, true}, {90, wireUDP4VLAN, false}, {60, wireARP, false}, {98, wireICMP4, true}}
	big := []wireSpec{{4085, wirePlain, false}, {4096, wireVLAN, false}, {5000, wireIPv6, true}, {6000, wirePlain, true},
		{8000, wireQinQ, false}, {9000, wirePlain, false}, {9014, wirePlain, false}, {9018, wireVLAN, false},
		{9018, wireQinQ, true}, {9018, wireIPv6, false}}
	var c []wireSpec
	for i := range small {
		c = append(c, small[i])
		if i < len(big) {
			c = append(c, big[i])
		}
	}
	return c
}()

// wireFrame is frame seq of the host's stream. Its source MAC carries the
// sequence number (02:cc + 32 bits), so that even a 14-byte frame names
// itself; the rest is a function of seq.
func wireFrame(seq int) []byte {
	w := wireCycle[seq%len(wireCycle)]
	src := net.HardwareAddr{2, 0xcc, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(src[2:], uint32(seq))
	dst := net.HardwareAddr(layers.EthernetBroadcast)
	if w.unicast {
		dst = net.HardwareAddr{2, 0, 0, 0, 0, 0x99}
	}
	fill := func(n int) []byte {
		p := make([]byte, n)
		for i := range p {
			p[i] = byte(seq + i)
		}
		return p
	}
	const local = layers.EthernetType(0x88b5) // IEEE local experimental
	var ls []gopacket.SerializableLayer
	switch w.kind {
	case wirePlain:
		// By hand: gopacket pads Ethernet frames to 60 bytes.
		b := append(append(append([]byte{}, dst...), src...), 0x88, 0xb5)
		return append(b, fill(w.size-14)...)
	case wireVLAN:
		ls = []gopacket.SerializableLayer{&layers.Ethernet{SrcMAC: src, DstMAC: dst, EthernetType: layers.EthernetTypeDot1Q},
			&layers.Dot1Q{VLANIdentifier: 100, Type: local}, gopacket.Payload(fill(w.size - 18))}
	case wireQinQ:
		ls = []gopacket.SerializableLayer{&layers.Ethernet{SrcMAC: src, DstMAC: dst, EthernetType: layers.EthernetTypeQinQ},
			&layers.Dot1Q{VLANIdentifier: 200, Type: layers.EthernetTypeDot1Q},
			&layers.Dot1Q{VLANIdentifier: 100, Type: local}, gopacket.Payload(fill(w.size - 22))}
	case wireIPv6:
		ip := &layers.IPv6{Version: 6, NextHeader: layers.IPProtocolUDP, HopLimit: 64,
			SrcIP: net.ParseIP("fe80::cc"), DstIP: net.ParseIP("ff02::1")}
		udp := &layers.UDP{SrcPort: 7, DstPort: 9}
		_ = udp.SetNetworkLayerForChecksum(ip)
		ls = []gopacket.SerializableLayer{&layers.Ethernet{SrcMAC: src, DstMAC: dst, EthernetType: layers.EthernetTypeIPv6},
			ip, udp, gopacket.Payload(fill(w.size - 14 - 40 - 8))}
	case wireTCP4, wireUDP4VLAN, wireICMP4:
		ip := &layers.IPv4{Version: 4, TTL: 64, SrcIP: net.IP{10, 0, 0, 1}, DstIP: net.IP{10, 0, 0, 2}}
		e := &layers.Ethernet{SrcMAC: src, DstMAC: dst, EthernetType: layers.EthernetTypeIPv4}
		switch w.kind {
		case wireTCP4:
			ip.Protocol = layers.IPProtocolTCP
			tcp := &layers.TCP{SrcPort: 40000, DstPort: 80, Seq: uint32(seq), SYN: true, Window: 1024}
			_ = tcp.SetNetworkLayerForChecksum(ip)
			ls = []gopacket.SerializableLayer{e, ip, tcp, gopacket.Payload(fill(w.size - 14 - 20 - 20))}
		case wireUDP4VLAN:
			ip.Protocol, ip.SrcIP, ip.DstIP = layers.IPProtocolUDP, net.IP{10, 0, 0, 3}, net.IP{10, 0, 0, 4}
			udp := &layers.UDP{SrcPort: 5000, DstPort: 6000}
			_ = udp.SetNetworkLayerForChecksum(ip)
			e.EthernetType = layers.EthernetTypeDot1Q
			ls = []gopacket.SerializableLayer{e, &layers.Dot1Q{VLANIdentifier: 300, Type: layers.EthernetTypeIPv4},
				ip, udp, gopacket.Payload(fill(w.size - 18 - 20 - 8))}
		case wireICMP4:
			ip.Protocol, ip.SrcIP, ip.DstIP = layers.IPProtocolICMPv4, net.IP{10, 0, 0, 2}, net.IP{10, 0, 0, 1}
			ls = []gopacket.SerializableLayer{e, ip, &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeEchoRequest, 0),
				Id: 7, Seq: uint16(seq)}, gopacket.Payload(fill(w.size - 14 - 20 - 8))}
		}
	case wireARP:
		ls = []gopacket.SerializableLayer{&layers.Ethernet{SrcMAC: src, DstMAC: dst, EthernetType: layers.EthernetTypeARP},
			&layers.ARP{AddrType: layers.LinkTypeEthernet, Protocol: layers.EthernetTypeIPv4, HwAddressSize: 6, ProtAddressSize: 4,
				Operation: layers.ARPRequest, SourceHwAddress: src, SourceProtAddress: net.IP{10, 0, 0, 1},
				DstHwAddress: make([]byte, 6), DstProtAddress: net.IP{10, 0, 0, 2}}} // padded to 60 bytes
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
		panic(err) // the specs above are fixed: a test bug
	}
	return buf.Bytes()
}

// wireSeq reads the sequence number of a host frame.
func wireSeq(b []byte) (int, bool) {
	if len(b) < 14 || b[6] != 2 || b[7] != 0xcc {
		return 0, false
	}
	return int(binary.BigEndian.Uint32(b[8:12])), true
}

// TestWireFrames checks the host's frames on the host: their sizes, and
// that gopacket decodes the tagged and IPv6 ones as what they claim.
func TestWireFrames(t *testing.T) {
	for seq := range 2 * len(wireCycle) {
		w := wireCycle[seq%len(wireCycle)]
		b := wireFrame(seq)
		require.Len(t, b, w.size, "seq %d", seq)
		s, ok := wireSeq(b)
		require.True(t, ok)
		require.Equal(t, seq, s)
		p := gopacket.NewPacket(b, layers.LayerTypeEthernet, gopacket.Default)
		switch w.kind {
		case wireVLAN:
			require.NotNil(t, p.Layer(layers.LayerTypeDot1Q), "seq %d", seq)
		case wireQinQ:
			n := 0
			for _, l := range p.Layers() {
				if l.LayerType() == layers.LayerTypeDot1Q {
					n++
				}
			}
			require.Equal(t, 2, n, "seq %d: two tags", seq)
		case wireIPv6, wireUDP4VLAN:
			require.NotNil(t, p.Layer(layers.LayerTypeUDP), "seq %d", seq)
			require.Nil(t, p.ErrorLayer(), "seq %d", seq)
		case wireTCP4:
			require.NotNil(t, p.Layer(layers.LayerTypeTCP), "seq %d", seq)
		case wireICMP4:
			require.NotNil(t, p.Layer(layers.LayerTypeICMPv4), "seq %d", seq)
		case wireARP:
			require.NotNil(t, p.Layer(layers.LayerTypeARP), "seq %d", seq)
		}
	}
}

func TestGuestCLIPktgen(t *testing.T) {
	if !qemu.InGuest() {
		t.Skip("needs VFIO: runs inside the guest booted by TestVMTools")
	}
	// A busy core pinned to CPU 1, as DPDK's testpmd runs (the guest has 2).
	code, out, errw := runCLI("pktgen", "-count", strconv.Itoa(cliPktgen), "-size", "64", "-progress", "0",
		"-mode", "busy", "-cpu", "1", "-json", cliNIC)
	t.Log(errw)
	require.Zero(t, code, errw)
	require.Contains(t, errw, "polling in busy mode on a thread pinned to CPU 1")
	require.Contains(t, errw, fmt.Sprintf("tx %d frames", cliPktgen))
	require.Contains(t, errw, "errors rx 0 tx 0")
	require.Contains(t, errw, "pktgen: polling core busy mode, pinned to CPU 1: ")
	var sum trafficSummary
	require.NoError(t, json.Unmarshal([]byte(out), &sum), out)
	require.EqualValues(t, cliPktgen, sum.Tx.Frames)
	require.EqualValues(t, cliPktgen, sum.Details["queued"])
	require.NotNil(t, sum.Core)
	t.Logf("core: %+v", *sum.Core)
	require.Equal(t, "busy", sum.Core.Mode)
	require.Equal(t, 1, sum.Core.CPU)
	require.GreaterOrEqual(t, sum.Core.Polls, uint64(cliPktgen/lcoreBatch), "at most a batch of frames per poll")
	// The sends still in the ring when the count was reached complete after the core stopped.
	require.GreaterOrEqual(t, sum.Core.Completions, uint64(cliPktgen-sum.Device.QueueSize), "the core read the send completions")
	require.Zero(t, sum.Core.Sleeps, "a busy core never sleeps")
	require.Zero(t, sum.Core.Wakeups)
}

// lcoreBatch is the most frames pktgen queues per poll (lcore.DefaultBatch).
const lcoreBatch = 32

// TestGuestCLIPktgenTagged sends 802.1Q frames of full size for a
// 1500-byte MTU (1518 bytes) and for the device's 9000-byte MTU (9022
// bytes, room for two tags), the second at a set rate; one byte more is
// refused with the numbers. The host counts what arrives.
func TestGuestCLIPktgenTagged(t *testing.T) {
	if !qemu.InGuest() {
		t.Skip("needs VFIO: runs inside the guest booted by TestVMTools")
	}
	maxFrame := cliMTU + nic.FrameOverhead
	code, _, errw := runCLI("pktgen", cliNIC, "-vlan", strconv.Itoa(cliVLAN), "-size", strconv.Itoa(maxFrame+1))
	require.Equal(t, exitUsage, code)
	require.Contains(t, errw, fmt.Sprintf("frame of %d bytes outside [60, %d]", maxFrame+1, maxFrame))

	for _, tc := range []struct {
		size int
		rate string
	}{{1518, "0"}, {maxFrame, "1000"}} {
		code, out, errw := runCLI("pktgen", cliNIC, "-vlan", strconv.Itoa(cliVLAN), "-size", strconv.Itoa(tc.size),
			"-count", strconv.Itoa(cliTagged), "-rate", tc.rate, "-progress", "0", "-json")
		t.Log(errw)
		require.Zero(t, code, errw)
		var sum trafficSummary
		require.NoError(t, json.Unmarshal([]byte(out), &sum), out)
		require.EqualValues(t, cliTagged, sum.Tx.Frames)
		require.EqualValues(t, cliTagged*tc.size, sum.Tx.Bytes)
		require.Zero(t, sum.Tx.Errors)
		if tc.rate != "0" {
			require.Contains(t, errw, "at 1000 pps (72.18 Mbit/s), until 100 frames are sent")
			// Paced: frame i leaves no earlier than i/rate seconds in.
			require.GreaterOrEqual(t, sum.Seconds, float64(cliTagged-1)/1000)
		} else {
			require.Contains(t, errw, "as fast as the NIC takes them")
		}
	}
}

// TestGuestCLIProbeJSON: probe -json reports what it exercised on a real
// device, as one JSON object on stdout.
func TestGuestCLIProbeJSON(t *testing.T) {
	if !qemu.InGuest() {
		t.Skip("needs VFIO: runs inside the guest booted by TestVMTools")
	}
	code, out, errw := runCLI("probe", cliNIC, "-json")
	t.Log(errw)
	require.Zero(t, code, errw)
	var r probeReport
	require.NoError(t, json.Unmarshal([]byte(out), &r), out)
	t.Logf("%+v", r)
	require.Equal(t, cliNIC, r.Address)
	require.Equal(t, "1af4", r.VendorID)
	require.Equal(t, "vfio-pci", r.Driver)
	require.Empty(t, r.Error)
	require.NotEmpty(t, r.BARs)
	require.NotNil(t, r.Virtio)
	require.True(t, r.Virtio.Version1 && r.Virtio.AccessPlatform && r.Virtio.RingPacked)
	require.NotEmpty(t, r.IOVARanges)
	require.Equal(t, 2<<20, r.DMA.Bytes)
	require.GreaterOrEqual(t, r.MSIX.Vectors, 3)
	require.Equal(t, r.MSIX.Vectors, r.MSIX.Interrupts, "one interrupt per vector")
}

// TestGuestCLIEchoLongFrames: frames too long for echo's 2048-byte
// buffers (the host's stream holds many) do not starve its ring: echo
// receives more of their buffers than it has, and the frames that fit.
func TestGuestCLIEchoLongFrames(t *testing.T) {
	if !qemu.InGuest() {
		t.Skip("needs VFIO: runs inside the guest booted by TestVMTools")
	}
	code, out, errw := runCLI("echo", cliNIC, "-ip", "10.0.0.1", "-buffer-size", "2048", "-duration", "3s",
		"-progress", "0", "-json", "-mode", "interrupt")
	t.Log(errw)
	require.Zero(t, code, errw)
	var sum trafficSummary
	require.NoError(t, json.Unmarshal([]byte(out), &sum), out)
	require.Equal(t, 2048, sum.Device.BufferSize)
	t.Logf("echo: rx %d frames, %d error completions, %d receive buffers", sum.Rx.Frames, sum.Rx.Errors, sum.Device.RxBuffers)
	// Each error completion keeps its buffer from the ring until it is
	// posted again: without that, there could be no more of them than
	// receive buffers, and then no completion at all.
	require.Greater(t, sum.Rx.Errors, uint64(sum.Device.RxBuffers), "more buffers of long frames than echo has")
	require.Greater(t, sum.Rx.Frames, uint64(100), "and echo kept receiving the frames that fit")
	require.NotNil(t, sum.Core)
	t.Logf("core: %+v", *sum.Core)
	require.Equal(t, "interrupt", sum.Core.Mode)
	require.Equal(t, -1, sum.Core.CPU)
	require.Positive(t, sum.Core.Sleeps, "slept on MSI-X between frames")
	require.Positive(t, sum.Core.Wakeups)
	require.GreaterOrEqual(t, sum.Core.Completions, sum.Rx.Frames+sum.Rx.Errors, "every receive completion went through the core")
}

// TestGuestCLICaptureNoPromisc: with -p the NIC takes only frames for its
// MAC, broadcast and multicast: the host's frames to another unicast MAC
// (which the default, promiscuous, capture writes) are not seen.
func TestGuestCLICaptureNoPromisc(t *testing.T) {
	if !qemu.InGuest() {
		t.Skip("needs VFIO: runs inside the guest booted by TestVMTools")
	}
	sum, frames := guestCapture(t, 50, "-p")
	require.False(t, sum.Device.Promiscuous)
	for i, f := range frames {
		seq, ok := wireSeq(f.data)
		require.True(t, ok)
		require.Equal(t, wireFrame(seq), f.data)
		require.False(t, wireCycle[seq%len(wireCycle)].unicast, "frame %d (seq %d) is for another MAC", i, seq)
		require.Equal(t, []byte(layers.EthernetBroadcast), f.data[:6])
	}
}

// TestGuestCLICaptureFilter: capture with each of captureFilters writes
// only frames libpcap accepts (filterReference), byte-identical, and,
// once past the backlog QEMU kept while no driver ran, misses none that
// libpcap accepts; without -w it prints tcpdump's lines; a bad expression
// is refused before the device is touched.
func TestGuestCLICaptureFilter(t *testing.T) {
	if !qemu.InGuest() {
		t.Skip("needs VFIO: runs inside the guest booted by TestVMTools")
	}
	var ref map[string][]int
	require.NoError(t, json.Unmarshal([]byte(os.Getenv(filterRefEnv)), &ref), "the host's libpcap reference")
	for i, expr := range captureFilters {
		accepted := map[int]bool{}
		for _, k := range ref[expr] {
			accepted[k] = true
		}
		require.NotEmpty(t, accepted, expr)
		// The backlog is at most 100 frames (checkWire): enough frames that
		// the second half comes from the live stream.
		share := float64(len(accepted)) / float64(len(wireCycle))
		count := 2*int(math.Ceil(100*share)) + 10
		file := filepath.Join(t.TempDir(), "f.pcap")
		args := []string{"capture", cliNIC, "-w", file, "-c", strconv.Itoa(count), "-duration", "60s", "-progress", "0", "-json"}
		if i%2 == 0 {
			args = append(args, expr) // quoted, one argument
		} else {
			args = append(args, strings.Fields(expr)...) // as tcpdump's words
		}
		code, out, errw := runCLI(args...)
		require.Zero(t, code, "%q: %s", expr, errw)
		require.Contains(t, errw, fmt.Sprintf("filter %q (", expr))
		var sum trafficSummary
		require.NoError(t, json.Unmarshal([]byte(out), &sum), out)
		require.EqualValues(t, count, sum.Details["written"], expr)
		f, err := os.Open(file)
		require.NoError(t, err)
		r, err := pcapgo.NewReader(f)
		require.NoError(t, err)
		var seqs []int
		for {
			data, _, err := r.ReadPacketData()
			if err != nil {
				break
			}
			seq, ok := wireSeq(data)
			require.True(t, ok, "%q: a host frame", expr)
			require.Equal(t, wireFrame(seq), data, "%q: seq %d byte-identical", expr, seq)
			require.True(t, accepted[seq%len(wireCycle)], "%q: seq %d (%s, %d bytes) is one libpcap refuses", expr, seq,
				wireCycle[seq%len(wireCycle)].kind, len(data))
			seqs = append(seqs, seq)
		}
		f.Close()
		require.Len(t, seqs, count, expr)
		missed := 0
		for j := count / 2; j < count; j++ {
			require.Greater(t, seqs[j], seqs[j-1], "%q: in order", expr)
			for s := seqs[j-1] + 1; s < seqs[j]; s++ {
				if accepted[s%len(wireCycle)] {
					missed++
				}
			}
		}
		require.Zero(t, missed, "%q: frames libpcap accepts missing from the live stream", expr)
		t.Logf("%q: %d frames, all libpcap's, none of its missing over the last %d (%v filtered out)",
			expr, count, count-count/2, sum.Details["filtered_out"])
	}

	// Text lines on stdout, tcpdump-style flags, the filter after -i.
	code, out, errw := runCLI("capture", "-i", cliNIC, "-c", "3", "-duration", "60s", "-progress", "0", "icmp")
	require.Zero(t, code, errw)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	require.Len(t, lines, 3, out)
	line := regexp.MustCompile(`^\d\d:\d\d:\d\d\.\d{6} IP 10\.0\.0\.2 > 10\.0\.0\.1: ICMP echo request, id 7, seq \d+, length 64$`)
	for _, l := range lines {
		require.Regexp(t, line, l)
	}
	require.Contains(t, errw, "capture: writing frames to stdout as text")

	// A bad expression: refused with its column, the device untouched.
	code, out, errw = runCLI("capture", cliNIC, "tcp", "prot", "80")
	require.Equal(t, exitUsage, code)
	require.Empty(t, out)
	require.Contains(t, errw, `filter: column 5: want "and", "or" or the end of the expression, got "prot" (did you mean "port"?)`)
	require.NotContains(t, errw, "queue pair", "the device was not opened")
}

// TestFilterReference checks, on the host, what TestGuestCLICaptureFilter
// relies on: libpcap's verdicts over the host's stream, and that the
// compiler's match them frame for frame.
func TestFilterReference(t *testing.T) {
	if _, err := exec.LookPath("tcpdump"); err != nil && !qemu.InCI() {
		t.Skip("tcpdump is not installed (apt-get install tcpdump)")
	}
	js, ok := filterReference(t)
	require.True(t, ok)
	var ref map[string][]int
	require.NoError(t, json.Unmarshal([]byte(js), &ref))
	for _, expr := range captureFilters {
		f, err := pcapfilter.New(expr)
		require.NoError(t, err)
		var got []int
		for seq := range wireCycle {
			if f.Match(wireFrame(seq)) {
				got = append(got, seq)
			}
		}
		require.Equal(t, ref[expr], got, expr)
		t.Logf("%q takes %d of the %d frames of a cycle", expr, len(got), len(wireCycle))
	}
}

// TestGuestCLIInfo: 'vfnic info' on virtio and igb, in text and JSON,
// opens the NIC, sends and receives nothing, and says what it is.
func TestGuestCLIInfo(t *testing.T) {
	if !qemu.InGuest() {
		t.Skip("needs VFIO: runs inside the guest booted by TestVMTools")
	}
	mac := `([0-9a-f]{2}:){5}[0-9a-f]{2}`
	for _, tc := range []struct {
		addr, driver, model string
		mtu, maxTx          int
		features, offloads  []string
		text                []string // regexps the text must hold
	}{
		{cliNIC, "virtio", "virtio-net", cliMTU, cliMTU + nic.FrameOverhead, []string{"VERSION_1", "RING_PACKED", "MTU", "ACCESS_PLATFORM"}, nil,
			[]string{`(?m)^0000:00:04.0: virtio-net.* \(virtio driver\)$`, `(?m)^  MTU              9000 \(frames up to 9022 bytes sent`,
				`(?m)^  features         .*RING_PACKED`}},
		{cliIGB, "igb", "82576", 1500, 1500 + nic.FrameOverhead, []string{"advanced-descriptors", "msix"}, []string{"tx IPv4/TCP/UDP checksum"},
			[]string{`(?m)^0000:00:08.0: Intel 82576 \(igb driver\)$`, `(?m)^  link             (up, \d+ Mbit/s|down)`,
				`(?m)^  offloads         .*tx IPv4/TCP/UDP checksum`}},
	} {
		code, out, errw := runCLI("info", tc.addr)
		require.Zero(t, code, errw)
		t.Log("\n" + out)
		require.Regexp(t, `(?m)^  MAC              `+mac+`$`, out)
		require.Regexp(t, `(?m)^  queue pairs      1 used, \d+ offered$`, out)
		require.Regexp(t, `(?m)^  rings            \d+ descriptors; \d+ receive buffers of \d+ bytes$`, out)
		require.Contains(t, out, "  binding          vfio-pci\n", "already bound: nothing rebound")
		require.Regexp(t, `(?m)^  hw counters      (rx good \d+ \(\d+ bytes\), missed 0, no buffer 0|virtio has no statistics registers)`, out)
		for _, re := range tc.text {
			require.Regexp(t, re, out)
		}

		code, out, errw = runCLI("info", "-json", tc.addr)
		require.Zero(t, code, errw)
		var in infoOutput
		require.NoError(t, json.Unmarshal([]byte(out), &in), out)
		require.Equal(t, tc.addr, in.Address)
		require.Equal(t, tc.driver, in.Driver)
		require.Contains(t, in.Model, tc.model)
		require.Regexp(t, "^"+mac+"$", in.MAC)
		require.Equal(t, tc.mtu, in.MTU)
		require.Equal(t, tc.maxTx, in.MaxTxFrame)
		require.Positive(t, in.MaxRxFrame)
		require.Equal(t, 1, in.QueuePairs)
		require.GreaterOrEqual(t, in.MaxQueuePairs, 1)
		require.Positive(t, in.QueueSize)
		require.Positive(t, in.Vectors)
		require.Empty(t, in.Link.Error)
		for _, f := range tc.features {
			require.Contains(t, in.Features, f)
		}
		for _, f := range tc.offloads {
			require.Contains(t, in.Offloads, f)
		}
		require.Zero(t, in.Counters.Tx.Packets, "info sends nothing")
		if tc.driver == "igb" {
			require.NotNil(t, in.Hardware, "igb's statistics registers: %s", in.HardwareNote)
			require.Zero(t, in.Hardware.TxGood, "info sends nothing, and the counters start at open")
		} else {
			require.Nil(t, in.Hardware)
			require.Contains(t, in.HardwareNote, "virtio has no statistics registers")
		}
		require.False(t, in.Rebound)
		if tc.driver == "virtio" {
			require.True(t, in.Link.Up, "link: %+v", in.Link)
		}
		if tc.driver == "igb" {
			require.True(t, in.Link.Reported, "the 82576 reports its link")
			if in.Link.Up {
				require.Positive(t, in.Link.SpeedMbps)
			}
			require.GreaterOrEqual(t, in.MaxQueuePairs, 2, "the 82576 offers several queue pairs")
		}
		t.Logf("%s: %+v", tc.addr, in)
	}
}

// TestGuestCLIPktgenFlows: pktgen with ranges of IPv6 sources, UDP ports
// and a size mix; the host checks what arrives (TestVMTools).
func TestGuestCLIPktgenFlows(t *testing.T) {
	if !qemu.InGuest() {
		t.Skip("needs VFIO: runs inside the guest booted by TestVMTools")
	}
	code, out, errw := runCLI("pktgen", cliNIC, "-count", strconv.Itoa(cliFlowFrames), "-rate", "2000", "-progress", "0", "-json",
		"-src-ip", "2001:db8::1-2001:db8::3", "-dst-ip", "2001:db8::100", "-src-port", "1000-1003",
		"-port", fmt.Sprintf("%d-%d", cliFlowPortLo, cliFlowPortLo+1), "-size-mix", "78:2,1514:1")
	t.Log(errw)
	require.Zero(t, code, errw)
	require.Contains(t, errw, "pktgen: sending a mix of 78:2,1514:1 byte frames to ff:ff:ff:ff:ff:ff (2001:db8::1-2001:db8::3 -> 2001:db8::100:5000-5001 from port 1000-1003)")
	var sum trafficSummary
	require.NoError(t, json.Unmarshal([]byte(out), &sum), out)
	require.EqualValues(t, cliFlowFrames, sum.Tx.Frames)
	require.EqualValues(t, cliFlowFrames/3*(78*2+1514), sum.Tx.Bytes)
	require.Zero(t, sum.Tx.Errors)
}

// TestGuestCLISinkRSS: 'pktgen -queues 4' on one 82576 sends 64 flows
// (sources and ports in ranges) from its 4 transmit queues, each on its
// own core; 'sink -queues 4' on the other 82576 receives them spread by
// RSS over its 4 queues, with per-queue counts in both summaries. Then
// 'capture -queues 4' and 'echo -queues 4' on the same NIC: every queue
// takes a share of the flows, and echo answers each on its queue.
func TestGuestCLISinkRSS(t *testing.T) {
	if !qemu.InGuest() {
		t.Skip("needs VFIO: runs inside the guest booted by TestVMTools")
	}
	const frames = 640
	code, out, errw := runCLI("info", "-json", cliIGB)
	require.Zero(t, code, errw)
	var in infoOutput
	require.NoError(t, json.Unmarshal([]byte(out), &in), out)
	flows := []string{"-src-ip", "10.1.0.1-10.1.0.64", "-dst-ip", "10.2.0.1", "-src-port", "1000-1063", "-port", "7"}

	// start runs a command that waits for traffic, until it says so.
	start := func(ready string, args ...string) *vfnicProc {
		p := startVfnic(t, args...)
		deadline := time.Now().Add(30 * time.Second)
		for !strings.Contains(p.output(), ready) {
			require.True(t, time.Now().Before(deadline), "%s did not start:\n%s", args[0], p.output())
			time.Sleep(50 * time.Millisecond)
		}
		require.Contains(t, p.output(), "4 queues, each polling in adaptive mode")
		return p
	}
	// summary is the -json summary line of a command's output.
	summary := func(command, output string) trafficSummary {
		var sum trafficSummary
		for _, l := range strings.Split(output, "\n") {
			if strings.HasPrefix(l, `{"command":"`+command+`"`) {
				require.NoError(t, json.Unmarshal([]byte(l), &sum), l)
			}
		}
		require.Equal(t, command, sum.Command, output)
		require.Len(t, sum.Queues, 4, "per-queue counters")
		return sum
	}
	// perQueue is each queue's receive count; all must have some.
	perQueue := func(what string, sum trafficSummary) []uint64 {
		counts := make([]uint64, 4)
		for i, q := range sum.Queues {
			require.Equal(t, i, q.Queue)
			counts[i] = q.Rx.Frames
			require.Positive(t, q.Rx.Frames, "%s: queue %d received some of the 64 flows: %+v", what, i, sum.Queues)
			if i > 0 {
				require.NotNil(t, q.Core, "queue %d's core is described", i)
			}
		}
		t.Logf("%s: RSS over 4 queues: %v", what, counts)
		return counts
	}

	sink := start("sink: receiving and dropping frames", "sink", "-queues", "4", "-count", strconv.Itoa(frames), "-duration", "60s",
		"-progress", "0", "-json", cliIGB)
	code, out, errw = runCLI(append([]string{"pktgen", cliIGB2, "-queues", "4", "-count", strconv.Itoa(frames), "-rate", "2000",
		"-progress", "0", "-json", "-dst-mac", in.MAC}, flows...)...)
	require.Zero(t, code, errw)
	require.Contains(t, errw, "4 queues, each polling in adaptive mode")
	gen := summary("pktgen", out)
	require.EqualValues(t, frames, gen.Tx.Frames)
	for i, q := range gen.Queues {
		require.EqualValues(t, frames/4, q.Tx.Frames, "queue %d sent its quarter", i)
	}
	require.NotNil(t, gen.Hardware, "the 82576's statistics registers: %s", gen.HardwareNote)
	require.EqualValues(t, frames, gen.Hardware.TxGood, "the MAC counted every frame sent (GPTC)")
	require.EqualValues(t, frames*(64+4), gen.Hardware.TxGoodBytes, "64-byte frames and their FCS (GOTC)")
	err, ended := sink.wait(40 * time.Second)
	require.True(t, ended, "sink still running:\n%s", sink.output())
	require.NoError(t, err, sink.output())
	sum := summary("sink", sink.output())
	require.Equal(t, 4, sum.Device.QueuePairs)
	require.EqualValues(t, frames, sum.Details["received"], "every frame pktgen sent")
	counts := perQueue("sink", sum)
	require.NotNil(t, sum.Hardware, sum.HardwareNote)
	require.GreaterOrEqual(t, sum.Hardware.RxGood, uint64(frames), "the MAC counted every frame (GPRC)")
	require.Zero(t, sum.Hardware.Missed, "none missed at 2000 frames/s")
	require.Contains(t, sink.output(), "sink: hardware counters: rx good ")
	for _, l := range strings.Split(errw+sink.output(), "\n") {
		if strings.Contains(l, "hardware counters") || strings.Contains(l, ": queue ") {
			t.Log(l)
		}
	}
	per := sum.Details["queues"].([]any)
	for i, q := range per {
		require.EqualValues(t, counts[i], q.(map[string]any)["received"], "the command's and the driver's count agree")
	}

	// capture: the frames of all queues in one pcap.
	file := filepath.Join(t.TempDir(), "rss.pcap")
	capt := start("capture: writing frames to", "capture", "-queues", "4", "-c", strconv.Itoa(frames), "-duration", "60s",
		"-progress", "0", "-json", "-w", file, cliIGB)
	code, _, errw = runCLI(append([]string{"pktgen", cliIGB2, "-count", strconv.Itoa(frames), "-rate", "2000", "-progress", "0",
		"-dst-mac", in.MAC}, flows...)...)
	require.Zero(t, code, errw)
	err, ended = capt.wait(40 * time.Second)
	require.True(t, ended, "capture still running:\n%s", capt.output())
	require.NoError(t, err, capt.output())
	sum = summary("capture", capt.output())
	require.EqualValues(t, frames, sum.Details["written"])
	perQueue("capture", sum)
	f, err := os.Open(file)
	require.NoError(t, err)
	defer f.Close()
	r, err := pcapgo.NewReader(f)
	require.NoError(t, err)
	seqs := map[uint64]bool{}
	for {
		data, _, err := r.ReadPacketData()
		if err != nil {
			break
		}
		require.GreaterOrEqual(t, len(data), 14+20+8+8, "a pktgen frame")
		seqs[binary.BigEndian.Uint64(data[42:])] = true
	}
	require.Len(t, seqs, frames, "each frame once in the one pcap")

	// echo answers on the queue each flow arrives on.
	echo := start("(ready)", "echo", "-queues", "4", "-ip", "10.2.0.1", "-udp-ports", "7", "-progress", "0", "-json", cliIGB)
	code, _, errw = runCLI(append([]string{"pktgen", cliIGB2, "-count", strconv.Itoa(frames), "-rate", "2000", "-progress", "0",
		"-dst-mac", in.MAC}, flows...)...)
	require.Zero(t, code, errw)
	time.Sleep(500 * time.Millisecond) // the last answers
	require.NoError(t, echo.cmd.Process.Signal(syscall.SIGINT))
	err, ended = echo.wait(20 * time.Second)
	require.True(t, ended, "echo still running:\n%s", echo.output())
	require.NoError(t, err, echo.output())
	sum = summary("echo", echo.output())
	require.EqualValues(t, frames, sum.Details["answered_udp"], "each datagram answered")
	perQueue("echo", sum)
	for i, q := range sum.Queues {
		require.Equal(t, q.Rx.Frames, q.Tx.Frames, "queue %d answers on its own transmit queue", i)
	}
}

// TestGuestCLIFwd: 'fwd -forward macswap' between the host's NIC and the
// 82576's partner carries the host's stream across to the 82576, where
// capture finds each frame byte for byte, MACs swapped; frames longer
// than the partner sends are dropped and counted.
func TestGuestCLIFwd(t *testing.T) {
	if !qemu.InGuest() {
		t.Skip("needs VFIO: runs inside the guest booted by TestVMTools")
	}
	fwd := startVfnic(t, "fwd", "-forward", "macswap", "-progress", "0", cliNIC, cliIGBPeer)
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(fwd.output(), "fwd: macswap forwarding between "+cliNIC+" and "+cliIGBPeer) {
		require.True(t, time.Now().Before(deadline), "fwd did not start:\n%s", fwd.output())
		time.Sleep(50 * time.Millisecond)
	}
	file := filepath.Join(t.TempDir(), "fwd.pcap")
	code, _, errw := runCLI("capture", cliIGB, "-w", file, "-c", "30", "-duration", "60s", "-progress", "0")
	require.Zero(t, code, errw)
	require.NoError(t, fwd.cmd.Process.Signal(syscall.SIGINT))
	err, ended := fwd.wait(20 * time.Second)
	require.True(t, ended, "fwd still running:\n%s", fwd.output())
	require.NoError(t, err, fwd.output())
	t.Log(fwd.output())
	require.Contains(t, fwd.output(), "fwd: "+cliIGBPeer+" rx ")
	f, err := os.Open(file)
	require.NoError(t, err)
	defer f.Close()
	r, err := pcapgo.NewReader(f)
	require.NoError(t, err)
	n, exact := 0, 0
	for {
		data, _, err := r.ReadPacketData()
		if err != nil {
			break
		}
		// Swap the MACs back: the host's frame, whole.
		b := append([]byte(nil), data...)
		var m [6]byte
		copy(m[:], b[0:6])
		copy(b[0:6], b[6:12])
		copy(b[6:12], m[:])
		seq, ok := wireSeq(b)
		require.True(t, ok, "frame %d (%d bytes) is the host's, MACs swapped", n, len(data))
		n++
		switch wireCycle[seq%len(wireCycle)].kind {
		case wireVLAN, wireQinQ, wireUDP4VLAN:
			continue // the 82576 may strip the tag it receives
		}
		want := wireFrame(seq)
		if len(want) < 60 {
			want = append(want, make([]byte, 60-len(want))...) // QEMU's 82576 pads runts
		}
		require.Equal(t, want, b, "frame %d (seq %d) byte for byte", n, seq)
		exact++
	}
	require.Equal(t, 30, n)
	require.GreaterOrEqual(t, exact, 10, "untagged frames compared byte for byte")
	require.Regexp(t, `dropped [1-9]\d*`, fwd.output(), "jumbo frames dropped at the partner, counted")
}
