package softnic_test

import (
	"context"
	"fmt"
	"math/bits"
	"testing"

	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/nic/softnic"
	"github.com/vfnic/vfnic/tests/conformance"
	"github.com/vfnic/vfnic/tests/nicpair"
)

// confPairs is how many wires the conformance provider opens endpoints on.
const (
	confPairs  = 4
	confTxRing = 256
)

// TestConformance runs the fi_cq conformance suite on CQs fed by the
// software NICs' queues, through nicpair as for the drivers in guests:
// each endpoint is the transmit queue of end 0 and the receive queue of
// end 1 of a wire, opened by name with nic.Open, bound to the CQ with
// BindCQ. A send is a frame on the wire, its completion an entry in a
// completion ring read by cq/ring, its interrupt what wakes SRead.
func TestConformance(t *testing.T) {
	pairs := make([][2]string, confPairs)
	for i := range pairs {
		pairs[i] = [2]string{fmt.Sprintf("softnic:conf%d/0", i), fmt.Sprintf("softnic:conf%d/1", i)}
	}
	nicpair.Run(t, nicpair.New(nicpair.Driver{
		Name:  "softnic",
		Caps:  softnicCaps(),
		Pairs: pairs,
		Open: func(ctx context.Context, addr string, size int, _ bool) (nic.Device, error) {
			return nic.Open(ctx, addr, nic.Config{QueueSize: size})
		},
		Depth:    func(asked int) int { return max(8, 1<<bits.Len(uint(min(asked, confTxRing)-1))) },
		TxRing:   confTxRing,
		Oversize: oversize,
	}))
}

// softnicCaps are the capabilities of CQs on the software NICs' queues,
// and why the missing ones are missing.
func softnicCaps() conformance.Caps {
	return conformance.Caps{
		MaxSize:      65536,
		FrameHeader:  nicpair.EthHdr,
		MaxEndpoints: confPairs,
		MaxInFlight:  confTxRing,
		NoFailNext:   true,
		Why: map[string]string{
			"RemoteData": "an Ethernet NIC's completion carries length and status: there is no out-of-band data",
			"Tagged":     "no tag matching: receive buffers are filled in posting order",
			"MultiRecv":  "a receive buffer takes one frame (or part of one)",
			"Source":     "raw Ethernet has no fabric address vector (the source MAC is in the frame)",
			"Overrun": "impossible by design: a queue's completion ring holds twice the operations it can " +
				"have outstanding, so the device never overwrites an unread entry",
			"Truncation": "a frame longer than a buffer fills several, each an ETRUNC error completion " +
				"(cq.ProvMultiBuffer): DeviceErrors runs that",
			"FailNext": "the wire has no per-operation error status; DeviceErrors covers the device's own " +
				"error condition (a frame longer than the buffer)",
			"Faults": "the ring faults are the software NIC's own (Device.InjectRing), tested in its package",
		},
	}
}

// oversize hands B a frame size bytes long from the wire (Receive), then
// gives RecvOversize a frame for B to send A as the answer: B has the long
// frame before the answer reaches A.
func oversize(e *nicpair.Endpoint, size int) ([]byte, int, func([]byte) bool, error) {
	b := e.B().(*softnic.Device)
	long := frame(b.MAC(), e.A().MAC(), size, size)
	ok, err := b.Receive(0, long)
	if err == nil && !ok {
		err = fmt.Errorf("softnic: too few receive buffers posted for a %d-byte frame", size)
	}
	if err != nil {
		return nil, 0, nil, err
	}
	maxFrame := e.BRx().MaxFrame()
	answer := frame(e.A().MAC(), b.MAC(), size, 60)
	return answer, (size + maxFrame - 1) / maxFrame, func(f []byte) bool { return string(f) == string(answer) }, nil
}
