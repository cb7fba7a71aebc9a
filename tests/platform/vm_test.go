package platform

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/qemu"
)

// TestVM boots one guest with the platform topology and runs every
// TestGuest* test in it. Each guest test is reported as a subtest; a guest
// test that fails or skips fails TestVM.
func TestVM(t *testing.T) {
	if qemu.InGuest() {
		t.Skip("host side: boots the guest that runs the TestGuest* tests")
	}
	qemu.RequireVM(t)
	toGuest, err := qemu.NewDgram()
	require.NoError(t, err)
	cfg := qemu.Config{
		NICs: []qemu.NIC{
			// The tests bind these themselves through package pci.
			{Model: qemu.VirtioNet, Packed: true, Slot: 4, Bind: qemu.BindNone, Net: toGuest},
			{Model: qemu.E1000E, Slot: 5, Bind: qemu.BindNone},
			{Model: qemu.VirtioNet, Slot: 6, Bind: qemu.BindLinux, IPv4: linuxNICIP},
		},
		// Two conventional PCI NICs behind a PCIe-to-PCI bridge: one IOMMU
		// group; the kernel's e1000 driver keeps one of them.
		QEMUArgs: []string{
			"-device", fmt.Sprintf("pcie-pci-bridge,id=br1,bus=pcie.0,addr=%#x", bridgeSlot),
			"-device", "e1000,bus=br1,addr=1,mac=52:54:00:aa:00:01",
			"-device", "e1000,bus=br1,addr=2,mac=52:54:00:aa:00:02",
		},
		Modules:   []string{"e1000"},
		Hugepages: 32,
		Timeout:   4 * time.Minute,
	}

	// The guest's virtio test waits for a frame: keep sending one every
	// 100 ms until the guest is done (frames sent before QEMU binds its
	// socket are lost, so there is no single send that could be relied on).
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	sent := make(chan int, 1)
	go func() { sent <- sendFrames(ctx, toGuest) }()

	rep := qemu.RunGoTestT(t, cfg, qemu.GoTest{Package: "github.com/vfnic/vfnic/tests/platform", Run: "^TestGuest"})
	stop()
	n := <-sent
	if rep != nil && rep.Result != nil {
		t.Logf("guest kernel %s, run took %v, host sent %d frames", rep.Result.KernelVersion, rep.Result.Duration.Round(time.Millisecond), n)
	}
}

// sendFrames sends broadcast frames carrying FramePrefix to the guest's NIC
// through its dgram netdev until ctx ends, and returns how many it sent.
func sendFrames(ctx context.Context, nd qemu.Netdev) int {
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: nd.HostPort})
	if err != nil {
		return 0
	}
	defer conn.Close()
	dst := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: nd.QEMUPort}
	n := 0
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		frame, err := testFrame(n)
		if err == nil {
			if _, err := conn.WriteToUDP(frame, dst); err == nil {
				n++
			}
		}
		select {
		case <-ctx.Done():
			return n
		case <-tick.C:
		}
	}
}

// testFrame builds an Ethernet broadcast frame (local experimental
// EtherType 0x88b5) whose payload is FramePrefix and a sequence number.
func testFrame(seq int) ([]byte, error) {
	payload := make([]byte, len(FramePrefix)+4)
	copy(payload, FramePrefix)
	binary.BigEndian.PutUint32(payload[len(FramePrefix):], uint32(seq))
	eth := &layers.Ethernet{
		SrcMAC:       net.HardwareAddr{0x02, 0, 0, 0, 0, 1},
		DstMAC:       layers.EthernetBroadcast,
		EthernetType: layers.EthernetType(0x88b5),
	}
	buf := gopacket.NewSerializeBuffer()
	err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{}, eth, gopacket.Payload(payload))
	return buf.Bytes(), err
}
