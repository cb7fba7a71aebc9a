package afxdp

import (
	"context"
	"testing"

	vt "github.com/vfnic/vfnic/internal/vethtest"
	"github.com/vfnic/vfnic/internal/vethtest/vethconf"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/tests/conformance"
)

// TestConformance runs the fi_cq conformance suite on CQs fed by afxdp
// queues on veth pairs (vethconf): a send's completion is the kernel's
// completion ring entry, and the socket's readiness what wakes SRead.
// Behaviours AF_XDP cannot produce are gated off through Caps.
func TestConformance(t *testing.T) {
	vethconf.Conformance(t, "afxdp", func(ctx context.Context, ifname string, cfg nic.Config) (nic.Device, error) {
		return Open(ctx, ifname, cfg)
	}, conformance.Caps{
		MaxSize:    65536,
		NoFailNext: true,
		Why: map[string]string{
			"RemoteData": "an AF_XDP descriptor carries an address, a length and options: no out-of-band data",
			"Tagged":     "no tag matching: the kernel fills the buffers of the fill ring in order",
			"MultiRecv":  "an AF_XDP receive takes one UMEM chunk for one frame",
			"Source":     "raw Ethernet has no fabric address vector (the source MAC is in the frame)",
			"Overrun": "impossible by design: the CQ reads the socket's own rings, which hold at most the " +
				"buffers posted, so the kernel has nowhere to write an excess entry",
			"Truncation": "the kernel drops a frame longer than a chunk (no XDP_USE_SG): no entry is written",
			"FailNext":   "an AF_XDP completion carries only the address: a send cannot be made to fail",
			"Faults":     "the kernel cannot be made to misbehave; the fuzz targets write bad entries into fake rings",
			"Oversizer":  "the kernel drops a frame longer than a chunk: the device makes no error completions of its own",
		},
	})
}

// TestVerbs runs the verbs CQ's behaviour tests over an afxdp queue pair
// (vethconf.Verbs), request-notify woken through the socket's readiness
// forwarder.
func TestVerbs(t *testing.T) {
	vethconf.Verbs(t, func(t *testing.T, v *vt.Veth) nic.Device { return openIn(t, v.A, "vfx0", nic.Config{}) })
}
