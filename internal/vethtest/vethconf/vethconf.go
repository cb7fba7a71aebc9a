// Package vethconf runs the fi_cq conformance suite and the verbs CQ's
// tests on a host device driver (nic/afxdp, nic/afpacket) over veth pairs
// in network namespaces of their own (vethtest), for the drivers' tests.
package vethconf

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

// TxRing is the transmit ring of the conformance endpoints: a send's slot
// is free again once its completion is read.
const TxRing = 256

// Open opens interface ifname with cfg in the calling thread's namespace.
type Open func(ctx context.Context, ifname string, cfg nic.Config) (nic.Device, error)

// Conformance runs the fi_cq conformance suite on CQs fed by the queues
// of devices open opens, through nicpair: each endpoint is two devices on
// the two ends of a veth pair (A sends from one namespace, B receives in
// the other), so a send is a frame through the kernel. caps gates off
// what the driver cannot produce; its MaxEndpoints and MaxInFlight are
// set here.
func Conformance(t *testing.T, name string, open Open, caps conformance.Caps) {
	vt.NeedRoot(t)
	var pairs [][2]string
	for range 2 {
		v := vt.New(t, 1)
		pairs = append(pairs, [2]string{v.A + "|vfx0", v.B + "|vfx1"})
	}
	caps.MaxEndpoints, caps.MaxInFlight, caps.FrameHeader = len(pairs), TxRing, nicpair.EthHdr
	nicpair.Run(t, nicpair.New(nicpair.Driver{
		Name:  name + " (veth)",
		Caps:  caps,
		Pairs: pairs,
		Open: func(ctx context.Context, addr string, size int, recv bool) (nic.Device, error) {
			ns, ifname, _ := strings.Cut(addr, "|")
			var d nic.Device
			err := vt.In(ns, func() (err error) {
				d, err = open(ctx, ifname, nic.Config{QueueSize: size})
				return err
			})
			return d, err
		},
		Depth: func(asked int) int {
			n := 8
			for n < asked && n < TxRing {
				n *= 2
			}
			return n
		},
		TxRing: TxRing,
	}))
}

// Verbs runs the verbs CQ's behaviour tests (verbs/nicverbs/
// nicverbstest) over queue pair 0 of dev, open on vfx0 of a veth pair:
// creation limits, the iterator over real transmit completions,
// request-notify with a completion channel, the lost-wake-up loop,
// solicited-only arms, the flush at close. The frame goes to the veth
// peer, where nobody reads it. open opens the device in v's namespace A
// (and closes it when the test ends); every socket is returned after.
func Verbs(t *testing.T, open func(t *testing.T, v *vt.Veth) nic.Device) {
	v := vt.New(t, 1)
	fds0 := SocketFDs(t)
	dev := open(t, v)
	frame := make([]byte, 60)
	for i := range 6 {
		frame[i] = 0xff
	}
	copy(frame[6:], dev.MAC())
	frame[12], frame[13] = vt.TestType>>8, vt.TestType&0xff
	nicverbstest.Run(t, dev, frame, nicverbstest.Rounds(t))
	require.NoError(t, dev.Close())
	require.Equal(t, fds0, SocketFDs(t), "every socket returned")
}

// SocketFDs counts the process's open sockets.
func SocketFDs(t testing.TB) int {
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
