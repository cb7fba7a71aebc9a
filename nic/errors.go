package nic

import (
	"errors"
	"fmt"
	"os"

	"github.com/vfnic/vfnic/cq"
)

// Errors of opening and using a device.
var (
	// ErrNoDriver means no registered driver handles the device.
	ErrNoDriver = errors.New("nic: no driver for device")
	// ErrNotSupported means the device lacks something the driver needs
	// (a feature, enough interrupt vectors, a modern interface).
	// It is cq.ErrNotSupported: one sentinel for both layers.
	ErrNotSupported = cq.ErrNotSupported
	// ErrInvalid means an argument or a Config field is out of range. It
	// is cq.ErrInvalid.
	ErrInvalid = cq.ErrInvalid
	// ErrClosed means the device or queue was closed. It is os.ErrClosed
	// (as cq.ErrClosed is).
	ErrClosed = os.ErrClosed
	// ErrRemoved means the kernel took the device back (its driver was
	// unbound through sysfs, or the device is being removed) and the
	// driver closed it. Errors carrying it also wrap ErrClosed.
	ErrRemoved = errors.New("nic: device taken back by the kernel (unbind or removal)")
	// ErrFull means the queue has no free descriptor or buffer: read
	// completions (and Release receive buffers), then retry.
	ErrFull = errors.New("nic: queue full")
	// ErrFrameSize means a frame is shorter than an Ethernet header or
	// longer than the device's MTU allows.
	ErrFrameSize = errors.New("nic: bad frame size")
	// ErrBadBuffer means a buffer handed back (Release, Repost) is not one
	// the queue gave out, or was handed back twice.
	ErrBadBuffer = errors.New("nic: bad buffer")
	// ErrTimeout means a blocking read's timeout passed with nothing to
	// read. It is os.ErrDeadlineExceeded, as for Go's own deadlines.
	ErrTimeout = os.ErrDeadlineExceeded
	// ErrBound means a queue bound to a completion queue (BindCQ) was read
	// directly: its completions go to the CQ, read them there. It matches
	// ErrInvalid.
	ErrBound = fmt.Errorf("%w: queue feeds a completion queue (BindCQ): read it there", ErrInvalid)
	// ErrDeviceFailed means the device stopped working: it did not reset,
	// refused the negotiated features, or flagged DEVICE_NEEDS_RESET.
	ErrDeviceFailed = errors.New("nic: device failed")
)

// Errors carried by error completions (Completion.Err). An entry that
// the ring reader refused (the device wrote something the driver never
// posted) carries an error matching its cq.Prov* code, the one vocabulary
// of refusals for this API and a CQ's cq.ErrEntry.ProvErrno:
// errors.Is(c.Err, cq.ProvBadID) for an id that is not outstanding,
// cq.ProvBadLen for a length beyond the posted buffer or too short for the
// headers, cq.ProvBadOp for another kind of operation than the one
// posted, cq.ProvBadPhase for ownership bits the device may never write,
// cq.ProvBadIndex for a completion index beyond the posted buffers (the
// queue is unusable afterwards: reads return nothing and other operations
// ErrBroken), cq.ProvMultiBuffer for each buffer of a received frame
// that spans several (which the drivers do not reassemble; see
// MultiBufferError). The entry is consumed and the driver's state stays
// consistent.
var (
	// ErrCanceled means the operation was still outstanding when the
	// kernel took the device back (ErrRemoved): it never completed, and
	// the completion carries only its Context (libfabric's FI_ECANCELED).
	ErrCanceled = errors.New("nic: operation canceled: the device was taken back")
	// ErrBroken is returned by the operations of a queue whose device
	// reported an impossible completion index (cq.ProvBadIndex); only closing
	// (and so resetting) the device recovers.
	ErrBroken = errors.New("nic: queue broken by a misbehaving device")
)

// MultiBufferError is the Err of each receive completion of a frame that
// spans several receive buffers, one completion per buffer: the frame was
// longer than a buffer holds. errors.Is(err, cq.ProvMultiBuffer) is true. The
// fields let a caller count such frames and say how long they were (the
// sum of Bytes over Buffers completions).
type MultiBufferError struct {
	// Queue is the driver's name for the queue ("rx0").
	Queue string
	// Buffer is this buffer's place in the frame, 0 for the first.
	Buffer int
	// Buffers is how many buffers the frame spans, as the device said in
	// the first one.
	Buffers int
	// Bytes is how many bytes of the frame this buffer holds (without
	// driver headers).
	Bytes int
}

// Error implements error.
func (e *MultiBufferError) Error() string {
	return fmt.Sprintf("%v: %s: buffer %d of %d (%d bytes)", cq.ProvMultiBuffer, e.Queue, e.Buffer+1, e.Buffers, e.Bytes)
}

// Is makes errors.Is(err, cq.ProvMultiBuffer) true.
func (e *MultiBufferError) Is(target error) bool { return target == error(cq.ProvMultiBuffer) }

// ErrDeviceStatus is the Err of a completion whose device status reports
// an error of the device's own (cq.ErrEntry.ProvErrno holds the status).
var ErrDeviceStatus = errors.New("nic: the device reported an error status")

// ErrRemovedClosed is what a driver's queues return once the kernel took
// the device back: it matches both ErrClosed and ErrRemoved.
var ErrRemovedClosed = fmt.Errorf("%w: %w", ErrClosed, ErrRemoved)
