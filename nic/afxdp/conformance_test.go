package afxdp

import (
	"context"
	"strings"
	"testing"

	vt "github.com/vfnic/vfnic/internal/vethtest"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/tests/conformance"
	"github.com/vfnic/vfnic/tests/nicpair"
)

// confRing is the transmit ring of the conformance endpoints: a send's
// slot is free again once its completion is read.
const confRing = 256

// TestConformance runs the fi_cq conformance suite on CQs fed by afxdp
// queues, through nicpair: each endpoint is two afxdp devices on the two
// ends of a veth pair (A sends from one namespace, B receives in the
// other), so a send is a frame through the kernel, its completion the
// kernel's completion ring entry, and the socket's readiness what wakes
// SRead. Behaviours AF_XDP cannot produce are gated off through Caps.
func TestConformance(t *testing.T) {
	vt.NeedRoot(t)
	var pairs [][2]string
	for range 2 {
		v := vt.New(t, 1)
		pairs = append(pairs, [2]string{v.A + "|vfx0", v.B + "|vfx1"})
	}
	nicpair.Run(t, nicpair.New(nicpair.Driver{
		Name:  "afxdp (veth)",
		Caps:  afxdpCaps(len(pairs)),
		Pairs: pairs,
		Open: func(ctx context.Context, addr string, size int, recv bool) (nic.Device, error) {
			ns, ifname, _ := strings.Cut(addr, "|")
			var d nic.Device
			err := vt.In(ns, func() (err error) {
				d, err = Open(ctx, ifname, nic.Config{QueueSize: size})
				return err
			})
			return d, err
		},
		Depth: func(asked int) int {
			n := 8
			for n < asked && n < confRing {
				n *= 2
			}
			return n
		},
		TxRing: confRing,
	}))
}

// afxdpCaps are the capabilities of CQs on afxdp queues, and why the
// missing ones are missing.
func afxdpCaps(endpoints int) conformance.Caps {
	return conformance.Caps{
		MaxSize:      65536,
		FrameHeader:  nicpair.EthHdr,
		MaxEndpoints: endpoints,
		MaxInFlight:  confRing,
		NoFailNext:   true,
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
	}
}
