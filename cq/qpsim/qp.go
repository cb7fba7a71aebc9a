package qpsim

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"sync"
	"time"
	"unsafe"

	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/cq/ring"
	"github.com/vfnic/vfnic/dma"
	"github.com/vfnic/vfnic/doorbell"
)

// Descriptor geometry and field offsets (see the package documentation).
const (
	DescSize      = 64
	OffDescAddr   = 0
	OffDescLen    = 8
	OffDescID     = 12
	OffDescData   = 16
	OffDescTag    = 24
	OffDescDest   = 32
	OffDescFlags  = 40
	OffDescMin    = 44
	OffDescOpcode = 48
)

// Descriptor flags.
const (
	DescHasData   = 1 << 0
	DescTagged    = 1 << 1
	DescMultiRecv = 1 << 2
	DescSolicited = 1 << 3
)

// Queue pair status page offsets.
const (
	OffQPSendTail = 0
	OffQPRecvTail = 4
	OffQPSendHead = 8
	OffQPRecvHead = 12
)

// Queue sizes.
const (
	DefaultQueueSize = 256
	MaxQueueSize     = 1 << 14
	maxQPs           = 1 << 15 // queue numbers 2k and 2k+1 fit the CQE's u16
)

// QPConfig configures a queue pair.
type QPConfig struct {
	// SendCQ receives send completions, RecvCQ receive completions; they
	// may be the same CQ. Both must be open on the same device.
	SendCQ, RecvCQ *cq.CQ
	// SendSize and RecvSize are the queue depths (rounded up to a power of
	// two; 0 means 256).
	SendSize, RecvSize int
	// Source makes receive completions carry the sender's address
	// (FI_SOURCE); without it ReadFrom reports cq.AddrNotAvail.
	Source bool
	// FlushOnClose makes Close complete every operation still posted
	// (receives not filled, sends the device has not taken) with
	// StatusWRFlushErr, as a verbs QP moved to the error state does.
	// Without it they are dropped silently.
	FlushOnClose bool
}

// SendOpts are the options of a send.
type SendOpts struct {
	// Data is remote CQ data delivered with the receive when HasData.
	Data    uint64
	HasData bool // send Data
	// Tag is delivered with the receive when Tagged.
	Tag    uint64
	Tagged bool // send Tag
	// Solicited marks the receive completion for solicited-only arms.
	Solicited bool
}

// RecvOpts are the options of a posted receive.
type RecvOpts struct {
	// MultiRecv makes the buffer receive several frames, each at a
	// 64-byte aligned offset, until less than MinFree bytes remain (0
	// means MaxFrame); the last completion carries cq.FlagMultiRecv.
	MultiRecv bool
	MinFree   int // bytes; 0 means MaxFrame
}

// QP is a queue pair: a send queue and a receive queue. Its methods are safe
// for concurrent use.
type QP struct {
	d       *Device
	num     uint32
	addr    cq.Addr
	region  *dma.Region
	sendCQ  *cq.CQ
	recvCQ  *cq.CQ
	sendTab *ring.Table
	recvTab *ring.Table
	source  bool
	flush   bool
	sqSize  uint32
	rqSize  uint32
	sq, rq  []byte
	txbuf   []byte

	// Driver side, guarded by mu.
	mu      sync.Mutex
	closed  bool
	sqTail  uint32
	rqTail  uint32
	sqDB    *doorbell.Doorbell
	rqDB    *doorbell.Doorbell
	sqHeadR doorbell.Reg32
	rqHeadR doorbell.Reg32

	// Device side, used by the device loop under d.mu.
	sendDev, recvDev *devCQ
	sqTailR, rqTailR doorbell.Reg32
	dsqHead, drqHead uint32
	dclosed          bool
	multi            multiBuf
}

type multiBuf struct {
	active  bool
	buf     []byte
	id      uint32
	off     int
	minFree int
}

func queueSize(n int) (uint32, error) {
	if n == 0 {
		n = DefaultQueueSize
	}
	if n < 1 || n > MaxQueueSize {
		return 0, fmt.Errorf("sim: queue size %d (1 to %d): %w", n, MaxQueueSize, cq.ErrInvalid)
	}
	return uint32(1) << bits.Len(uint(n-1)), nil
}

// NewQP creates a queue pair whose completions go to cfg's CQs, and binds
// it to them (the CQs cannot close until the QP does).
func (d *Device) NewQP(cfg QPConfig) (*QP, error) {
	if cfg.SendCQ == nil || cfg.RecvCQ == nil {
		return nil, fmt.Errorf("sim: queue pair needs a send and a receive CQ: %w", cq.ErrInvalid)
	}
	sqs, err := queueSize(cfg.SendSize)
	if err != nil {
		return nil, err
	}
	rqs, err := queueSize(cfg.RecvSize)
	if err != nil {
		return nil, err
	}
	q := &QP{d: d, sendCQ: cfg.SendCQ, recvCQ: cfg.RecvCQ, source: cfg.Source, flush: cfg.FlushOnClose, sqSize: sqs, rqSize: rqs}
	if q.sendTab, err = ring.NewTable(int(sqs), 32); err != nil {
		return nil, err
	}
	if q.recvTab, err = ring.NewTable(int(rqs), 32); err != nil {
		return nil, err
	}

	d.mu.Lock()
	if q.sendDev, err = d.devCQOf(cfg.SendCQ); err == nil {
		q.recvDev, err = d.devCQOf(cfg.RecvCQ)
	}
	if err == nil && d.nextQP >= maxQPs {
		err = fmt.Errorf("sim: %d queue pairs created: %w", maxQPs, ring.ErrFull)
	}
	if err == nil {
		q.num = d.nextQP
		d.nextQP++
		q.region, err = d.alloc(int(sqs+rqs)*DescSize + int(sqs)*MaxFrame + 2*4096)
	}
	d.mu.Unlock()
	if err != nil {
		return nil, err
	}
	q.addr = cq.Addr(q.num)
	fail := func(err error) (*QP, error) {
		d.mu.Lock()
		_ = d.free(q.region)
		d.mu.Unlock()
		return nil, err
	}
	if err := q.setup(); err != nil {
		return fail(err)
	}
	if err := cfg.SendCQ.Driver().Bind(); err != nil {
		return fail(err)
	}
	if err := cfg.RecvCQ.Driver().Bind(); err != nil {
		cfg.SendCQ.Driver().Unbind()
		return fail(err)
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		cfg.SendCQ.Driver().Unbind()
		cfg.RecvCQ.Driver().Unbind()
		return nil, ErrClosed
	}
	d.qps = append(d.qps, q)
	d.byAddr[q.addr] = q
	d.mu.Unlock()
	return q, nil
}

// setup carves the rings and registers and binds the tables.
func (q *QP) setup() error {
	r := q.region
	sq, err := r.Carve(int(q.sqSize)*DescSize, 4096)
	if err != nil {
		return err
	}
	rq, err := r.Carve(int(q.rqSize)*DescSize, 64)
	if err != nil {
		return err
	}
	page, err := r.Carve(64, 64)
	if err != nil {
		return err
	}
	tx, err := r.Carve(int(q.sqSize)*MaxFrame, 64)
	if err != nil {
		return err
	}
	q.sq, q.rq, q.txbuf = sq.Bytes, rq.Bytes, tx.Bytes
	w := doorbell.NewWindow(page.Bytes)
	regs := []struct {
		reg *doorbell.Reg32
		off uintptr
	}{{&q.sqTailR, OffQPSendTail}, {&q.rqTailR, OffQPRecvTail}, {&q.sqHeadR, OffQPSendHead}, {&q.rqHeadR, OffQPRecvHead}}
	for _, x := range regs {
		if *x.reg, err = w.Reg32(x.off); err != nil {
			return err
		}
	}
	q.sqDB = doorbell.NewDoorbell(q.sqTailR)
	q.rqDB = doorbell.NewDoorbell(q.rqTailR)
	if err := q.sendDev.src.BindTable(2*q.num, q.sendTab); err != nil {
		return err
	}
	return q.recvDev.src.BindTable(2*q.num+1, q.recvTab)
}

// Addr returns the queue pair's address, the destination of sends and the
// source address of the receives it causes.
func (q *QP) Addr() cq.Addr { return q.addr }

// SendQueue and RecvQueue return the queue numbers in the QP's CQEs.
func (q *QP) SendQueue() uint32 { return 2 * q.num }

// RecvQueue returns the queue number of the QP's receive completions.
func (q *QP) RecvQueue() uint32 { return 2*q.num + 1 }

// Send posts a frame for dest (a QP's Addr; the device drops frames for
// unknown addresses, like a wire). The send completes with ctx on the send
// CQ once the device has taken the frame. It fails with ErrQueueFull when
// the send queue is full.
func (q *QP) Send(dest cq.Addr, ctx any, payload []byte, o SendOpts) error {
	if len(payload) > MaxFrame {
		return fmt.Errorf("%w: %d bytes", ErrTooBig, len(payload))
	}
	q.mu.Lock()
	err := q.post(dest, ctx, payload, o)
	if err == nil {
		q.sqDB.Ring(q.sqTail)
	}
	q.mu.Unlock()
	if err == nil {
		q.d.kickDevice()
	}
	return err
}

// SendBatch posts one send per context with the same payload and options
// and rings the doorbell once; it returns how many were posted.
func (q *QP) SendBatch(dest cq.Addr, ctxs []any, payload []byte, o SendOpts) (int, error) {
	if len(payload) > MaxFrame {
		return 0, fmt.Errorf("%w: %d bytes", ErrTooBig, len(payload))
	}
	q.mu.Lock()
	n := 0
	var err error
	for _, c := range ctxs {
		if err = q.post(dest, c, payload, o); err != nil {
			break
		}
		n++
	}
	if n > 0 {
		q.sqDB.Ring(q.sqTail)
	}
	q.mu.Unlock()
	if n > 0 {
		q.d.kickDevice()
	}
	if n > 0 && errors.Is(err, ErrQueueFull) {
		err = nil
	}
	return n, err
}

// post writes one send descriptor. Called with q.mu held.
func (q *QP) post(dest cq.Addr, ctx any, payload []byte, o SendOpts) error {
	if q.closed {
		return ErrClosed
	}
	if q.sqTail-q.sqHeadR.Read() >= q.sqSize {
		return ErrQueueFull
	}
	fl := cq.FlagSend | cq.FlagMsg
	if o.Tagged {
		fl = cq.FlagSend | cq.FlagTagged
	}
	id, err := q.sendTab.Post(ring.Op{Context: ctx, Len: len(payload), Flags: fl})
	if err != nil {
		if errors.Is(err, ring.ErrFull) {
			return ErrQueueFull
		}
		return err
	}
	slot := q.sqTail & (q.sqSize - 1)
	buf := q.txbuf[int(slot)*MaxFrame : int(slot)*MaxFrame+len(payload)]
	copy(buf, payload)
	var dfl uint32
	if o.HasData {
		dfl |= DescHasData
	}
	if o.Tagged {
		dfl |= DescTagged
	}
	if o.Solicited {
		dfl |= DescSolicited
	}
	var addr uint64
	if len(buf) > 0 {
		addr = uint64(uintptr(unsafe.Pointer(&q.txbuf[int(slot)*MaxFrame])))
	}
	q.writeDesc(q.sq, slot, addr, uint32(len(payload)), id, o.Data, o.Tag, uint64(dest), dfl, 0)
	q.sqTail++
	return nil
}

func (q *QP) writeDesc(ring []byte, slot uint32, addr uint64, ln, id uint32, data, tag, dest uint64, flags, minFree uint32) {
	b := ring[slot*DescSize : slot*DescSize+DescSize]
	binary.LittleEndian.PutUint64(b[OffDescAddr:], addr)
	binary.LittleEndian.PutUint32(b[OffDescLen:], ln)
	binary.LittleEndian.PutUint32(b[OffDescID:], id)
	binary.LittleEndian.PutUint64(b[OffDescData:], data)
	binary.LittleEndian.PutUint64(b[OffDescTag:], tag)
	binary.LittleEndian.PutUint64(b[OffDescDest:], dest)
	binary.LittleEndian.PutUint32(b[OffDescFlags:], flags)
	binary.LittleEndian.PutUint32(b[OffDescMin:], minFree)
	b[OffDescOpcode] = uint8(OpSend)
}

// PostRecv posts a receive buffer, which must lie in the device's memory
// (Device.Alloc). Its completion carries ctx and the address of the data
// (cq.Entry.Buf).
func (q *QP) PostRecv(ctx any, buf []byte, o RecvOpts) error {
	if len(buf) == 0 || uint64(len(buf)) > 1<<31 {
		return fmt.Errorf("sim: receive buffer of %d bytes: %w", len(buf), cq.ErrInvalid)
	}
	iova := uint64(uintptr(unsafe.Pointer(&buf[0])))
	if q.d.translate(iova, uint32(len(buf))) == nil {
		return fmt.Errorf("%w: %d bytes at %#x", ErrBadBuffer, len(buf), iova)
	}
	if o.MinFree < 0 {
		return fmt.Errorf("sim: min free %d: %w", o.MinFree, cq.ErrInvalid)
	}
	fl := cq.FlagRecv | cq.FlagMsg
	var dfl uint32
	if o.MultiRecv {
		fl |= cq.FlagMultiRecv
		dfl |= DescMultiRecv
	}
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return ErrClosed
	}
	if q.rqTail-q.rqHeadR.Read() >= q.rqSize {
		q.mu.Unlock()
		return ErrQueueFull
	}
	id, err := q.recvTab.Post(ring.Op{Context: ctx, Buf: uintptr(iova), Len: len(buf), Flags: fl})
	if err != nil {
		q.mu.Unlock()
		if errors.Is(err, ring.ErrFull) {
			return ErrQueueFull
		}
		return err
	}
	q.writeDesc(q.rq, q.rqTail&(q.rqSize-1), iova, uint32(len(buf)), id, 0, 0, 0, dfl, uint32(o.MinFree))
	q.rqTail++
	q.rqDB.Ring(q.rqTail)
	q.mu.Unlock()
	q.d.kickDevice()
	return nil
}

// Flush waits until the device has taken every send posted so far, so
// their completions (and the receives they caused) are written.
func (q *QP) Flush(ctx context.Context) error {
	if ctx == nil {
		return fmt.Errorf("%w: nil context", cq.ErrInvalid)
	}
	q.mu.Lock()
	tail := q.sqTail
	q.mu.Unlock()
	for {
		// The head register lives in the QP's memory: read it only while
		// holding mu, so a concurrent Close cannot free it under us.
		q.mu.Lock()
		if q.closed {
			q.mu.Unlock()
			return ErrClosed
		}
		left := int32(tail - q.sqHeadR.Read())
		q.mu.Unlock()
		if left <= 0 {
			return nil
		}
		_ = q.d.kick.Add(1)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Microsecond):
		}
	}
}

// Close unbinds the queue pair from its CQs and frees its rings. Its
// completions already written stay readable. It is idempotent.
func (q *QP) Close() error {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return nil
	}
	q.closed = true
	q.mu.Unlock()
	d := q.d
	d.mu.Lock()
	if q.flush && !q.dclosed {
		d.flushQP(q)
	}
	q.dclosed = true
	for i, x := range d.qps {
		if x == q {
			d.qps = append(d.qps[:i], d.qps[i+1:]...)
			break
		}
	}
	if d.byAddr[q.addr] == q {
		delete(d.byAddr, q.addr)
	}
	err := d.free(q.region)
	d.mu.Unlock()
	q.sendCQ.Driver().Unbind()
	q.recvCQ.Driver().Unbind()
	return err
}

// stepQP processes posted sends. Device loop, d.mu held.
func (d *Device) stepQP(q *QP) bool {
	if q.dclosed {
		return false
	}
	tail := q.sqTailR.Read()
	work := false
	for budget := 64; q.dsqHead != tail && budget > 0; budget-- {
		slot := q.dsqHead & (q.sqSize - 1)
		b := q.sq[slot*DescSize : slot*DescSize+DescSize]
		addr := binary.LittleEndian.Uint64(b[OffDescAddr:])
		ln := binary.LittleEndian.Uint32(b[OffDescLen:])
		e := cqe{CQE: CQE{ID: binary.LittleEndian.Uint32(b[OffDescID:]), Queue: uint16(2 * q.num),
			Opcode: OpSend, ByteLen: ln}}
		var frame []byte
		if ln > 0 {
			frame = d.translate(addr, ln)
		}
		switch {
		case ln > MaxFrame:
			e.Status = StatusLocalLenErr
		case ln > 0 && frame == nil:
			e.Status = StatusLocalProtErr
		default:
			d.stats.Frames++
			d.deliver(q, frame, b)
		}
		d.complete(q.sendDev, e)
		q.dsqHead++
		work = true
	}
	if work {
		// Once per pass: the line also holds the driver's tail doorbells.
		q.sqHeadR.Write(q.dsqHead)
	}
	if q.rqHeadR.Read() != q.drqHead {
		q.rqHeadR.Write(q.drqHead)
	}
	return work
}

// deliver loops a frame back to its destination's receive queue.
func (d *Device) deliver(from *QP, frame []byte, desc []byte) {
	dest := cq.Addr(binary.LittleEndian.Uint64(desc[OffDescDest:]))
	r := d.byAddr[dest]
	if r == nil || r.dclosed {
		d.stats.RxDropped++
		return
	}
	dfl := binary.LittleEndian.Uint32(desc[OffDescFlags:])
	e := cqe{CQE: CQE{Queue: uint16(2*r.num + 1), Opcode: OpRecv, ByteLen: uint32(len(frame))},
		solicited: dfl&DescSolicited != 0}
	if dfl&DescHasData != 0 {
		e.DevFlags |= DevHasData
		e.Data = binary.LittleEndian.Uint64(desc[OffDescData:])
	}
	if dfl&DescTagged != 0 {
		e.DevFlags |= DevTagged
		e.Tag = binary.LittleEndian.Uint64(desc[OffDescTag:])
	}
	if r.source {
		e.DevFlags |= DevHasSrc
		e.Src = uint64(from.addr)
	}
	m := &r.multi
	if !m.active {
		if r.drqHead == r.rqTailR.Read() {
			d.stats.RxDropped++
			return
		}
		slot := r.drqHead & (r.rqSize - 1)
		b := r.rq[slot*DescSize : slot*DescSize+DescSize]
		r.drqHead++ // published once per pass by stepQP
		addr := binary.LittleEndian.Uint64(b[OffDescAddr:])
		blen := binary.LittleEndian.Uint32(b[OffDescLen:])
		e.ID = binary.LittleEndian.Uint32(b[OffDescID:])
		buf := d.translate(addr, blen)
		if buf == nil {
			e.Status, e.ByteLen = StatusLocalProtErr, 0
			d.complete(r.recvDev, e)
			return
		}
		if binary.LittleEndian.Uint32(b[OffDescFlags:])&DescMultiRecv == 0 {
			copy(buf, frame)
			if len(frame) > len(buf) {
				e.Status = StatusLocalLenErr
			}
			d.stats.Delivered++
			d.complete(r.recvDev, e)
			return
		}
		minFree := int(binary.LittleEndian.Uint32(b[OffDescMin:]))
		if minFree == 0 {
			minFree = MaxFrame
		}
		*m = multiBuf{active: true, buf: buf, id: e.ID, minFree: minFree}
	}
	e.ID = m.id
	e.BufOff = uint32(m.off)
	space := len(m.buf) - m.off
	copy(m.buf[m.off:], frame)
	if len(frame) > space {
		e.Status = StatusLocalLenErr // the error releases the buffer
		*m = multiBuf{}
	} else {
		m.off += (len(frame) + 63) &^ 63
		if len(m.buf)-m.off < m.minFree {
			e.DevFlags |= DevMultiRecv
			*m = multiBuf{}
		}
	}
	d.stats.Delivered++
	d.complete(r.recvDev, e)
}

// flushQP completes every operation still posted on q with
// StatusWRFlushErr, in posting order: the multi-receive buffer being
// filled, the receives not reached, then the sends not taken. Called by
// Close with d.mu held, before the rings are freed.
func (d *Device) flushQP(q *QP) {
	le := binary.LittleEndian
	if m := &q.multi; m.active {
		d.complete(q.recvDev, cqe{CQE: CQE{ID: m.id, Queue: uint16(2*q.num + 1), Opcode: OpRecv, Status: StatusWRFlushErr}})
		*m = multiBuf{}
	}
	for tail := q.rqTailR.Read(); q.drqHead != tail; q.drqHead++ {
		b := q.rq[(q.drqHead&(q.rqSize-1))*DescSize:][:DescSize]
		d.complete(q.recvDev, cqe{CQE: CQE{ID: le.Uint32(b[OffDescID:]), Queue: uint16(2*q.num + 1), Opcode: OpRecv, Status: StatusWRFlushErr}})
	}
	for tail := q.sqTailR.Read(); q.dsqHead != tail; q.dsqHead++ {
		b := q.sq[(q.dsqHead&(q.sqSize-1))*DescSize:][:DescSize]
		d.complete(q.sendDev, cqe{CQE: CQE{ID: le.Uint32(b[OffDescID:]), Queue: uint16(2 * q.num), Opcode: OpSend, Status: StatusWRFlushErr}})
	}
}
