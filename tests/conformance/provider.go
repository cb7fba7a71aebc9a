// Package conformance is the fi_cq(3) conformance suite, written against a
// Provider so that the software device and every NIC driver run the same
// tests: conformance.Run(t, provider).
package conformance

import (
	"context"
	"fmt"

	"github.com/vfnic/vfnic/cq"
)

// Caps say what a provider's device can produce; tests of a missing
// capability are skipped.
type Caps struct {
	// MaxSize is the largest CQ size.
	MaxSize int
	// RemoteData: sends can carry remote CQ data to the receiver.
	RemoteData bool
	// Tagged: sends can carry a tag to the receiver.
	Tagged bool
	// MultiRecv: receive buffers can be posted as multi-receive buffers.
	MultiRecv bool
	// Source: endpoints can report the source address of receives.
	Source bool
	// Overrun: the device can overrun a CQ whose reader falls behind (its
	// queues can hold more operations than the CQ entries).
	Overrun bool
	// Truncation: a frame longer than the receive buffer completes with
	// an ETRUNC error.
	Truncation bool
}

// EndpointAttr configure an endpoint.
type EndpointAttr struct {
	// Source asks for source addresses on receive completions.
	Source bool
	// SendDepth and RecvDepth are queue depths; 0 lets the provider pick.
	SendDepth, RecvDepth int
}

// SendOpts are what a send carries to the receiver.
type SendOpts struct {
	Data    uint64 // remote CQ data, with HasData
	HasData bool   // carry Data
	Tag     uint64 // tag, with Tagged
	Tagged  bool   // carry Tag
}

// RecvOpts configure a posted receive.
type RecvOpts struct {
	// MultiRecv posts a multi-receive buffer.
	MultiRecv bool
	// MinFree releases a multi-receive buffer when less remains.
	MinFree int
}

// Provider opens CQs on a device and endpoints bound to them.
type Provider interface {
	// Name names the provider in test output.
	Name() string
	// Caps reports the device's capabilities.
	Caps() Caps
	// OpenCQ opens a completion queue.
	OpenCQ(attr cq.Attr) (*cq.CQ, error)
	// NewEndpoint creates an endpoint whose send and receive completions
	// go to c, bound to it.
	NewEndpoint(c *cq.CQ, attr EndpointAttr) (Endpoint, error)
}

// Endpoint is a device queue pair bound to a CQ.
type Endpoint interface {
	// Addr is the endpoint's address, the source address its sends have.
	Addr() cq.Addr
	// Send sends payload to the endpoint itself (loopback); the send
	// completes with ctx and the frame fills a posted receive, if any.
	Send(ctx any, payload []byte, o SendOpts) error
	// PostRecv posts a receive buffer of size bytes in device memory and
	// returns it; its completion carries ctx.
	PostRecv(ctx any, size int, o RecvOpts) ([]byte, error)
	// FailNext makes the device complete the next operation on the
	// endpoint's CQ with an error status.
	FailNext() error
	// Flush waits until the device has written the completions of every
	// operation posted so far.
	Flush(ctx context.Context) error
	// Close unbinds the endpoint from its CQ.
	Close() error
}

// Fault is a device misbehaviour a provider may inject.
type Fault int

// Faults, as in nic/sim.
const (
	FaultBadID Fault = iota + 1
	FaultDuplicateID
	FaultBadLen
	FaultBadStatus
	FaultBadOpcode
	FaultWrongPhase
	FaultOverrun
	FaultLostIRQ
	FaultSpuriousIRQ
)

// String names the fault.
func (f Fault) String() string {
	names := [...]string{"", "BadID", "DuplicateID", "BadLen", "BadStatus", "BadOpcode",
		"WrongPhase", "Overrun", "LostIRQ", "SpuriousIRQ"}
	if f > 0 && int(f) < len(names) {
		return names[f]
	}
	return fmt.Sprintf("Fault(%d)", int(f))
}

// Injector is implemented by providers that can inject faults (the
// software device); the fault tests are skipped for the others.
type Injector interface {
	Inject(c *cq.CQ, f Fault) error
}
