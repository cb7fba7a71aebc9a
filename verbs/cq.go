package verbs

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/eventfd"
)

// Provider is a device as the verbs layer needs it. Its CQs are package
// cq's, so they are read by the one completion path.
type Provider interface {
	// QueryDevice returns what the device supports for CQs.
	QueryDevice() DeviceAttr
	// OpenCQ opens a CQ of at least entries entries (at most
	// DeviceAttr.MaxCQE) whose interrupts signal completion vector
	// vector, with the given format (cq.FormatMsg or cq.FormatData: the
	// narrowest that holds the completion fields asked for), an eventfd
	// wait object, and no lock when single (the verbs layer serialises
	// its calls itself).
	OpenCQ(entries, vector int, format cq.Format, single bool) (*cq.CQ, error)
	// VendorErr returns the vendor error (syndrome) of an error
	// completion, from its error data (the raw entry).
	VendorErr(e *cq.ErrEntry) uint32
	// QueueShift is how far a completion's cq.Entry.Queue is shifted
	// right to give the QP number.
	QueueShift() uint
}

// QueryDevice returns what p supports for CQs (the CQ part of
// ibv_query_device), as far as this package can deliver it: the
// completion fields are those p reports and the accessors implement
// (implementedFields), the flags those p honours and this package knows.
// CreateCQ refuses anything else with errors.ErrUnsupported.
func QueryDevice(p Provider) DeviceAttr {
	da := p.QueryDevice()
	da.Fields &= implementedFields
	da.Flags &= SingleThreaded | IgnoreOverrun
	return da
}

// implementedFields are the completion fields the accessors deliver. The
// others have no data path through cq.Entry: CompletionTS,
// CompletionWallclockNS, CVLAN and FlowTag would return 0, SLID, SL and
// DLID path bits have no accessor, and WCFlags never sets
// WCFlagIPCsumOK; so a provider advertising them (a device's entry may
// carry them) still cannot have them asked for.
const implementedFields = FieldByteLen | FieldImm | FieldQPNum | FieldSrcQP

// CQInitAttr are the attributes of a new CQ (struct ibv_cq_init_attr_ex).
type CQInitAttr struct {
	// CQE is the minimum number of entries, 1 to DeviceAttr.MaxCQE; the
	// CQ may hold more (CQ.CQE).
	CQE int
	// Context is returned with the CQ's completion events.
	Context any
	// Channel receives the CQ's completion events; nil when events are
	// not used.
	Channel *CompChannel
	// CompVector is the completion vector, 0 to
	// DeviceAttr.NumCompVectors-1.
	CompVector int
	// Fields are the completion fields the accessors must report.
	Fields Fields
	// Flags are SingleThreaded and IgnoreOverrun.
	Flags CreateFlags
}

// batch is the most entries the iterator takes from the ring at once (a
// power of 2, so that SrcQP's index is a mask): DPDK's burst, a caller's
// usual batch. Reading 256 at a time shares a ring read's fixed cost (its
// checks, the doorbell) among more completions, 7 fewer instructions per
// completion (callgrind_test.go), but its 16 KiB buffer leaves L1 while
// the ring streams through: in BenchmarkFilledRing the iterator took
// 7.5 ns per completion with 256 and 6.4-6.7 with 32 (16 and 64 did no
// better).
const batch = 32

// errSlot is the slot of ents that holds an error completion: the buffer
// is empty when one is read.
const errSlot = 0

// CQ is a verbs completion queue (struct ibv_cq_ex). Unless created
// SingleThreaded it is safe for concurrent use; a StartPoll..EndPoll
// batch holds its lock. As in verbs, the accessors of a field are valid
// only for a CQ created with that field (CQInitAttr.Fields) and only
// between a successful StartPoll or NextPoll and the next call of either
// or EndPoll; out of place they return stale or zero values, never panic.
type CQ struct {
	// The iterator's state comes first, guarded by mu (or by the single
	// thread). Below 4 KiB into the CQ, a load of it is also the nil check
	// of c (the compiler tests a pointer explicitly before a load at a
	// larger offset), and its 120 bytes put ents on a cache line: the
	// allocator places an object of the CQ's size class on a multiple of
	// 64 bytes and, since it holds pointers and is over 512 bytes, starts
	// it with an 8-byte type header (TestEntriesOnCacheLines checks the
	// sum). An entry spanning two lines would cost the ring reader's
	// writes and the accessors' reads a second line each.
	co      uintptr  // the current completion's byte offset in ents: an accessor adds it to the CQ's address, with no shift or bounds check
	lim     uintptr  // n*entSize while the current completion is buffered, else 0 (NextPoll's fast test)
	i, n    int      // ents[i:n] are completions not yet consumed, the current one first (i is behind while NextPoll's fast path runs: consume brings it up)
	qshift  uint     // Provider.QueueShift
	status  WCStatus // of the current completion (set once per batch for successes)
	vendor  uint32   // of the current completion
	valid   bool     // StartPoll or NextPoll succeeded and EndPoll not yet called
	curErr  bool     // the current completion is errEnt
	single  bool
	inBatch bool // a successful StartPoll began a batch that EndPoll has not ended (EndPoll's guard)
	_       [3]byte
	// opc is opcodes, copied here so that Opcode indexes it from c, with
	// no instruction to form a global's address.
	opc [64]uint8

	// ents buffers completions read from the ring, or holds the error
	// completion being iterated over (at errSlot). The current one is
	// at byte offset co: not a pointer, so that moving to the next entry
	// stores no pointer (no write barrier).
	ents [batch]cq.Entry

	c       *cq.CQ
	prov    Provider
	ctx     any
	ch      *CompChannel
	fields  Fields
	flags   CreateFlags
	withSrc bool
	cqe     atomic.Int64 // Resize changes it

	mu     sync.Mutex // the iterator's
	addrs  [batch]cq.Addr
	errEnt cq.ErrEntry
	errBuf [256]byte

	// Solicited-only arms filtered here (solicited.go): swSolicited unless
	// the provider is a SolicitedNotifier; stash[sh:] are completions the
	// interrupt handler took from the ring, read before the ring's.
	swSolicited bool
	irq         *eventfd.FD
	stash       []stashed
	sh          int
	dbuf        *[batch]cq.Entry
	daddr       *[batch]cq.Addr

	// Notification state: armed under nmu; got, acked, dying under the
	// channel's mu.
	nmu         sync.Mutex
	armed       uint8
	got, acked  uint64
	dying       bool
	ackCh       chan struct{}
	handlerDone chan struct{}

	// dsem serialises Destroys: a channel, so that a Destroy waiting for
	// another can give up when its context ends.
	dsem chan struct{}
	// rmu keeps Resize and Destroy's close apart: Resize holds it, Destroy
	// only while it closes the CQ, not while it waits for acknowledgments
	// (the goroutine that would acknowledge may be resizing).
	rmu       sync.Mutex
	destroyed bool // written under dsem and rmu
}

// Arm types, from weakest to strongest.
const (
	armNone uint8 = iota
	armSolicited
	armNext
)

// CreateCQ creates a CQ on p (ibv_create_cq_ex). Errors: a CQE below 1 or
// above the device's maximum, a completion vector out of range, unknown
// fields or flags match os.ErrInvalid; a field or flag the device cannot
// honour, or a field this package cannot deliver whatever the device
// reports (QueryDevice), errors.ErrUnsupported; a closed channel
// os.ErrClosed.
func CreateCQ(p Provider, attr CQInitAttr) (*CQ, error) {
	if p == nil {
		return nil, invalid("nil provider")
	}
	da := QueryDevice(p)
	switch {
	case attr.CQE < 1 || attr.CQE > da.MaxCQE:
		return nil, invalid("cqe %d (1 to %d)", attr.CQE, da.MaxCQE)
	case attr.CompVector < 0 || attr.CompVector >= da.NumCompVectors:
		return nil, invalid("completion vector %d (the device has %d)", attr.CompVector, da.NumCompVectors)
	case attr.Fields&^allFields != 0:
		return nil, invalid("unknown completion fields %#x", uint64(attr.Fields&^allFields))
	case attr.Fields&^da.Fields != 0:
		return nil, unsupported("completion fields %v", attr.Fields&^da.Fields)
	case attr.Flags&^(SingleThreaded|IgnoreOverrun) != 0:
		return nil, invalid("unknown flags %#x", uint32(attr.Flags))
	case attr.Flags&^da.Flags != 0:
		return nil, unsupported("creation flags %#x", uint32(attr.Flags&^da.Flags))
	}
	single := attr.Flags&SingleThreaded != 0
	c := &CQ{prov: p, ctx: attr.Context, ch: attr.Channel, fields: attr.Fields, flags: attr.Flags,
		single: single, opc: opcodes, withSrc: attr.Fields&FieldSrcQP != 0, qshift: p.QueueShift(),
		dsem: make(chan struct{}, 1), swSolicited: filtersSolicited(p)}
	if c.ch != nil {
		if err := c.ch.use(); err != nil {
			return nil, err
		}
	}
	// The fi_cq CQ takes no lock: the verbs CQ's own (mu) serialises its
	// readers, so a batch costs one lock, not two. Its format is the
	// narrowest that holds the fields asked for: only the immediate data
	// needs FormatData's Data, and a FormatMsg entry costs the ring reader
	// less (no buffer address, no remote CQ data): 15 instructions per
	// completion in verbs/callgrind_test.go (with reads of 256).
	format := cq.FormatMsg
	if attr.Fields&FieldImm != 0 {
		format = cq.FormatData
	}
	fc, err := p.OpenCQ(attr.CQE, attr.CompVector, format, true)
	if err != nil {
		if c.ch != nil {
			c.ch.unuse()
		}
		return nil, err
	}
	c.c = fc
	c.cqe.Store(int64(fc.Attr().Size))
	if c.ch != nil {
		irq := fc.Driver().Interrupt()
		if irq == nil {
			_ = fc.Close()
			c.ch.unuse()
			return nil, unsupported("the device's CQ has no interrupt")
		}
		c.irq = irq
		c.ackCh = make(chan struct{}, 1)
		c.handlerDone = make(chan struct{})
		go c.handle(irq)
	}
	return c, nil
}

// CQE returns the number of entries the CQ holds (at least the CQE asked
// for).
func (c *CQ) CQE() int { return int(c.cqe.Load()) }

// Context returns the caller context given at creation.
func (c *CQ) Context() any { return c.ctx }

// Channel returns the CQ's completion channel (nil without one).
func (c *CQ) Channel() *CompChannel { return c.ch }

// FI returns the fi_cq CQ underneath, for binding device queues to it
// (a sim.QP, nic.Device.BindCQ). Do not read, arm or close it: it takes
// no lock of its own (the verbs CQ serialises its calls) and the verbs
// iterator buffers completions taken from it.
func (c *CQ) FI() *cq.CQ { return c.c }

func (c *CQ) lock() {
	if !c.single {
		c.mu.Lock()
	}
}

func (c *CQ) unlock() {
	if !c.single {
		c.mu.Unlock()
	}
}

// StartPoll starts a batch (ibv_start_poll) and makes its first completion
// current. When none is available it returns ErrEmpty (ENOENT), the CQ
// stays valid and no batch is started: EndPoll need not be called (it
// would do nothing). It returns cq.ErrOverrun once the CQ overran (unless
// created IgnoreOverrun) and os.ErrClosed after Destroy. While the batch
// lasts the CQ's lock is held. It does not allocate.
func (c *CQ) StartPoll() error {
	c.lock()
	if err := c.load(); err != nil {
		c.unlock()
		return err
	}
	c.inBatch = true
	return nil
}

// NextPoll consumes the current completion and makes the next one current
// (ibv_next_poll); ErrEmpty (ENOENT) when there is none. EndPoll is still
// required after an error. It does not allocate.
func (c *CQ) NextPoll() error {
	// The common case, small enough to inline: the next completion is in
	// the buffer.
	if o := c.co + entSize; o < c.lim {
		c.co = o
		return nil
	}
	return c.nextSlow()
}

// nextSlow is NextPoll past the buffer or after an error completion.
func (c *CQ) nextSlow() error {
	c.consume()
	return c.load()
}

// EndPoll consumes the current completion and ends the batch
// (ibv_end_poll). Outside a batch (after a failed StartPoll, a second
// time, or with no StartPoll) it does nothing: in C that is undefined, and
// here it would unlock a lock not held, a fatal error in Go. Like the
// accessors it belongs to the goroutine that started the batch: called
// from another goroutine while one is open, it races with that batch.
func (c *CQ) EndPoll() {
	// inBatch is iterator state: guarded by the lock the batch holds.
	if !c.inBatch {
		return
	}
	c.inBatch = false
	c.consume()
	c.unlock()
}

// consume drops the current completion.
func (c *CQ) consume() {
	if !c.valid {
		return
	}
	c.valid, c.lim = false, 0
	if c.curErr {
		c.curErr = false
		return
	}
	c.i = int(c.co/entSize) + 1
}

// load makes the next completion current, reading a batch from the ring
// when the buffer is empty.
func (c *CQ) load() error {
	if c.i < c.n {
		c.co, c.valid, c.lim = uintptr(c.i)*entSize, true, uintptr(c.n)*entSize
		c.status, c.vendor = WCSuccess, 0
		return nil
	}
	c.i, c.n = 0, 0
	if c.sh < len(c.stash) {
		return c.loadStash()
	}
	// readRing's body, written out: as a call (its two reads inlined in
	// it make it too big to inline) it cost 0.5 instructions per
	// completion (callgrind_test.go).
	var k int
	var err error
	if c.withSrc {
		k, err = c.c.ReadFrom(c.ents[:], c.addrs[:])
	} else {
		k, err = c.c.Read(c.ents[:])
	}
	if k > 0 {
		c.n = k
		c.co, c.valid, c.lim = 0, true, uintptr(k)*entSize
		c.status, c.vendor = WCSuccess, 0
		return nil
	}
	switch err {
	case cq.ErrAgain:
		return ErrEmpty
	case cq.ErrAvail:
		status, vendor, err := c.readErr()
		if err != nil {
			return err
		}
		c.ents[errSlot] = c.errEnt.Entry
		c.co, c.valid, c.curErr = errSlot*entSize, true, true
		c.status, c.vendor = status, vendor
		return nil
	}
	return c.mapErr(err)
}

// readRing reads a batch of successes from the ring into ents, and their
// source addresses into addrs when the source QP was asked for (load
// does the same in line).
func (c *CQ) readRing(ents []cq.Entry, addrs []cq.Addr) (int, error) {
	if c.withSrc {
		return c.c.ReadFrom(ents, addrs)
	}
	return c.c.Read(ents)
}

// readErr takes the error completion at the ring's head into errEnt and
// returns its status and vendor error. Cold path.
func (c *CQ) readErr() (WCStatus, uint32, error) {
	c.errEnt.ErrData = c.errBuf[:0]
	if err := c.c.ReadErr(&c.errEnt); err != nil {
		return 0, 0, c.mapErr(err)
	}
	return StatusOf(&c.errEnt), c.prov.VendorErr(&c.errEnt), nil
}

func (c *CQ) mapErr(err error) error {
	switch err {
	case cq.ErrAgain:
		return ErrEmpty
	case cq.ErrOverrun:
		if c.flags&IgnoreOverrun != 0 {
			return ErrEmpty
		}
	}
	return err
}

// StatusOf maps an error completion of package cq to a verbs status, by
// its error number.
func StatusOf(e *cq.ErrEntry) WCStatus {
	switch e.Err {
	case 0:
		return WCSuccess
	case cq.ETRUNC, cq.EMSGSIZE:
		return WCLocLenErr
	case cq.EFAULT:
		return WCLocProtErr
	case cq.ECANCELED:
		return WCWRFlushErr
	case cq.EACCES, cq.EPERM:
		return WCRemAccessErr
	case cq.ETIMEDOUT:
		return WCRespTimeoutErr
	case cq.ENORX:
		return WCRNRRetryExcErr
	}
	return WCGeneralErr
}

// WRID returns the current completion's work request id: the context it
// was posted with when that is a uint64 (or an int, uint32 or uintptr),
// else 0 (see WRContext).
func (c *CQ) WRID() uint64 {
	// Comma-ok assertions compare the type word with a constant each; a
	// type switch would load the type's hash first.
	ctx := c.cur().Context
	if v, ok := ctx.(uint64); ok {
		return v
	}
	if v, ok := ctx.(int); ok {
		return uint64(v)
	}
	if v, ok := ctx.(uintptr); ok {
		return uint64(v)
	}
	if v, ok := ctx.(uint32); ok {
		return uint64(v)
	}
	return 0
}

// WRContext returns the context the current completion's operation was
// posted with, whatever its type.
func (c *CQ) WRContext() any { return c.cur().Context }

// Status returns the current completion's status.
func (c *CQ) Status() WCStatus { return c.status }

// Opcode returns the current completion's operation (ibv_wc_read_opcode).
func (c *CQ) Opcode() WCOpcode { return WCOpcode(c.opc[c.cur().Flags>>8&63]) }

// opcodes maps bits 8 to 13 of the completion flags (READ, WRITE, RECV,
// SEND, REMOTE_READ, REMOTE_WRITE) to the opcode, which fits in a byte
// (TestOpcodeTable): one load per entry instead of a chain of tests.
var opcodes = func() (t [64]uint8) {
	for i := range t {
		t[i] = uint8(opcodeOf(cq.Flags(i) << 8))
	}
	return t
}()

func opcodeOf(f cq.Flags) WCOpcode {
	switch {
	case f&cq.FlagRemoteWrite != 0:
		return WCRecvRDMAWithImm
	case f&cq.FlagRecv != 0:
		return WCRecv
	case f&cq.FlagWrite != 0:
		return WCRDMAWrite
	case f&cq.FlagRead != 0:
		return WCRDMARead
	}
	return WCSend
}

// VendorErr returns the current completion's vendor error, 0 for a
// success (ibv_wc_read_vendor_err).
func (c *CQ) VendorErr() uint32 { return c.vendor }

// ByteLen returns the bytes transferred (FieldByteLen).
func (c *CQ) ByteLen() uint32 { return uint32(c.cur().Len) }

// ImmData returns the immediate data, valid when WCFlags has
// WCFlagWithImm (FieldImm). It is in host order.
func (c *CQ) ImmData() uint32 { return uint32(c.cur().Data) }

// QPNum returns the number of the QP the completion belongs to
// (FieldQPNum).
func (c *CQ) QPNum() uint32 { return c.cur().Queue >> c.qshift }

// SrcQP returns the sending QP of a receive (FieldSrcQP), 0 when the
// device did not report one.
func (c *CQ) SrcQP() uint32 {
	if c.curErr || !c.withSrc {
		return 0
	}
	if a := c.addrs[c.co/entSize%batch]; a != cq.AddrNotAvail {
		return uint32(a)
	}
	return 0
}

// WCFlags returns the current completion's flags (ibv_wc_read_wc_flags).
func (c *CQ) WCFlags() WCFlags {
	if c.cur().Flags&cq.FlagRemoteCQData != 0 {
		return WCFlagWithImm
	}
	return 0
}

// CompletionTS returns the completion time in device clock units
// (FieldCompletionTimestamp). It returns 0: no completion carries it to
// this package yet, so CreateCQ refuses the field on every device.
func (c *CQ) CompletionTS() uint64 { return 0 }

// CompletionWallclockNS returns the completion time in wall-clock
// nanoseconds (FieldCompletionWallclock). It returns 0: CreateCQ refuses
// the field on every device.
func (c *CQ) CompletionWallclockNS() uint64 { return 0 }

// CVLAN returns the VLAN tag (FieldCVLAN). It returns 0: CreateCQ refuses
// the field on every device.
func (c *CQ) CVLAN() uint16 { return 0 }

// FlowTag returns the flow tag (FieldFlowTag). It returns 0: CreateCQ
// refuses the field on every device.
func (c *CQ) FlowTag() uint32 { return 0 }

// WC is a work completion (struct ibv_wc), as Poll returns it.
type WC struct {
	WRID      uint64
	Status    WCStatus
	Opcode    WCOpcode
	VendorErr uint32
	ByteLen   uint32
	ImmData   uint32
	QPNum     uint32
	SrcQP     uint32
	WCFlags   WCFlags
	// Context is the posted operation's context (see CQ.WRContext).
	Context any
}

// Poll moves up to len(wcs) completions into wcs (ibv_poll_cq), errors
// included in completion order, and returns how many; 0 and nil when the
// CQ is empty. It runs the iterator and does not allocate.
func (c *CQ) Poll(wcs []WC) (int, error) {
	if len(wcs) == 0 {
		return 0, nil
	}
	if err := c.StartPoll(); err != nil {
		if err == ErrEmpty {
			return 0, nil
		}
		return 0, err
	}
	n := 0
	for {
		w := &wcs[n]
		*w = WC{WRID: c.WRID(), Status: c.Status(), Opcode: c.Opcode(), VendorErr: c.VendorErr(),
			ByteLen: c.ByteLen(), ImmData: c.ImmData(), QPNum: c.QPNum(), SrcQP: c.SrcQP(),
			WCFlags: c.WCFlags(), Context: c.cur().Context}
		n++
		if n == len(wcs) || c.NextPoll() != nil {
			break
		}
	}
	c.EndPoll()
	return n, nil
}

// Destroy destroys the CQ (ibv_destroy_cq). It first waits until every
// event GetEvent returned for it is acknowledged, then for another
// goroutine's StartPoll..EndPoll batch or Resize to end. When ctx ends
// first (or while another Destroy of the CQ is under way) it returns an
// error matching ctx.Err(), and os.ErrDeadlineExceeded for a deadline,
// that says what it waited for, and the CQ stays usable. It fails with an
// error matching cq.ErrBusy and syscall.EBUSY while device queues are
// bound to the CQ. Once it succeeds, events queued and not yet returned
// are dropped and completions still queued are lost; while it runs,
// GetEvent does not return the CQ, and when it fails the CQ's events,
// those raised meanwhile included, are returned again. It is idempotent.
func (c *CQ) Destroy(ctx context.Context) error {
	switch {
	case ctx == nil:
		return invalid("nil context")
	case c.dsem == nil: // a send on it would block for ever
		return invalid("destroy of a CQ not made by CreateCQ")
	}
	select {
	case c.dsem <- struct{}{}:
	default:
		select {
		case c.dsem <- struct{}{}:
		case <-ctx.Done():
			return ctxError("verbs: destroy CQ: another Destroy is under way", ctx)
		}
	}
	defer func() { <-c.dsem }()
	if c.destroyed {
		return nil
	}
	if n := c.c.Driver().Bound(); n > 0 {
		return &busyError{fmt.Sprintf("verbs: destroy CQ: %d device queue(s) bound", n)}
	}
	ch := c.ch
	if ch != nil {
		for {
			ch.mu.Lock()
			un := c.got - c.acked
			if un == 0 {
				// Under the channel's lock: GetEvent can no longer return
				// this CQ, so none can become unacknowledged. Its events
				// stay queued until the CQ is closed.
				ch.setDying(c, true)
			}
			ch.mu.Unlock()
			if un == 0 {
				break
			}
			select {
			case <-c.ackCh:
			case <-ctx.Done():
				return ctxError(fmt.Sprintf("verbs: destroy CQ: %d unacknowledged event(s)", un), ctx)
			}
		}
	}
	// No Resize, and no reader inside the fi_cq CQ, which takes no lock of
	// its own.
	if !lockCtx(ctx, &c.rmu) {
		c.revive()
		return ctxError("verbs: destroy CQ: a Resize is under way", ctx)
	}
	defer c.rmu.Unlock()
	if !c.single && !lockCtx(ctx, &c.mu) {
		c.revive()
		return ctxError("verbs: destroy CQ: a poll batch is open", ctx)
	}
	err := c.c.Close()
	c.unlock()
	if err != nil {
		c.revive()
		if errors.Is(err, cq.ErrBusy) { // a queue bound since the check
			return &busyError{fmt.Sprintf("verbs: destroy CQ: %d device queue(s) bound", c.c.Driver().Bound())}
		}
		return err
	}
	c.destroyed = true
	if ch != nil {
		<-c.handlerDone // the CQ's eventfd is closed: the handler returns
		ch.drop(c)
		ch.unuse()
	}
	return nil
}

// revive undoes Destroy's dying when it fails after setting it: GetEvent
// returns the CQ's events again, those queued meanwhile included.
func (c *CQ) revive() {
	if ch := c.ch; ch != nil {
		ch.mu.Lock()
		ch.setDying(c, false)
		ch.mu.Unlock()
	}
}

// lockCtx locks mu unless ctx ends first. sync.Mutex has no such wait, so
// it retries TryLock, sleeping 10 µs doubling to 1 ms in between: a
// Destroy that waits pays at most a millisecond after the unlock, and the
// iterator keeps its plain mutex.
func lockCtx(ctx context.Context, mu *sync.Mutex) bool {
	if mu.TryLock() {
		return true
	}
	d := 10 * time.Microsecond
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
		if mu.TryLock() {
			return true
		}
		d = min(2*d, time.Millisecond)
		t.Reset(d)
	}
}

// Close is Destroy without a deadline (io.Closer).
func (c *CQ) Close() error { return c.Destroy(context.Background()) }

// entSize is the size of a cq.Entry.
const entSize = unsafe.Sizeof(cq.Entry{})

// cur returns the current completion, with no shift and no bounds check:
// co is always the offset of an entry of ents, so an accessor called out of
// order reads a stale entry, never outside the array. Every store to co
// keeps it so: load stores i*entSize with i < n <= batch, or errSlot's;
// NextPoll stores a value below lim, which is at most n*entSize.
func (c *CQ) cur() *cq.Entry {
	return (*cq.Entry)(unsafe.Add(unsafe.Pointer(&c.ents), c.co))
}

// Resizer is a Provider that can resize its CQs.
type Resizer interface {
	// ResizeCQ gives c at least entries entries and returns the new size.
	// The entries c holds, plus held more that the caller keeps, must fit:
	// otherwise an error matching os.ErrInvalid, and nothing changes.
	// Entries not yet read stay in order, including those the device
	// writes during the call. No reader uses c meanwhile.
	ResizeCQ(c *cq.CQ, entries, held int) (int, error)
}

// Resize changes the CQ's size to at least cqe entries (ibv_resize_cq).
// A size below the number of completions the CQ holds fails with an error
// matching os.ErrInvalid and loses nothing; completions present before
// the resize are read after it, in order. Devices that cannot resize
// return errors.ErrUnsupported; after Destroy it returns os.ErrClosed. It
// must not be called between StartPoll and EndPoll. It does not wait for
// a Destroy that waits for events to be acknowledged (the CQ is usable
// until they are, and the goroutine that acknowledges them may be the one
// resizing); it waits only while Destroy closes the CQ.
func (c *CQ) Resize(cqe int) error {
	rz, ok := c.prov.(Resizer)
	if !ok || !c.prov.QueryDevice().Resize {
		return unsupported("resizing a CQ")
	}
	if max := c.prov.QueryDevice().MaxCQE; cqe < 1 || cqe > max {
		return invalid("cqe %d (1 to %d)", cqe, max)
	}
	c.rmu.Lock()
	defer c.rmu.Unlock()
	// Both locks keep every reader of the ring out: the iterator and
	// ReqNotify, which counts the entries the ring holds (nmu first, as
	// there).
	c.nmu.Lock()
	defer c.nmu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.destroyed {
		return cq.ErrClosed
	}
	n, err := rz.ResizeCQ(c.c, cqe, c.n-c.i+c.stashLen())
	if err != nil {
		return err
	}
	c.cqe.Store(int64(n))
	return nil
}
