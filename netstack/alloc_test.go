package netstack

import (
	"testing"

	"github.com/stretchr/testify/require"
	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/nic/softnic"
)

// countingDispatcher stands in for the stack: it counts what the
// endpoint delivers.
type countingDispatcher struct{ n, bytes int }

func (d *countingDispatcher) DeliverNetworkPacket(_ tcpip.NetworkProtocolNumber, pkt *stack.PacketBuffer) {
	d.n++
	d.bytes += pkt.Size()
}

func (d *countingDispatcher) DeliverLinkPacket(tcpip.NetworkProtocolNumber, *stack.PacketBuffer) {}

// TestNoAllocsPerFrame: the endpoint's receive path (copy into a pooled
// view, repost, deliver) and transmit path (gather, Send, Flush, reap)
// allocate nothing per frame; gVisor's buffer and packet pools are reused.
func TestNoAllocsPerFrame(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items at random under the race detector")
	}
	for _, offload := range []bool{false, true} {
		t.Run(map[bool]string{false: "no offloads", true: "checksum offloads"}[offload], func(t *testing.T) {
			testNoAllocsPerFrame(t, offload)
		})
	}
}

func testNoAllocsPerFrame(t *testing.T, offload bool) {
	devA, devB, err := softnic.Pair(nic.Config{QueueSize: 64})
	require.NoError(t, err)
	defer devA.Close()
	defer devB.Close()
	var dev nic.Device = devA
	if offload {
		dev = newCsumDevice(t, devA)
	}
	e, err := newEndpoint(dev, 0, false, false, false, false)
	require.NoError(t, err)
	require.Equal(t, offload, e.rxOffload && e.txOffload)
	d := &countingDispatcher{}
	e.Attach(d)
	rx := e.rx[0].q
	require.NoError(t, fill(rx))
	peerTx, _ := devB.Tx(0)
	peerRx, _ := devB.Rx(0)
	require.NoError(t, fill(peerRx))

	// A whole IPv4 UDP datagram, which the offloads act on.
	frame := make([]byte, 1000)
	header.Ethernet(frame).Encode(&header.EthernetFields{SrcAddr: tcpip.LinkAddress(devB.MAC()), DstAddr: e.mac, Type: ipv4.ProtocolNumber})
	ipudp := frame[header.EthernetMinimumSize:]
	header.IPv4(ipudp).Encode(&header.IPv4Fields{TotalLength: uint16(len(ipudp)), TTL: 64, Protocol: uint8(header.UDPProtocolNumber),
		SrcAddr: tcpip.AddrFrom4([4]byte{10, 9, 0, 2}), DstAddr: tcpip.AddrFrom4([4]byte{10, 9, 0, 1})})
	header.UDP(ipudp[20:]).Encode(&header.UDPFields{SrcPort: 9, DstPort: 9, Length: uint16(len(ipudp) - 20)})
	require.True(t, needsL4Checksum(frame))
	comps := make([]nic.Completion, 8)
	recv := func() {
		require.NoError(t, peerTx.Send(frame, nil))
		require.NoError(t, peerTx.Flush())
		peerTx.Poll(comps)
		n := rx.Poll(comps)
		if err := e.rx[0].handle(rx, comps[:n]); err != nil {
			t.Fatal(err)
		}
		require.NoError(t, rx.Flush())
	}
	recv() // warm the pools (AllocsPerRun runs once more before counting)
	allocs := testing.AllocsPerRun(1000, recv)
	require.Zero(t, allocs, "receive path allocations per frame")
	require.Equal(t, 1002, d.n)
	require.Equal(t, 1002*len(frame), d.bytes, "whole frames, link header included")

	// Transmit: one packet with a link header and a payload in two views.
	pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{
		ReserveHeaderBytes: header.EthernetMinimumSize + 20,
		Payload:            buffer.MakeWithData(append([]byte(nil), ipudp[20:]...)),
	})
	defer pkt.DecRef()
	copy(pkt.NetworkHeader().Push(20), ipudp[:20])
	pkt.NetworkProtocolNumber = ipv4.ProtocolNumber
	pkt.EgressRoute.LocalLinkAddress = e.mac
	pkt.EgressRoute.RemoteLinkAddress = tcpip.LinkAddress(devB.MAC())
	e.AddHeader(pkt)
	var list stack.PacketBufferList
	list.PushBack(pkt)
	sent := 0
	// sendWith writes the packet with write and takes it at the peer.
	sendWith := func(write func() tcpip.Error) func() {
		return func() {
			if terr := write(); terr != nil {
				t.Fatalf("write: %v", terr)
			}
			k := peerRx.Poll(comps)
			for _, c := range comps[:k] {
				if c.Err == nil && c.Len == pkt.Size() {
					sent++
				}
				require.NoError(t, peerRx.Repost(c.Buf, nil))
			}
			require.NoError(t, peerRx.Flush())
		}
	}
	send := sendWith(func() tcpip.Error {
		n, terr := e.WritePackets(list)
		if terr == nil && n != 1 {
			t.Fatalf("WritePackets wrote %d", n)
		}
		return terr
	})
	send()
	allocs = testing.AllocsPerRun(1000, send)
	require.Zero(t, allocs, "transmit path allocations per frame")
	require.Equal(t, 1002, sent)
	// The same packet queued for the polling core (Config.CoreTransmit),
	// which writes it in its round.
	tq := &e.tx[0]
	tq.qlen = DefaultQueueLen
	qd := coreQDisc{e}
	send = sendWith(func() tcpip.Error {
		if terr := qd.WritePacket(pkt); terr != nil {
			return terr
		}
		if n, err := e.drain(tq); n != 1 || err != nil {
			t.Fatalf("drain: %d, %v", n, err)
		}
		return nil
	})
	send()
	allocs = testing.AllocsPerRun(1000, send)
	require.Zero(t, allocs, "core transmit allocations per frame")
	require.Equal(t, 2004, sent)
	if offload {
		require.EqualValues(t, 2004, e.txCsumDevice.Load(), "frames the device checksummed")
		require.EqualValues(t, 1002, e.rxCsumDevice.Load(), "frames delivered with the device's verdict")
	}
}
