package virtiovm

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/nic/virtio"
	"github.com/vfnic/vfnic/tests/conformance"
	"github.com/vfnic/vfnic/tests/nicpair"
)

// TestGuestConformancePacked runs the fi_cq conformance suite on CQs fed
// by QEMU's virtio-net queues (packed rings), through nicpair: a send is a
// frame on the wire, its completion a used descriptor, and its MSI-X
// interrupt what wakes SRead. Behaviours a virtio device cannot produce
// are gated off through Caps, with the reason (see virtioCaps).
func TestGuestConformancePacked(t *testing.T) { guestOnly(t); nicpair.Run(t, newVirtioProvider(false)) }

// TestGuestConformanceSplit is TestGuestConformancePacked on split rings
// (the same NICs, opened with virtio.Config.Split).
func TestGuestConformanceSplit(t *testing.T) { guestOnly(t); nicpair.Run(t, newVirtioProvider(true)) }

// MaxInFlight: a virtio transmit descriptor is free again only once its
// completion is read, and QEMU's transmit rings hold 256 descriptors.
const confTxRing = 256

// virtioCaps are the capabilities of CQs on virtio queues, and why the
// missing ones are missing.
func virtioCaps() conformance.Caps {
	return conformance.Caps{
		// A CQ allocates nothing by its size: it reads the used rings of
		// the queues bound to it.
		MaxSize:      65536,
		FrameHeader:  nicpair.EthHdr,
		MaxEndpoints: len(confHubs),
		MaxInFlight:  confTxRing,
		NoFailNext:   true,
		Why: map[string]string{
			"RemoteData": "a virtio-net used descriptor reports only a buffer id and a length: there is no out-of-band data",
			"Tagged":     "no tag matching: the device fills receive buffers in posting order",
			"MultiRecv":  "a virtio receive buffer holds at most one frame; the device never packs several into one",
			"Source":     "raw Ethernet has no fabric address vector (the source MAC is in the frame)",
			"Overrun": "impossible by design: a virtio CQ is a view over the bound queues' used rings, which " +
				"hold exactly the buffers the driver posted, so the device has nowhere to write an excess " +
				"entry; a device writing one anyway is a bad id or index, which nic/virtio's misbehaving-" +
				"device tests cover",
			"Truncation": "fi_cq's ETRUNC with Len and OLen needs a buffer shorter than a frame, and virtio receive " +
				"buffers hold a whole MTU frame; a longer frame spans several buffers (MRG_RXBUF), each an " +
				"ETRUNC error completion: DeviceErrors runs that on the device",
			"FailNext": "virtio transmit completions carry no status, so a send cannot be made to fail; " +
				"DeviceErrors covers the device's own error condition (a frame longer than the buffer)",
			"Faults": "QEMU's device cannot be made to misbehave; nic/virtio's misbehaving-device tests inject " +
				"bad ids, lengths, phases and indexes into real rings",
		},
	}
}

// newVirtioProvider is the conformance provider over the NIC pairs of
// confHubs, opened with packed or split rings.
func newVirtioProvider(split bool) *nicpair.Provider {
	name := "virtio (packed rings)"
	if split {
		name = "virtio (split rings)"
	}
	pairs := make([][2]string, len(confHubs))
	for i, h := range confHubs {
		pairs[i] = [2]string{addrOf(h.slotA), addrOf(h.slotB)}
	}
	return nicpair.New(nicpair.Driver{
		Name:  name,
		Caps:  virtioCaps(),
		Pairs: pairs,
		Open: func(ctx context.Context, addr string, size int, _ bool) (nic.Device, error) {
			return virtio.Open(ctx, addr, virtio.Config{Split: split, Config: nic.Config{QueueSize: size}})
		},
		Depth:    func(asked int) int { return min(asked, confTxRing) },
		TxRing:   confTxRing,
		Oversize: oversize,
	})
}

// oversize is the virtio side of RecvOversize: the host protocol's
// request, and the buffers the frame fills. With MRG_RXBUF the device
// spreads a long frame over several buffers; the first holds the virtio-net
// header and MaxFrame bytes of the frame, the others BufferSize bytes each.
func oversize(e *nicpair.Endpoint, size int) ([]byte, int, func([]byte) bool, error) {
	info := e.B().Info()
	if !slices.Contains(info.Features, "MRG_RXBUF") {
		// Without it QEMU drops a frame longer than a buffer, silently.
		return nil, 0, nil, fmt.Errorf("virtio provider: %w: %s did not negotiate MRG_RXBUF", cq.ErrNotSupported, info.Address)
	}
	maxFrame := e.BRx().MaxFrame()
	nbufs := 1 + (size-maxFrame+info.BufferSize-1)/info.BufferSize
	nonce := rand.Uint32() | 1
	req := build(hostMAC, e.B().MAC(), msg{typ: msgOversizeReq, session: nonce, seq: uint32(size),
		args: macArgs(e.B().MAC(), e.A().MAC())}, minFrame)
	answer := func(f []byte) bool {
		m, ok := peek(f)
		return ok && m.typ == msgOversizeDone && m.session == nonce
	}
	return req, nbufs, answer, nil
}
