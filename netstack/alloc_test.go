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
	devA, devB, err := softnic.Pair(nic.Config{QueueSize: 64})
	require.NoError(t, err)
	defer devA.Close()
	defer devB.Close()
	e, err := newEndpoint(devA, 0)
	require.NoError(t, err)
	d := &countingDispatcher{}
	e.Attach(d)
	rx := e.rx[0].q
	require.NoError(t, fill(rx))
	peerTx, _ := devB.Tx(0)
	peerRx, _ := devB.Rx(0)
	require.NoError(t, fill(peerRx))

	frame := make([]byte, 1000)
	header.Ethernet(frame).Encode(&header.EthernetFields{SrcAddr: tcpip.LinkAddress(devB.MAC()), DstAddr: e.mac, Type: ipv4.ProtocolNumber})
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
		Payload:            buffer.MakeWithData(make([]byte, 900)),
	})
	defer pkt.DecRef()
	copy(pkt.NetworkHeader().Push(20), make([]byte, 20))
	pkt.NetworkProtocolNumber = ipv4.ProtocolNumber
	pkt.EgressRoute.LocalLinkAddress = e.mac
	pkt.EgressRoute.RemoteLinkAddress = tcpip.LinkAddress(devB.MAC())
	e.AddHeader(pkt)
	var list stack.PacketBufferList
	list.PushBack(pkt)
	sent := 0
	send := func() {
		n, terr := e.WritePackets(list)
		if terr != nil || n != 1 {
			t.Fatalf("WritePackets: %d, %v", n, terr)
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
	send()
	allocs = testing.AllocsPerRun(1000, send)
	require.Zero(t, allocs, "transmit path allocations per frame")
	require.Equal(t, 1002, sent)
}
