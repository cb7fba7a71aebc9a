// Package conformance is the fi_cq(3) conformance suite, written against a
// Provider so that the software device and every NIC driver run the same
// tests: conformance.Run(t, provider).
package conformance

import (
	"context"

	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/cq/qpsim"
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

	// The fields below describe real devices; their zero values are the
	// software device's behaviour, so providers that predate them run
	// every test as before.

	// FrameHeader is how many bytes the provider's framing puts before a
	// send's payload on the wire (an Ethernet header on a raw NIC): the
	// payload lands that far into the receive buffer, and a receive's Len
	// and Buf cover header and payload.
	FrameHeader int
	// MaxEndpoints is how many endpoints can be open at once (a real NIC
	// has as many as it has queue pairs); 0 means no limit. Tests that
	// want more open fewer endpoints, never fewer CQs.
	MaxEndpoints int
	// MaxInFlight is how many sends of an endpoint can wait for their
	// completions to be read (a device that frees a send's descriptor only
	// when its completion is consumed); 0 means as many as the CQ holds.
	MaxInFlight int
	// NoFailNext says Endpoint.FailNext cannot work: the device has no way
	// to fail an operation on demand. The tests that need it are skipped;
	// DeviceErrors covers errors of the device's own making (Oversizer).
	NoFailNext bool
	// Why explains a missing capability, by the name of its field
	// ("Overrun", "Truncation", "FailNext", ...), or "Faults" for a
	// provider that is no Injector and "Oversizer" for endpoints that are
	// none; skipped tests report it.
	Why map[string]string
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

// Oversizer is implemented by endpoints whose device produces receive
// error completions through its own conditions, not by injection: a frame
// from the wire longer than the posted receive buffer. The DeviceErrors
// test runs the error-completion semantics (order, ReadErr, error data,
// wake-ups) on them.
type Oversizer interface {
	// RecvOversize has a frame longer than a receive buffer arrive at the
	// endpoint from outside (no send of the endpoint's, so no send
	// completion) and returns once the device has it, with the number of
	// posted receives it consumed: each completes, in posting order, with
	// an ETRUNC error. The caller posts enough receives first; a provider
	// needs at most 6.
	RecvOversize(ctx context.Context) (int, error)
}

// Injector is implemented by providers that can inject faults (the
// software device); the fault tests are skipped for the others. The fault
// kinds are the software device's (qpsim.FaultKind), one list for both.
type Injector interface {
	Inject(c *cq.CQ, f qpsim.FaultKind) error
}
