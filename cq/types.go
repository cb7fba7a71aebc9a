package cq

import (
	"fmt"
	"math/bits"

	"github.com/vfnic/vfnic/internal/bitflag"
)

// Flags are completion flags (fi_cq(3) COMPLETION FLAGS). The bit values are
// libfabric's, so they can be compared with a C program's.
type Flags uint64

// Completion flags.
const (
	FlagMsg          Flags = 1 << 1  // FI_MSG: a message operation
	FlagRMA          Flags = 1 << 2  // FI_RMA: an RMA operation
	FlagTagged       Flags = 1 << 3  // FI_TAGGED: a tagged message
	FlagAtomic       Flags = 1 << 4  // FI_ATOMIC: an atomic operation
	FlagMulticast    Flags = 1 << 5  // FI_MULTICAST: a multicast operation
	FlagCollective   Flags = 1 << 6  // FI_COLLECTIVE
	FlagRead         Flags = 1 << 8  // FI_READ: local RMA/atomic read
	FlagWrite        Flags = 1 << 9  // FI_WRITE: local RMA/atomic write
	FlagRecv         Flags = 1 << 10 // FI_RECV: a receive
	FlagSend         Flags = 1 << 11 // FI_SEND: a send
	FlagRemoteRead   Flags = 1 << 12 // FI_REMOTE_READ: remotely initiated read
	FlagRemoteWrite  Flags = 1 << 13 // FI_REMOTE_WRITE: remotely initiated write
	FlagMultiRecv    Flags = 1 << 16 // FI_MULTI_RECV: the multi-receive buffer was released
	FlagRemoteCQData Flags = 1 << 17 // FI_REMOTE_CQ_DATA: Data holds remote CQ data
	FlagMore         Flags = 1 << 18 // FI_MORE: more data to claim (buffered receive)
	FlagClaim        Flags = 1 << 59 // FI_CLAIM: a claim of buffered receive data
)

var flagNames = []bitflag.Name[Flags]{
	{Bits: FlagMsg, Name: "MSG"}, {Bits: FlagRMA, Name: "RMA"},
	{Bits: FlagTagged, Name: "TAGGED"}, {Bits: FlagAtomic, Name: "ATOMIC"},
	{Bits: FlagMulticast, Name: "MULTICAST"}, {Bits: FlagCollective, Name: "COLLECTIVE"},
	{Bits: FlagRead, Name: "READ"}, {Bits: FlagWrite, Name: "WRITE"},
	{Bits: FlagRecv, Name: "RECV"}, {Bits: FlagSend, Name: "SEND"},
	{Bits: FlagRemoteRead, Name: "REMOTE_READ"},
	{Bits: FlagRemoteWrite, Name: "REMOTE_WRITE"},
	{Bits: FlagMultiRecv, Name: "MULTI_RECV"},
	{Bits: FlagRemoteCQData, Name: "REMOTE_CQ_DATA"}, {Bits: FlagMore, Name: "MORE"},
	{Bits: FlagClaim, Name: "CLAIM"},
}

// String lists the flags by their libfabric names, e.g. "RECV|MSG".
func (f Flags) String() string { return bitflag.String(f, flagNames) }

// Format selects which fields a CQ reports (enum fi_cq_format).
type Format int

// Completion formats. The values are libfabric's.
const (
	FormatUnspec  Format = 0 // the provider's default format
	FormatContext Format = 1 // Context only
	FormatMsg     Format = 2 // + Flags, Len
	FormatData    Format = 3 // + Buf, Data
	FormatTagged  Format = 4 // + Tag
)

// String names the format.
func (f Format) String() string {
	switch f {
	case FormatUnspec:
		return "UNSPEC"
	case FormatContext:
		return "CONTEXT"
	case FormatMsg:
		return "MSG"
	case FormatData:
		return "DATA"
	case FormatTagged:
		return "TAGGED"
	}
	return fmt.Sprintf("Format(%d)", int(f))
}

// WaitObj is the kind of wait object a CQ uses for blocking reads (enum
// fi_wait_obj).
type WaitObj int

// Wait objects. The values are libfabric's.
const (
	// WaitNone: no blocking reads; SRead returns ErrNoWait.
	WaitNone WaitObj = 0
	// WaitUnspec: the provider picks; here an eventfd, as for WaitFD.
	WaitUnspec WaitObj = 1
	// WaitSet: a shared wait set; not supported.
	WaitSet WaitObj = 2
	// WaitFD: an eventfd usable with poll/epoll, returned by WaitFD.
	WaitFD WaitObj = 3
	// WaitMutexCond: blocking reads park the goroutine as with WaitFD, but
	// no descriptor is handed out (there are no pthread objects in Go).
	WaitMutexCond WaitObj = 4
	// WaitYield: SRead spins, yielding the processor between polls.
	WaitYield WaitObj = 5
)

// String names the wait object.
func (w WaitObj) String() string {
	switch w {
	case WaitNone:
		return "NONE"
	case WaitUnspec:
		return "UNSPEC"
	case WaitSet:
		return "SET"
	case WaitFD:
		return "FD"
	case WaitMutexCond:
		return "MUTEX_COND"
	case WaitYield:
		return "YIELD"
	}
	return fmt.Sprintf("WaitObj(%d)", int(w))
}

// WaitCond says how SRead interprets its cond argument (enum
// fi_cq_wait_cond).
type WaitCond int

// Wait conditions.
const (
	// CondNone: any new entry satisfies a blocking read.
	CondNone WaitCond = 0
	// CondThreshold: cond is the number of entries to wait for.
	CondThreshold WaitCond = 1
)

// AttrFlags are CQ creation flags (fi_cq_attr.flags).
type AttrFlags uint64

// AttrAffinity says that Attr.SignalingVector is valid (FI_AFFINITY).
const AttrAffinity AttrFlags = 1 << 29

// Attr are the attributes of a CQ (struct fi_cq_attr). After Open, CQ.Attr
// reports the values in effect: the actual size and the resolved format.
type Attr struct {
	// Size is the minimum number of entries; 0 lets the provider choose.
	Size int
	// Flags: AttrAffinity or 0.
	Flags AttrFlags
	// Format of the entries Read returns.
	Format Format
	// WaitObj is the wait object for SRead and WaitFD.
	WaitObj WaitObj
	// SignalingVector is the CPU that interrupts should target when Flags
	// has AttrAffinity; a hint the provider may ignore.
	SignalingVector int
	// WaitCond is how SRead's cond is interpreted.
	WaitCond WaitCond
	// SingleThreaded promises that one goroutine at a time uses the CQ, so
	// reads take no lock (verbs IBV_CREATE_CQ_ATTR_SINGLE_THREADED;
	// libfabric's FI_THREAD_DOMAIN).
	SingleThreaded bool
}

// sizeLimit is the largest CQ size whatever a provider's Limits say: a
// power of two that a 32-bit int holds, so that rounding up to it cannot
// overflow.
const sizeLimit = 1 << 30

// Limits are what a provider supports; New resolves an Attr against them.
type Limits struct {
	// DefaultSize is used for Attr.Size 0.
	DefaultSize int
	// MaxSize is the largest size; larger requests fail with ErrInvalid.
	// Zero means no limit but the package's own, 2^30, which also caps
	// larger values.
	MaxSize int
	// PowerOfTwo rounds sizes up to a power of two.
	PowerOfTwo bool
	// DefaultFormat replaces FormatUnspec.
	DefaultFormat Format
	// Vectors is the number of signaling vectors (CPUs); 0 means no check.
	Vectors int
}

// Resolve checks attr against the limits and returns it with the actual
// size and format filled in.
func (l Limits) Resolve(attr Attr) (Attr, error) {
	a := attr
	if a.Size < 0 {
		return a, fmt.Errorf("%w: size %d", ErrInvalid, a.Size)
	}
	if a.Size == 0 {
		a.Size = l.DefaultSize
		if a.Size <= 0 {
			a.Size = 1024
		}
	}
	// Checked before rounding too: rounding a size above 2^62 (2^30 on
	// 32 bits) up to a power of two overflows int, and the negative
	// result would pass the check after it.
	limit := l.MaxSize
	if limit <= 0 || limit > sizeLimit {
		limit = sizeLimit
	}
	if a.Size > limit {
		return attr, fmt.Errorf("%w: size %d above the maximum %d", ErrInvalid, a.Size, limit)
	}
	if l.PowerOfTwo && a.Size&(a.Size-1) != 0 {
		a.Size = 1 << bits.Len(uint(a.Size))
	}
	if a.Size > limit {
		return attr, fmt.Errorf("%w: size %d above the maximum %d", ErrInvalid, attr.Size, limit)
	}
	switch a.Format {
	case FormatUnspec:
		a.Format = l.DefaultFormat
		if a.Format == FormatUnspec {
			a.Format = FormatData
		}
	case FormatContext, FormatMsg, FormatData, FormatTagged:
	default:
		return attr, fmt.Errorf("%w: format %v", ErrInvalid, a.Format)
	}
	switch a.WaitObj {
	case WaitNone, WaitUnspec, WaitFD, WaitMutexCond, WaitYield:
	case WaitSet:
		return attr, fmt.Errorf("%w: wait object %v", ErrNotSupported, a.WaitObj)
	default:
		return attr, fmt.Errorf("%w: wait object %v", ErrInvalid, a.WaitObj)
	}
	switch a.WaitCond {
	case CondNone, CondThreshold:
	default:
		return attr, fmt.Errorf("%w: wait condition %d", ErrInvalid, int(a.WaitCond))
	}
	if a.Flags&^AttrAffinity != 0 {
		return attr, fmt.Errorf("%w: flags %#x", ErrInvalid, uint64(a.Flags))
	}
	if a.Flags&AttrAffinity != 0 {
		if a.SignalingVector < 0 || (l.Vectors > 0 && a.SignalingVector >= l.Vectors) {
			return attr, fmt.Errorf("%w: signaling vector %d of %d", ErrInvalid, a.SignalingVector, l.Vectors)
		}
	} else {
		a.SignalingVector = 0
	}
	return a, nil
}

// Addr is a source address as returned by ReadFrom (fi_addr_t).
type Addr uint64

// AddrNotAvail is the source address of a completion whose endpoint has no
// source addressing (FI_ADDR_NOTAVAIL).
const AddrNotAvail Addr = ^Addr(0)

// Entry is one completion. Which fields a CQ fills depends on its format;
// the others stay zero:
//
//	CONTEXT: Context
//	MSG:     Context, Flags, Len
//	DATA:    Context, Flags, Len, Buf, Data
//	TAGGED:  Context, Flags, Len, Buf, Data, Tag
//
// Queue is not part of any libfabric format: it is always set, so that the
// verbs layer can report the queue (QP number) of a completion.
type Entry struct {
	// Context is the value given when the operation was posted
	// (op_context); nil for completions not tied to a posted operation.
	Context any
	// Flags describe the completed operation.
	Flags Flags
	// Len is the number of bytes received (or sent).
	Len int
	// Buf is the address where received data starts: the posted buffer
	// plus the offset inside a multi-receive buffer.
	Buf uintptr
	// Data is the remote CQ data, valid with FlagRemoteCQData.
	Data uint64
	// Tag is the tag of a received tagged message.
	Tag uint64
	// Queue is the device queue the completion came from.
	Queue uint32
}

// ErrEntry is an error completion (struct fi_cq_err_entry): every Entry
// field regardless of the CQ's format, plus the error.
type ErrEntry struct {
	Entry
	// OLen is the number of bytes that did not fit in the receive buffer.
	OLen int
	// Err is the general reason; use errors.Is(e.Err, cq.ETRUNC) or
	// compare directly.
	Err Errno
	// ProvErrno is the provider's error number: the device's status value,
	// or one of the Prov* codes when the reader refused the entry.
	ProvErrno ProvErrno
	// ErrData is provider data about the error (the raw device entry). On
	// input, a non-nil ErrData is the caller's buffer: up to cap(ErrData)
	// bytes are copied and ErrData is resliced to the count. A nil ErrData
	// receives a buffer owned by the CQ, valid until its next read call.
	ErrData []byte
}
