package cq

import (
	"errors"
	"os"
	"strconv"
	"syscall"
)

// Sentinel errors returned by the CQ API. Each corresponds to a libfabric
// errno; Errno.Is maps the numbers back to them.
var (
	// ErrAgain means no completion is available (FI_EAGAIN). SRead's
	// timeout and Signal wake-up return errors that match it.
	ErrAgain = errors.New("cq: no completion available")
	// ErrAvail means the entry at the head of the queue is an error
	// completion that ReadErr returns (FI_EAVAIL).
	ErrAvail = errors.New("cq: error completion available")
	// ErrOverrun means the queue was overrun: it is fatal and reports no
	// more completions (FI_EOVERRUN).
	ErrOverrun = errors.New("cq: completion queue overrun")
	// ErrBusy means endpoints are still bound to the CQ (FI_EBUSY).
	ErrBusy = errors.New("cq: endpoints still bound")
	// ErrNoData means the CQ has no wait object to hand out (FI_ENODATA).
	ErrNoData = errors.New("cq: no wait object")
	// ErrClosed means the CQ (or a source of it) is closed. It is
	// os.ErrClosed, the error Go's os and net packages (and cilium/ebpf's
	// ring readers) return for a closed object, so one errors.Is test
	// covers every package of vfnic.
	ErrClosed = os.ErrClosed
	// ErrNotSupported means the operation or attribute is not supported
	// (FI_ENOSYS).
	// It is errors.ErrUnsupported.
	ErrNotSupported = errors.ErrUnsupported
	// ErrInvalid means a bad argument or attribute (FI_EINVAL). It is
	// os.ErrInvalid.
	ErrInvalid = os.ErrInvalid
)

// againError is a distinct error that still matches ErrAgain, so callers
// written against fi_cq_sread's single -FI_EAGAIN keep working while others
// can tell a timeout from a signal. An expired timeout also matches
// os.ErrDeadlineExceeded, as Go's own deadlines do.
type againError struct {
	msg      string
	deadline bool
}

// Error returns the message.
func (e *againError) Error() string { return e.msg }

// Is makes the error match ErrAgain, and a timeout os.ErrDeadlineExceeded.
func (e *againError) Is(target error) bool {
	return target == ErrAgain || (e.deadline && target == os.ErrDeadlineExceeded)
}

// Timeout reports whether the error is an expired timeout (the net.Error
// convention).
func (e *againError) Timeout() bool { return e.deadline }

var (
	// ErrTimeout is returned by SRead when its timeout expires with no
	// completion (fi_cq_sread's -FI_EAGAIN). It matches both ErrAgain and
	// os.ErrDeadlineExceeded.
	ErrTimeout error = &againError{"cq: timeout", true}
	// ErrSignaled is returned by SRead woken by Signal with no completion to
	// return. errors.Is(ErrSignaled, ErrAgain) holds.
	ErrSignaled error = &againError{"cq: signaled", false}
	// ErrNoWait is returned by SRead on a CQ opened without a wait object
	// (WaitNone). errors.Is(ErrNoWait, ErrNotSupported) holds.
	ErrNoWait error = &notSupported{"cq: sread on a CQ without a wait object"}
	// errShortAddrs is preallocated so that ReadFrom's argument check does
	// not allocate.
	errShortAddrs = &invalid{"cq: ReadFrom: fewer source addresses than entries"}
	// errNilContext: blocking calls take a context, never nil.
	errNilContext = &invalid{"cq: nil context"}
)

type notSupported struct{ msg string }

// Error returns the message.
func (e *notSupported) Error() string { return e.msg }

// Is makes the error match ErrNotSupported.
func (e *notSupported) Is(target error) bool { return target == ErrNotSupported }

type invalid struct{ msg string }

// Error returns the message.
func (e *invalid) Error() string { return e.msg }

// Is makes the error match ErrInvalid.
func (e *invalid) Is(target error) bool { return target == ErrInvalid }

// Errno is a positive libfabric error number, the err field of an error
// completion. Values below 256 are POSIX errnos; the others are
// libfabric's own (FI_ERRNO_OFFSET and up). It is an error itself.
type Errno int

// Error numbers used by completions. The values are libfabric's.
const (
	EPERM         Errno = 1
	EIO           Errno = 5
	EAGAIN        Errno = 11
	EACCES        Errno = 13
	EFAULT        Errno = 14
	EBUSY         Errno = 16
	EINVAL        Errno = 22
	ENOSYS        Errno = 38
	ENODATA       Errno = 61
	EMSGSIZE      Errno = 90
	EOPNOTSUPP    Errno = 95
	EADDRNOTAVAIL Errno = 99
	ETIMEDOUT     Errno = 110
	EREMOTEIO     Errno = 121
	ECANCELED     Errno = 125

	EOTHER      Errno = 256 // unspecified error
	ETOOSMALL   Errno = 257 // provided buffer is too small
	EOPBADSTATE Errno = 258 // operation not permitted in current state
	EAVAIL      Errno = 259 // error available
	EBADFLAGS   Errno = 260 // flags not supported
	ENOEQ       Errno = 261 // missing or unavailable event queue
	EDOMAIN     Errno = 262 // invalid resource domain
	ENOCQ       Errno = 263 // missing or unavailable completion queue
	ECRC        Errno = 264 // CRC error
	ETRUNC      Errno = 265 // truncation error
	ENOKEY      Errno = 266 // required key not available
	ENOAV       Errno = 267 // missing or unavailable address vector
	EOVERRUN    Errno = 268 // queue has been overrun
	ENORX       Errno = 269 // receiver not ready
	ENOMR       Errno = 270 // memory registration limit exceeded
)

var fiErrText = [...]string{
	"unspecified error",
	"provided buffer is too small",
	"operation not permitted in current state",
	"error available",
	"flags not supported",
	"missing or unavailable event queue",
	"invalid resource domain",
	"missing or unavailable completion queue",
	"CRC error",
	"truncation error",
	"required key not available",
	"missing or unavailable address vector",
	"queue has been overrun",
	"receiver not ready, no receive buffers available",
	"memory registration limit exceeded",
}

// Error returns the errno's text, as fi_strerror does.
func (e Errno) Error() string {
	switch {
	case e > 0 && e < EOTHER:
		return syscall.Errno(e).Error()
	case e >= EOTHER && int(e-EOTHER) < len(fiErrText):
		return fiErrText[e-EOTHER]
	}
	return "errno " + strconv.Itoa(int(e))
}

// Is lets errors.Is match an Errno against the POSIX syscall.Errno of the
// same number and against this package's sentinel errors.
func (e Errno) Is(target error) bool {
	if se, ok := target.(syscall.Errno); ok {
		return e < EOTHER && int(se) == int(e)
	}
	switch e {
	case EAGAIN:
		return target == ErrAgain
	case EAVAIL:
		return target == ErrAvail
	case EOVERRUN:
		return target == ErrOverrun
	case EBUSY:
		return target == ErrBusy
	case ENODATA:
		return target == ErrNoData
	case ENOSYS, EOPNOTSUPP:
		return target == ErrNotSupported
	case EINVAL:
		return target == ErrInvalid
	}
	return false
}

// ErrnoOf returns the libfabric errno for an error returned by this package
// (for the C-facing and verbs layers); EOTHER when it has none.
func ErrnoOf(err error) Errno {
	var e Errno
	switch {
	case err == nil:
		return 0
	case errors.As(err, &e):
		return e
	case errors.Is(err, ErrAgain):
		return EAGAIN
	case errors.Is(err, ErrAvail):
		return EAVAIL
	case errors.Is(err, ErrOverrun):
		return EOVERRUN
	case errors.Is(err, ErrBusy):
		return EBUSY
	case errors.Is(err, ErrNoData):
		return ENODATA
	case errors.Is(err, ErrNotSupported):
		return ENOSYS
	case errors.Is(err, ErrInvalid):
		return EINVAL
	}
	return EOTHER
}

// ProvErrno is a provider error number (ErrEntry.ProvErrno): the
// device's own status value (0 and up), or one of the Prov* codes (below
// 0) of an entry that the ring reader itself refused. It is an error, and
// the codes are the one vocabulary of refusals for every API over a ring:
// the error a NIC queue's completion carries for a refused entry matches
// its code with errors.Is (errors.Is(c.Err, cq.ProvBadLen)), as
// ErrEntry.ProvErrno equals it.
type ProvErrno int

// Provider error numbers for entries that the ring reader refused.
// Device-reported failures carry the device's own status value instead,
// which is never negative.
const (
	// ProvBadID: the entry names an operation that is not outstanding
	// (never posted, already completed, or a stale generation).
	ProvBadID ProvErrno = -1
	// ProvBadLen: the entry reports more bytes than the posted buffer
	// holds (or, for a NIC, fewer than its headers).
	ProvBadLen ProvErrno = -2
	// ProvBadStatus: the entry's status is not one the device defines.
	ProvBadStatus ProvErrno = -3
	// ProvBadOpcode: the entry's opcode is not one the device defines.
	ProvBadOpcode ProvErrno = -4
	// ProvBadPhase: the entry's ownership bit is wrong while later entries
	// are valid; its contents were not read.
	ProvBadPhase ProvErrno = -5
	// ProvBadQueue: the entry names a queue that is not bound to this ring.
	ProvBadQueue ProvErrno = -6
	// ProvBadIndex: the device published a producer index further ahead
	// than the ring holds, or beyond what the driver handed it (a split
	// virtqueue's used index past its available index); nothing it wrote
	// can be trusted and the queue stops.
	ProvBadIndex ProvErrno = -7
	// ProvMultiBuffer: a received frame spans several buffers, which the
	// queue does not join: each part completes with ETRUNC.
	ProvMultiBuffer ProvErrno = -8
	// ProvBadOp: the entry's opcode is one the device defines, but for
	// another kind of operation than the one posted under its id (a
	// receive reported for a posted send, a send for a posted receive).
	// The operation completes with this error.
	ProvBadOp ProvErrno = -9
)

var provText = map[ProvErrno]string{
	ProvBadID:       "completion for an operation that is not outstanding (bad or stale id)",
	ProvBadLen:      "completion reports more bytes than the posted buffer holds",
	ProvBadStatus:   "completion carries a status the device does not define",
	ProvBadOpcode:   "completion carries an opcode the device does not define",
	ProvBadPhase:    "entry with a wrong ownership (phase) bit skipped unread",
	ProvBadQueue:    "completion names a queue not bound to this ring",
	ProvBadIndex:    "device index beyond the ring or beyond what it was given (queue stopped)",
	ProvMultiBuffer: "frame spans several receive buffers (part dropped)",
	ProvBadOp:       "completion's opcode is for another kind of operation than the one posted",
}

// refusals are the codes as errors, converted once: a code held in a
// variable would allocate when made an error.
var refusals = [...]error{ProvBadID, ProvBadLen, ProvBadStatus, ProvBadOpcode,
	ProvBadPhase, ProvBadQueue, ProvBadIndex, ProvMultiBuffer, ProvBadOp}

// Error returns the refusal's text, or the device status's number.
func (p ProvErrno) Error() string {
	if s, ok := provText[p]; ok {
		return "cq: " + s
	}
	return "cq: provider error " + strconv.Itoa(int(p))
}

// Refusal returns p as an error when it is a refusal code, without
// allocating, and nil for a device status (0 and up), which only the
// driver can name.
func (p ProvErrno) Refusal() error {
	if p < 0 && int(-p) <= len(refusals) {
		return refusals[-p-1]
	}
	return nil
}
