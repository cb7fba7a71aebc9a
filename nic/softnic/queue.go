package softnic

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/vfnic/vfnic/cq"
	cqring "github.com/vfnic/vfnic/cq/ring"
	"github.com/vfnic/vfnic/dma"
	"github.com/vfnic/vfnic/doorbell"
	"github.com/vfnic/vfnic/eventfd"
	"github.com/vfnic/vfnic/hugepage"
	"github.com/vfnic/vfnic/nic"
	qcore "github.com/vfnic/vfnic/nic/internal/queue"
	"github.com/vfnic/vfnic/nic/internal/rxbuf"
)

// desc is a posted operation as the device reads it: the buffer's device
// address and length, and the id its completion carries.
type desc struct {
	addr uint64
	len  uint32
	id   uint32
}

// queue is what receive and transmit queues share: the core's queue
// (lock, closed state, the CQ fed, counters, Poll, the CQ's reader, what
// a close owes) over the software ring. The driver side is guarded by
// Mu; the device side (dev) by its own lock; they meet through the
// published tail and the consumed head (atomics) and the completion
// ring's ownership bits, as a driver and a device do.
type queue struct {
	qcore.Queue

	d  *Device
	rx bool
	n  uint32 // descriptors, and operations outstanding at most

	src *cqring.RingSource
	tab *cqring.Table

	desc []desc        // n, written by the driver at tail, read by the device at head
	tail uint32        // driver: descriptors posted (free-running)
	pub  atomic.Uint32 // the tail published by Flush
	head atomic.Uint32 // device: descriptors consumed (free-running)
	out  int           // operations posted and not completed
	mem  []byte        // the queue's DMA region, which the device translates into
	base uint64        // its device address
	dev  *devRing      // the device side
	rgn  *dma.Region   // freed with the device's space
	armd bool          // the device side is armed (Arm, until a Poll reads)
	skip bool          // receive: the next completions are the rest of a frame spanning buffers
	max  int           // transmit: the largest frame
}

// newQueue sets up the memory, rings and reader of a queue with n
// descriptors and extra bytes for its buffers. Its interrupt is vector
// 2i (receive) or 2i+1 (transmit), as its cq.Entry.Queue number.
func newQueue(d *Device, q *queue, i, n int, rx bool, extra int, mem hugepage.Options) error {
	kind, qnum := "tx", 2*i+1
	if rx {
		kind, qnum = "rx", 2*i
	}
	q.d, q.rx, q.n = d, rx, uint32(n)
	q.Name, q.Pair, q.Vector, q.QNum, q.Driver = fmt.Sprintf("%s%d", kind, i), i, qnum, uint32(qnum), "softnic"
	efd, err := eventfd.New()
	if err != nil {
		return err
	}
	q.EFD = efd
	d.efds = append(d.efds, efd) // closed by hw
	entries := 2 * n             // room for the entries ring faults add
	r, err := d.space.Alloc(entries*entrySize+64+extra+4096, mem)
	if err != nil {
		return fmt.Errorf("softnic: %s memory: %w", q.Name, err)
	}
	q.rgn, q.mem, q.base = r, r.Bytes(), r.IOVA()
	ring, err := r.Carve(entries*entrySize, 64)
	if err != nil {
		return err
	}
	page, err := r.Carve(64, 64)
	if err != nil {
		return err
	}
	if q.dev, err = newDevRing(ring.Bytes, page.Bytes, entries, efd); err != nil {
		return err
	}
	q.src, err = cqring.NewRingSource(cqring.RingConfig{
		Mem: ring.Bytes, Layout: layout(entries), Codes: codes,
		Regs: cqring.RingRegs{Doorbell: doorbell.NewDoorbell(q.dev.cons)},
	})
	if err != nil {
		return err
	}
	if q.tab, err = cqring.NewTable(n, 32); err != nil {
		return err
	}
	if err := q.src.BindTable(0, q.tab); err != nil {
		return err
	}
	q.desc = make([]desc, n)
	return nil
}

// room reports whether an operation can be posted. Called locked.
func (q *queue) room() bool { return q.out < int(q.n) && q.tail-q.head.Load() < q.n }

// post records op, in posting order (Word), and writes its descriptor at
// the tail, for the buffer at device address addr; it returns the
// descriptor and the table slot op took. Called locked.
func (q *queue) post(op *cqring.Op, addr uint64) (*desc, uint32, error) {
	if err := q.Usable(); err != nil {
		return nil, 0, err
	}
	if !q.room() {
		return nil, 0, qcore.ErrNoDesc
	}
	op.Word = q.Word(0)
	id, err := q.tab.Post(*op)
	if err != nil {
		return nil, 0, errors.Join(qcore.ErrNoDesc, err)
	}
	ds := &q.desc[q.tail&(q.n-1)]
	*ds = desc{addr: addr, len: uint32(op.Len), id: id}
	q.tail++
	q.out++
	return ds, id & (q.n - 1), nil
}

// ring is a queue's qcore.Ring (and a receive queue's qcore.RxPoster):
// the driver's side of the software ring. The core calls it locked.
type ring struct{ q *queue }

// Read implements qcore.Ring: the ring reader's batch read and checks,
// then the queue's pass: a receive buffer whose frame goes on in the next
// one (statusMore), and the last buffer of such a frame, complete with
// cq.ProvMultiBuffer (cq.ETRUNC).
func (r ring) Read(cs []cqring.Completion) int {
	q := r.q
	n := q.src.NextBatch(cs)
	for i := range cs[:n] {
		c := &cs[i]
		if !c.Done {
			continue // an entry naming nothing outstanding: an error with no buffer
		}
		q.out--
		switch {
		case !q.rx:
		case c.Prov == provMultiBuffer:
			q.skip = true // the rest of the frame follows
			c.Prov = cq.ProvMultiBuffer
		case c.Err == 0 && q.skip:
			q.skip = false // the last part of a frame spanning buffers
			c.Err, c.Prov = cq.ETRUNC, cq.ProvMultiBuffer
		}
	}
	return n
}

// Publish implements qcore.Ring.
func (r ring) Publish() { r.q.src.Publish() }

// Pending implements qcore.Ring.
func (r ring) Pending(max int) int { return r.q.src.Pending(max) }

// Outstanding implements qcore.Ring.
func (r ring) Outstanding() int { return r.q.out }

// Broken implements qcore.Ring: the driver reads only what the ring
// reader accepts and the device never loses step with the tail.
func (r ring) Broken() bool { return false }

// Notify implements qcore.Ring: the tail goes to the device, and a
// transmit queue's device carries what was posted to the wire before it
// returns (Flush).
func (r ring) Notify() (rang, suppressed bool) {
	q := r.q
	if q.pub.Load() == q.tail {
		return false, false
	}
	q.pub.Store(q.tail)
	if !q.rx {
		q.transmit()
	}
	return true, false
}

// Arm implements qcore.Ring: one interrupt once threshold completions
// beyond those read are written, counting only completions written after
// the arm (the strictest hardware: callers poll again after arming), so
// never late. Not ok when the CQ the queue feeds has no eventfd.
func (r ring) Arm(threshold int) (late, ok bool) {
	q := r.q
	if !q.dev.arm(q.src.Ring().Count(), threshold) {
		return false, false
	}
	q.armd = true
	return false, true
}

// Disarm implements qcore.Ring.
func (r ring) Disarm() {
	if r.q.armd {
		r.q.armd = false
		r.q.dev.disarm()
	}
}

// Err implements qcore.Ring: every refused completion carries the ring
// reader's code (the device's statuses are OK and MORE, which Read turns
// into cq.ProvMultiBuffer).
func (r ring) Err(c *cqring.Completion) error {
	if err := c.Prov.Refusal(); err != nil {
		return err
	}
	return nic.ErrDeviceStatus
}

// StrError implements qcore.Ring.
func (r ring) StrError(prov cq.ProvErrno, data []byte) (string, bool) {
	return r.q.src.StrError(prov, data)
}

// Table implements qcore.Ring.
func (r ring) Table() *cqring.Table { return r.q.tab }

// Raised counts the interrupts the device raised on the queue (on its
// eventfd, or the CQ's it feeds), whether or not a reader took them.
func (q *queue) Raised() uint64 { return q.dev.raised.Load() }

// translate is the device's IOMMU: the n bytes at device address addr,
// nil when they are not all inside the queue's memory.
func (q *queue) translate(addr uint64, n uint32) []byte {
	if addr < q.base || addr-q.base > uint64(len(q.mem)) || uint64(len(q.mem))-(addr-q.base) < uint64(n) {
		return nil
	}
	off := addr - q.base
	return q.mem[off : off+uint64(n) : off+uint64(n)]
}

// RxQueue is a receive queue (nic.RxQueue).
type RxQueue struct {
	queue
	qcore.Rx
	bufs   rxbuf.Pool
	bufLen uint32
}

var (
	_ nic.RxQueue          = (*RxQueue)(nil)
	_ nic.TxQueue          = (*TxQueue)(nil)
	_ nic.InterruptSteerer = (*RxQueue)(nil)
	_ nic.InterruptSteerer = (*TxQueue)(nil)
)

func newRxQueue(d *Device, i, n, bufs, bufSize int, mem hugepage.Options) (*RxQueue, error) {
	q := &RxQueue{bufLen: uint32(bufSize)}
	stride := (bufSize + 63) &^ 63
	if err := newQueue(d, &q.queue, i, n, true, bufs*stride, mem); err != nil {
		return nil, err
	}
	p, err := dma.NewPool(q.rgn, bufs, bufSize)
	if err != nil {
		return nil, err
	}
	q.bufs = rxbuf.New(p, 0)
	r := ring{&q.queue}
	q.Queue.Init(r, n, &q.bufs)
	q.Rx = qcore.NewRx(&q.Queue, rxPoster{q}, bufSize)
	return q, nil
}

// rxPoster is a receive queue's qcore.RxPoster.
type rxPoster struct{ q *RxQueue }

// Room implements qcore.RxPoster.
func (p rxPoster) Room(held int) bool {
	q := p.q
	return q.out+held < int(q.n) && q.tail-q.head.Load()+uint32(held) < q.n
}

// PostBuf implements qcore.RxPoster.
func (p rxPoster) PostBuf(b uint32, ctx any) error {
	q := p.q
	op := cqring.Op{Context: ctx, Buf: q.bufs.Start(b), Len: int(q.bufLen), Flags: cq.FlagRecv | cq.FlagMsg}
	_, _, err := q.post(&op, q.bufs.Addr(b))
	return err
}

// Outcomes of a frame handed to a receive queue.
const (
	received = iota
	noBuffer
	closed
)

// receive is the device taking a frame off the wire: it fills the posted
// buffers in order (several for a frame longer than one, all but the last
// completing with statusMore), or drops the frame when too few are
// posted, then raises the interrupt if one was armed.
func (q *RxQueue) receive(frame []byte) int {
	r := q.dev
	r.mu.Lock()
	if r.dead {
		r.mu.Unlock()
		return closed
	}
	head, end := q.head.Load(), q.pub.Load()
	// Enough buffers for the whole frame, or none is touched.
	room, need := uint32(0), uint32(len(frame))
	for h := head; h != end && room < max(need, 1); h++ {
		room += q.desc[h&(q.n-1)].len
	}
	if room < max(need, 1) {
		r.mu.Unlock()
		return noBuffer
	}
	for first := true; first || len(frame) > 0; first = false {
		ds := q.desc[head&(q.n-1)]
		// The descriptor is consumed before its completion is written:
		// a driver that reads the completion and posts again must find
		// the slot free.
		head++
		q.head.Store(head)
		k := min(uint32(len(frame)), ds.len)
		buf := q.translate(ds.addr, k)
		if buf == nil {
			k = 0 // a descriptor outside the queue's memory: nothing written
		}
		copy(buf, frame[:k])
		frame = frame[min(len(frame), int(ds.len)):]
		st := uint8(statusOK)
		if len(frame) > 0 {
			st = statusMore
		}
		r.complete(ds.id, k, st)
	}
	r.mu.Unlock()
	r.raise()
	return received
}

// TxQueue is a transmit queue (nic.TxQueue). The frame of the operation
// in table slot i is copied into transmit buffer i.
type TxQueue struct {
	queue
	pool *dma.Pool
}

func newTxQueue(d *Device, i, n, maxFrame int, mem hugepage.Options) (*TxQueue, error) {
	q := &TxQueue{}
	stride := (maxFrame + 63) &^ 63
	if err := newQueue(d, &q.queue, i, n, false, n*stride, mem); err != nil {
		return nil, err
	}
	var err error
	if q.pool, err = dma.NewPool(q.rgn, n, maxFrame); err != nil {
		return nil, err
	}
	q.max = maxFrame
	q.Queue.Init(ring{&q.queue}, n, nil)
	return q, nil
}

// Send implements nic.TxQueue.
func (q *TxQueue) Send(frame []byte, ctx any) error { return q.send(len(frame), ctx, frame, nil) }

// SendFunc implements nic.TxQueue: fill writes into transmit buffer i of
// the posting's table slot i.
func (q *TxQueue) SendFunc(n int, ctx any, fill func([]byte)) error {
	return qcore.SendFunc(q.send, n, ctx, fill)
}

// SendBurst implements nic.TxQueue: one lock for the burst.
func (q *TxQueue) SendBurst(frames [][]byte, ctxs []any) (int, error) {
	return q.BurstVia(frames, ctxs, q.max, q.postFrame)
}

// send posts an n-byte frame, copied from frame or written by fill.
func (q *TxQueue) send(n int, ctx any, frame []byte, fill func([]byte)) error {
	if err := q.LockSend(n, q.max); err != nil {
		return err
	}
	defer q.Mu.Unlock()
	return q.postFrame(n, ctx, frame, fill)
}

// postFrame is send's qcore.Post: the frame into the buffer of its table
// slot, the descriptor written.
func (q *TxQueue) postFrame(n int, ctx any, frame []byte, fill func([]byte)) error {
	op := cqring.Op{Context: ctx, Len: n, Flags: cq.FlagSend | cq.FlagMsg}
	ds, slot, err := q.post(&op, 0)
	if err != nil {
		return err
	}
	qcore.Write(q.pool.Buf(slot)[:n:n], frame, fill)
	ds.addr = q.pool.Addr(slot) // read by the device once Flush publishes it
	return nil
}

// MaxFrame implements nic.TxQueue: MTU plus nic.FrameOverhead.
func (q *TxQueue) MaxFrame() int { return q.max }

// transmit is the device's side of a Flush: each published descriptor's
// frame goes to the wire, then its completion into the ring; the
// interrupt, if armed, once the ring is unlocked.
func (q *queue) transmit() {
	r := q.dev
	r.mu.Lock()
	if r.dead {
		r.mu.Unlock()
		return
	}
	head, end := q.head.Load(), q.pub.Load()
	for head != end {
		ds := q.desc[head&(q.n-1)]
		head++
		q.head.Store(head) // consumed before its completion is written (receive)
		if frame := q.translate(ds.addr, ds.len); frame != nil {
			q.d.wire.carry(q.d.end, q.Pair, frame)
		}
		r.complete(ds.id, ds.len, statusOK)
	}
	r.mu.Unlock()
	r.raise()
}
