package igbvm

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/nic/igb"
	"github.com/vfnic/vfnic/tests/conformance"
	"github.com/vfnic/vfnic/tests/nicpair"
)

// TestGuestConformance runs the fi_cq conformance suite on CQs fed by
// QEMU's igb queues, through nicpair: a send is a frame on the wire, its
// completion a descriptor written back with DD, and its MSI-X interrupt
// what wakes SRead. Behaviours the device cannot produce are gated off
// through Caps, with the reason (see igbCaps).
func TestGuestConformance(t *testing.T) { guestOnly(t); nicpair.Run(t, newIGBProvider()) }

// MaxInFlight: an igb transmit descriptor is free again only once its
// completion is read, and a ring of 256 holds 255 (one stays empty).
const (
	confTxRing  = 256
	maxInFlight = confTxRing - 1
)

// The conformance NICs: two pairs of igb NICs on hubs with a dgram port
// to the host for the frames no vfnic queue sends (longer than a buffer).
// Hub 0 is also the wire of the host tests' NIC (slot 4), which is B of
// the first pair; QEMU's igb takes two slots for its VFs, so there is room
// for no more igb NICs.
var confHubs = []struct{ hub, slotA, slotB int }{{0, 2, slotIGB}, {2, 10, 12}}

func addrOf(slot int) string { return fmt.Sprintf("0000:00:%02x.0", slot) }

// igbCaps are the capabilities of CQs on igb queues, and why the missing
// ones are missing.
func igbCaps() conformance.Caps {
	return conformance.Caps{
		MaxSize:      65536,
		FrameHeader:  nicpair.EthHdr,
		MaxEndpoints: len(confHubs),
		MaxInFlight:  maxInFlight,
		NoFailNext:   true,
		Why: map[string]string{
			"RemoteData": "an igb write-back reports length, status and offload bits: there is no out-of-band data",
			"Tagged":     "no tag matching: the device fills receive buffers in posting order",
			"MultiRecv":  "an igb receive descriptor takes one buffer for at most one frame (or part of one)",
			"Source":     "raw Ethernet has no fabric address vector (the source MAC is in the frame)",
			"Overrun": "impossible by design: the CQ reads the bound queues' descriptor rings, which hold " +
				"exactly the descriptors the driver posted, so the device has nowhere to write an excess " +
				"entry; DD on a descriptor never posted is nic/igb's misbehaving-device test",
			"Truncation": "fi_cq's ETRUNC with Len and OLen needs a buffer shorter than a frame; igb spreads a " +
				"longer frame over several buffers (no EOP on all but the last), each an ETRUNC error " +
				"completion: DeviceErrors runs that on the device",
			"FailNext": "igb transmit write-backs carry only DD, so a send cannot be made to fail; " +
				"DeviceErrors covers the device's own error condition (a frame longer than the buffer)",
			"Faults": "QEMU's device cannot be made to misbehave; nic/igb's misbehaving-device tests write " +
				"bad lengths, holes, DD without EOP and DD on never-posted descriptors into real rings",
		},
	}
}

// newIGBProvider is the conformance provider over the NIC pairs of
// confHubs. B takes long frames (LongFrames): the device spreads a frame
// longer than a buffer over several, no EOP on all but the last.
func newIGBProvider() *nicpair.Provider {
	pairs := make([][2]string, len(confHubs))
	for i, h := range confHubs {
		pairs[i] = [2]string{addrOf(h.slotA), addrOf(h.slotB)}
	}
	return nicpair.New(nicpair.Driver{
		Name:  "igb (QEMU 82576)",
		Caps:  igbCaps(),
		Pairs: pairs,
		Open: func(ctx context.Context, addr string, size int, recv bool) (nic.Device, error) {
			return igb.Open(ctx, addr, igb.Config{LongFrames: recv, Config: nic.Config{QueueSize: size}})
		},
		Depth:    depth,
		TxRing:   confTxRing,
		Reserved: 1,
		PadTo:    60,
		Oversize: oversize,
	})
}

// depth is a ring that holds asked operations: igb rings are powers of
// two with one descriptor always empty.
func depth(asked int) int {
	n := 8
	for n < asked+1 && n < confTxRing {
		n *= 2
	}
	return n
}

// oversize is the igb side of RecvOversize: the host protocol's request,
// and the buffers the frame fills, MaxFrame bytes each.
func oversize(e *nicpair.Endpoint, size int) ([]byte, int, func([]byte) bool, error) {
	maxFrame := e.BRx().MaxFrame()
	nbufs := (size + maxFrame - 1) / maxFrame
	nonce := rand.Uint32() | 1
	req := build(hostMAC, e.B().MAC(), msgOversize, nonce, uint32(size), 60)
	copy(req[hdrLen:], e.A().MAC())
	answer := func(f []byte) bool {
		m, err := parse(f)
		return err == nil && m.typ == msgOversizeDone && m.session == nonce
	}
	return req, nbufs, answer, nil
}
