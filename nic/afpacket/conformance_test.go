package afpacket

import (
	"context"
	"testing"

	vt "github.com/vfnic/vfnic/internal/vethtest"
	"github.com/vfnic/vfnic/internal/vethtest/vethconf"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/tests/conformance"
)

// TestConformance runs the fi_cq conformance suite on CQs fed by afpacket
// queues on veth pairs (vethconf): a send completes when sendmmsg took
// it, a receive is the kernel's TPACKET_V2 slot, and the socket's
// readiness what wakes SRead. Behaviours AF_PACKET cannot produce are
// gated off through Caps.
func TestConformance(t *testing.T) {
	vethconf.Conformance(t, "afpacket", func(ctx context.Context, ifname string, cfg nic.Config) (nic.Device, error) {
		return Open(ctx, ifname, cfg)
	}, conformance.Caps{
		MaxSize:    65536,
		NoFailNext: true,
		Why: map[string]string{
			"RemoteData": "a TPACKET_V2 slot header carries lengths, offsets and a VLAN tag: no out-of-band data",
			"Tagged":     "no tag matching: the kernel fills the slots in ring order",
			"MultiRecv":  "a TPACKET_V2 slot holds one frame",
			"Source":     "raw Ethernet has no fabric address vector (the source MAC is in the frame)",
			"Overrun": "impossible by design: the CQ reads the socket's own ring, which holds at most the " +
				"slots posted, so the kernel has nowhere to write an excess entry",
			"Truncation": "the veth peer cannot send a frame longer than the MTU, which a slot holds",
			"FailNext":   "a send completes when sendmmsg took it: it cannot be made to fail",
			"Faults":     "the kernel cannot be made to misbehave; the fuzz target writes bad slot headers into a fake ring",
			"Oversizer":  "the veth peer sends no frame longer than a slot: the device makes no error completions of its own",
		},
	})
}

// TestVerbs runs the verbs CQ's behaviour tests over an afpacket queue
// pair (vethconf.Verbs), request-notify woken when a Flush completes
// sends.
func TestVerbs(t *testing.T) {
	vethconf.Verbs(t, func(t *testing.T, v *vt.Veth) nic.Device { return openIn(t, v.A, "vfx0", nic.Config{}) })
}
