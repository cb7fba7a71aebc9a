package afpacket

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	vt "github.com/vfnic/vfnic/internal/vethtest"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/tests/conformance"
	"github.com/vfnic/vfnic/tests/nicpair"
	"github.com/vfnic/vfnic/verbs/nicverbs/nicverbstest"
)

// confRing is the transmit ring of the conformance endpoints: a send's
// slot is free again once its completion is read.
const confRing = 256

// TestConformance runs the fi_cq conformance suite on CQs fed by afpacket
// queues, through nicpair: each endpoint is two afpacket devices on the
// two ends of a veth pair (A sends from one namespace, B receives in the
// other), so a send is a frame through the kernel, completed when
// sendmmsg took it, and a receive the kernel's TPACKET_V2 slot, the
// socket's readiness what wakes SRead. Behaviours AF_PACKET cannot
// produce are gated off through Caps.
func TestConformance(t *testing.T) {
	vt.NeedRoot(t)
	var pairs [][2]string
	for range 2 {
		v := vt.New(t, 1)
		pairs = append(pairs, [2]string{v.A + "|vfx0", v.B + "|vfx1"})
	}
	nicpair.Run(t, nicpair.New(nicpair.Driver{
		Name:  "afpacket (veth)",
		Caps:  afpacketCaps(len(pairs)),
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

// afpacketCaps are the capabilities of CQs on afpacket queues, and why
// the missing ones are missing.
func afpacketCaps(endpoints int) conformance.Caps {
	return conformance.Caps{
		MaxSize:      65536,
		FrameHeader:  nicpair.EthHdr,
		MaxEndpoints: endpoints,
		MaxInFlight:  confRing,
		NoFailNext:   true,
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
	}
}

// TestVerbs runs the verbs CQ's behaviour tests (verbs/nicverbs/
// nicverbstest) over an afpacket queue pair: creation limits, the
// iterator over real transmit completions, request-notify with a
// completion channel woken when a Flush completes sends, the lost-wake-up
// loop, solicited-only arms, the flush at close. The frame goes to the
// veth peer, where nobody reads it.
func TestVerbs(t *testing.T) {
	v := vt.New(t, 1)
	fds0 := socketFDs(t)
	dev := openIn(t, v.A, "vfx0", nic.Config{})
	frame := make([]byte, 60)
	for i := range 6 {
		frame[i] = 0xff
	}
	copy(frame[6:], dev.MAC())
	frame[12], frame[13] = vt.TestType>>8, vt.TestType&0xff
	nicverbstest.Run(t, dev, frame, nicverbstest.Rounds(t))
	require.Equal(t, fds0, socketFDs(t), "every socket returned")
}

// socketFDs counts the process's open sockets.
func socketFDs(t testing.TB) int {
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(l, "socket:") {
			n++
		}
	}
	return n
}
