package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"
	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/qemu"
)

// The CLI's guest topology: one vfio NIC wired to the host, one spare NIC
// for list/bind/unbind.
const (
	cliNIC      = "0000:00:04.0"
	cliSpareNIC = "0000:00:05.0"
	cliFrames   = 200   // frames capture writes
	cliPktgen   = 20000 // frames pktgen sends
	cliMarker   = "VFNIC-CLI-TEST"
)

// TestVMTools runs vfnic's list, unbind, bind, capture and pktgen in a
// guest. The host streams marked frames to the NIC for capture and counts
// what pktgen sends: all of it must arrive, in order and intact.
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
			{Model: qemu.VirtioNet, Packed: true, Slot: 4, Bind: qemu.BindVFIO, Net: nd},
			{Model: qemu.E1000E, Slot: 5, Bind: qemu.BindNone},
			// Two NICs of the guest's Linux on one wire, for the
			// ownership tests (TestGuestCLIOwnership).
			{Model: qemu.VirtioNet, Packed: true, Slot: 6, Bind: qemu.BindLinux, IPv4: ownLinuxIP + "/24", Net: qemu.Hub(0)},
			{Model: qemu.VirtioNet, Packed: true, Slot: 7, Bind: qemu.BindLinux, Net: qemu.Hub(0)},
		},
		Timeout: 3 * time.Minute,
	}
	qemu.RunGoTestT(t, cfg, qemu.GoTest{Package: "github.com/vfnic/vfnic/cmd/vfnic", Run: "^TestGuestCLI"})
	stop()
	wg.Wait()
	_ = conn.SetReadDeadline(time.Now())
	seen := <-got
	t.Logf("host streamed %d frames to the guest; pktgen: host received %d frames, %d in sequence, %d malformed",
		sent, seen.frames, seen.inOrder, seen.bad)
	require.Equal(t, cliPktgen, seen.frames, "every pktgen frame reached the host")
	require.Equal(t, cliPktgen, seen.inOrder, "in order")
	require.Zero(t, seen.bad, "intact")
}

// streamMarked sends numbered frames to the guest every 2 ms until ctx ends.
func streamMarked(ctx context.Context, conn *net.UDPConn, port int) int {
	dst := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port}
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for n := 0; ; n++ {
		if _, err := conn.WriteToUDP(markedFrame(n), dst); err != nil {
			return n
		}
		select {
		case <-ctx.Done():
			return n + 1
		case <-tick.C:
		}
	}
}

func markedFrame(seq int) []byte {
	payload := make([]byte, 100+seq%1000)
	copy(payload, cliMarker)
	binary.BigEndian.PutUint32(payload[len(cliMarker):], uint32(seq))
	for i := len(cliMarker) + 4; i < len(payload); i++ {
		payload[i] = byte(seq + i)
	}
	eth := &layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 9}, DstMAC: layers.EthernetBroadcast, EthernetType: 0x88b5}
	buf := gopacket.NewSerializeBuffer()
	_ = gopacket.SerializeLayers(buf, gopacket.SerializeOptions{}, eth, gopacket.Payload(payload))
	return buf.Bytes()
}

type pktgenSeen struct{ frames, inOrder, bad int }

// countPktgen reads what the guest sends until the socket's deadline:
// pktgen's UDP frames carry a big-endian sequence number after the headers.
func countPktgen(conn *net.UDPConn) pktgenSeen {
	var s pktgenSeen
	buf := make([]byte, 2048)
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
	require.Regexp(t, cliNIC+`\s+1af4:1041\s+virtio-net \(modern\)\s+vfio-pci\s+\d+\s+-\s+bound`, out)
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

func TestGuestCLICapture(t *testing.T) {
	if !qemu.InGuest() {
		t.Skip("needs VFIO: runs inside the guest booted by TestVMTools")
	}
	file := filepath.Join(t.TempDir(), "capture.pcap")
	code, out, errw := runCLI("capture", "-w", file, "-count", strconv.Itoa(cliFrames), "-duration", "60s", "-progress", "0", cliNIC)
	t.Log(out)
	require.Zero(t, code, errw)
	require.Contains(t, out, fmt.Sprintf("written %d", cliFrames))

	f, err := os.Open(file)
	require.NoError(t, err)
	defer f.Close()
	r, err := pcapgo.NewReader(f)
	require.NoError(t, err)
	require.Equal(t, layers.LinkTypeEthernet, r.LinkType())
	var frames, marked int
	last := -1
	for {
		data, ci, err := r.ReadPacketData()
		if err != nil {
			break
		}
		frames++
		require.Equal(t, ci.CaptureLength, len(data))
		i := bytes.Index(data, []byte(cliMarker))
		if i < 0 {
			continue // the kernel's chatter on the wire, if any
		}
		seq := int(binary.BigEndian.Uint32(data[i+len(cliMarker):]))
		require.Equal(t, markedFrame(seq), data, "frame %d intact", seq)
		require.Greater(t, seq, last, "frames in order")
		last = seq
		marked++
	}
	require.Equal(t, cliFrames, frames, "the pcap holds -count frames")
	require.Greater(t, marked, cliFrames*9/10, "nearly all are the host's marked frames")
	t.Logf("pcap: %d frames, %d marked by the host, all intact and in order", frames, marked)
}

func TestGuestCLIPktgen(t *testing.T) {
	if !qemu.InGuest() {
		t.Skip("needs VFIO: runs inside the guest booted by TestVMTools")
	}
	code, out, errw := runCLI("pktgen", "-count", strconv.Itoa(cliPktgen), "-size", "64", "-progress", "0", cliNIC)
	t.Log(out)
	require.Zero(t, code, errw)
	require.Contains(t, out, fmt.Sprintf("tx %d frames", cliPktgen))
	require.Contains(t, out, "errors rx 0 tx 0")
}
