package afxdp

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/vfnic/vfnic/cq"
	cqring "github.com/vfnic/vfnic/cq/ring"
	"github.com/vfnic/vfnic/doorbell"
	"github.com/vfnic/vfnic/nic"
	qcore "github.com/vfnic/vfnic/nic/internal/queue"
	"github.com/vfnic/vfnic/nic/internal/rxbuf"
)

// TxOwedWait is the longest a transmit queue's WaitInterrupt sleeps while
// sends are owed on a socket bound in zero-copy mode: there the driver
// writes completions (xsk_tx_completed) with no wake-up, so the
// completion ring is looked at again after it. In copy mode the kernel
// raises the socket's write readiness for each send it completes, and a
// transmit queue sleeps on that with no bound.
var TxOwedWait = time.Millisecond

// queue is what receive and transmit queues share: the core's queue
// (lock, closed state, the CQ fed, counters, Poll, the CQ's reader, what
// a close owes) over the ring the kernel writes (receive or completion),
// read by cq/ring, and the ring this queue produces (fill or transmit).
type queue struct {
	qcore.Queue
	x *xsk
	// sr reads the ring the kernel writes; sr.Out counts the postings
	// the kernel has not completed.
	sr qcore.SourceRing
	// prod is the ring this queue produces (fill or transmit); pub the
	// producer index last published on it.
	prod   *ring
	pub    uint32
	broken bool
	// kickErr is a failed kick's error, for the Flush that made it.
	kickErr error
}

// init makes the reader of ring r (receive or completion) with layout l
// and a table of n slots, and gives the core the queue's ring.
func (q *queue) init(rd qcore.Ring, r *ring, l cqring.Layout, n int, bufs *rxbuf.Pool) error {
	l.Name += "-" + q.Name
	var err error
	q.sr, err = qcore.NewSourceRing(cqring.RingConfig{Mem: r.desc, Layout: l,
		Regs: cqring.RingRegs{Producer: r.word(r.prod), Doorbell: doorbell.NewDoorbell(r.word(r.cons))}}, n)
	if err != nil {
		return err
	}
	q.sr.Src.Ring().SetProducerLimit(0) // nothing handed over yet
	q.Queue.Init(rd, int(r.n), bufs)
	return nil
}

// reader is a queue's qcore.Ring: the parts receive and transmit share.
// The core calls it locked.
type reader struct {
	*qcore.SourceRing
	q *queue
}

// read takes a batch through the ring reader (the one read of each entry
// and the table's checks). A producer index out of step with what was
// handed over stops the queue (nic.ErrBroken).
func (r reader) read(cs []cqring.Completion) int {
	if r.q.broken {
		return 0
	}
	n := r.Take(cs)
	for i := range cs[:n] {
		if cs[i].Prov == cq.ProvBadIndex {
			r.q.broken = true
		}
	}
	return n
}

// Broken implements qcore.Ring.
func (r reader) Broken() bool { return r.q.broken }

// NotifyErr implements qcore.Notifier: a failed kick's error, once.
func (r reader) NotifyErr() error {
	err := r.q.kickErr
	r.q.kickErr = nil
	return err
}

// notify publishes the produced ring's new entries and kicks the kernel
// with kick when it asked for it.
func (r reader) notify(kick func() error) (rang, suppressed bool) {
	q := r.q
	if q.prod.next == q.pub {
		return false, false
	}
	q.prod.publish()
	q.pub = q.prod.next
	q.sr.Src.Ring().SetProducerLimit(q.pub)
	if !q.prod.needWakeup() {
		return false, true
	}
	q.kickErr = kick()
	return true, false
}

// RxQueue is a receive queue: the socket's fill and receive rings
// (nic.RxQueue). Receive buffer b is UMEM chunk base+b, and the slot of
// its posting in the table is that chunk: the address the kernel writes
// names the posting.
type RxQueue struct {
	queue
	qcore.Rx
	bufs rxbuf.Pool
	base uint32 // chunk of buffer 0
}

var _ nic.RxQueue = (*RxQueue)(nil)

func newRxQueue(x *xsk, pair int, name string, nbufs int) (*RxQueue, error) {
	base := int(x.tx.n) // the transmit chunks come first
	pool, err := dmaPool(x, base, nbufs)
	if err != nil {
		return nil, err
	}
	q := &RxQueue{bufs: rxbuf.New(pool, headroom), base: uint32(base)}
	q.x, q.prod = x, &x.fill
	q.Name, q.Pair, q.Vector, q.EFD, q.QNum, q.Driver = "rx-"+name, pair, -1, x.irq, uint32(2*pair), "afxdp"
	if err := q.init(rxReader{reader{&q.sr, &q.queue}}, &x.rx, RxLayout(int(x.rx.n), x.shift), base+nbufs, &q.bufs); err != nil {
		return nil, err
	}
	q.Rx = qcore.NewRx(&q.Queue, rxPoster{q}, x.chunk-headroom)
	return q, nil
}

// rxPoster is a receive queue's qcore.RxPoster.
type rxPoster struct{ q *RxQueue }

// Room implements qcore.RxPoster: the fill ring (and the receive ring,
// for the frames) hold a ring of postings.
func (p rxPoster) Room(held int) bool { return p.q.sr.Out+held < int(p.q.x.fill.n) }

// PostBuf implements qcore.RxPoster: buffer b goes to the kernel through
// the fill ring.
func (p rxPoster) PostBuf(b uint32, ctx any) error {
	q := p.q
	chunk := q.base + b
	op := cqring.Op{Context: ctx, Buf: q.bufs.Start(b), Len: q.MaxFrame(), Flags: cq.FlagRecv | cq.FlagMsg, Word: q.Word(0)}
	if _, err := q.sr.Tab.PostSlot(chunk, op); err != nil {
		return qcore.ErrNoDesc // not reachable: a buffer not posted has its slot free
	}
	q.x.fill.putAddr(uint64(chunk) << q.x.shift)
	q.sr.Out++
	return nil
}

// rxReader is a receive queue's qcore.Ring.
type rxReader struct{ reader }

// Read implements qcore.Ring: the ring reader's checks of each descriptor
// (its address names a posted buffer, its length fits it, its options are
// 0), then the frame's place in the buffer, from the same copy: the
// offset the kernel wrote must be the XDP headroom and no address bit
// beyond the chunk may be set (cq.ProvBadID), and the frame must hold an
// Ethernet header (cq.ProvBadLen). A good frame's Buf is its first byte.
func (r rxReader) Read(cs []cqring.Completion) int {
	n := r.read(cs)
	for i := range cs[:n] {
		c := &cs[i]
		switch {
		case c.Err != 0:
		case c.Meta[0] != headroom || c.Meta[1] != 0:
			c.Err, c.Prov = cq.EIO, cq.ProvBadID
		case c.Len < nic.MinFrame:
			c.Err, c.Prov = cq.EIO, cq.ProvBadLen
		default:
			c.Buf += headroom
		}
	}
	return n
}

// Notify implements qcore.Ring.
func (r rxReader) Notify() (rang, suppressed bool) { return r.notify(r.q.x.kickFill) }

// Arm implements qcore.Ring: the socket is readable while its receive
// ring holds frames, so there is nothing to arm, except that a kernel
// that asked to be woken for the fill ring is woken now (else no frame
// would come to wake the caller).
func (r rxReader) Arm(threshold int) (late, ok bool) {
	q := r.q
	if q.sr.Out > 0 && q.x.fill.needWakeup() {
		q.Notifies.Add(1)
		q.kickErr = q.x.kickFill()
	}
	return r.q.ArmReadiness()
}

// TxQueue is a transmit queue: the socket's transmit and completion rings
// (nic.TxQueue). A send's buffer is the UMEM chunk of its posting's slot.
type TxQueue struct {
	queue
	maxFrame int
	// free holds the chunks of the slots not posted: a send takes the
	// chunk whose send completed last, which the kernel's copy just read.
	// Taken in ring order instead, a 2048-entry ring cycles through 8 MiB
	// of UMEM, and the kernel's copy of frames written only in their
	// headers (SendFunc) ran at 0.6-0.7x of the rate with 256 entries.
	free qcore.FreeSlots
}

var _ nic.TxQueue = (*TxQueue)(nil)

func newTxQueue(x *xsk, pair int, name string, maxFrame int) (*TxQueue, error) {
	q := &TxQueue{maxFrame: maxFrame, free: qcore.NewFreeSlots(int(x.tx.n))}
	q.x, q.prod = x, &x.tx
	q.Name, q.Pair, q.Vector, q.EFD, q.QNum, q.Driver = "tx-"+name, pair, -1, x.irq, uint32(2*pair+1), "afxdp"
	if x.wirq != nil {
		// Copy mode: the write readiness lasts (the transmit ring has
		// room) with nothing completed; each completion raises an event,
		// after which the wait looks at the completion ring.
		q.EFD, q.Lasting = x.wirq, true
	}
	if err := q.init(txReader{reader{&q.sr, &q.queue}, q}, &x.comp, CompLayout(int(x.comp.n), x.shift), int(x.tx.n), nil); err != nil {
		return nil, err
	}
	return q, nil
}

// MaxFrame implements nic.TxQueue.
func (q *TxQueue) MaxFrame() int { return q.maxFrame }

// Send implements nic.TxQueue.
func (q *TxQueue) Send(frame []byte, ctx any) error { return q.send(len(frame), ctx, frame, nil) }

// SendFunc implements nic.TxQueue: fill writes into the UMEM chunk the
// transmit descriptor names.
func (q *TxQueue) SendFunc(n int, ctx any, fill func([]byte)) error {
	return qcore.SendFunc(q.send, n, ctx, fill)
}

// SendBurst implements nic.TxQueue: one lock for the burst.
func (q *TxQueue) SendBurst(frames [][]byte, ctxs []any) (int, error) {
	return q.BurstVia(frames, ctxs, q.maxFrame, q.post)
}

// send posts an n-byte frame, copied from frame or written by fill.
func (q *TxQueue) send(n int, ctx any, frame []byte, fill func([]byte)) error {
	if err := q.LockSend(n, q.maxFrame); err != nil {
		return err
	}
	defer q.Mu.Unlock()
	return q.post(n, ctx, frame, fill)
}

// post is send's qcore.Post: the frame into the chunk of a free slot, its
// descriptor into the transmit ring.
func (q *TxQueue) post(n int, ctx any, frame []byte, fill func([]byte)) error {
	chunk, err := q.free.Post(q.sr.Tab, cqring.Op{Context: ctx, Len: n, Flags: cq.FlagSend | cq.FlagMsg, Word: q.Word(0)})
	if err != nil {
		return err
	}
	addr := uint64(chunk) << q.x.shift
	end := addr + uint64(n)
	qcore.Write(q.x.mem[addr:end:end], frame, fill)
	q.x.tx.putDesc(addr, uint32(n))
	q.sr.Out++
	return nil
}

// WaitInterrupt implements nic.Queue. In copy mode it sleeps on the
// socket's write readiness until the completion ring holds a completion.
// In zero-copy mode, which signals no completion, it sleeps on the pair's
// read readiness, for at most TxOwedWait while sends are owed (a spurious
// wake-up then, as nic.Queue allows, so that their completions are read).
func (q *TxQueue) WaitInterrupt(ctx context.Context, deadline time.Time) error {
	if q.x.wirq != nil {
		return q.Queue.WaitInterrupt(ctx, deadline)
	}
	q.Mu.Lock()
	owed := q.sr.Out > 0 && !q.Closed
	q.Mu.Unlock()
	if !owed {
		return q.Queue.WaitInterrupt(ctx, deadline)
	}
	capped := time.Now().Add(TxOwedWait)
	if !deadline.IsZero() && deadline.Before(capped) {
		return q.Queue.WaitInterrupt(ctx, deadline)
	}
	if err := q.Queue.WaitInterrupt(ctx, capped); err != nic.ErrTimeout {
		return err
	}
	return nil
}

// SRead implements nic.Queue, sleeping in the transmit queue's own
// WaitInterrupt.
func (q *TxQueue) SRead(ctx context.Context, out []nic.Completion, threshold int, timeout time.Duration) (int, error) {
	if q.Bound() {
		return 0, q.ErrBound()
	}
	return nic.SRead(ctx, q, out, threshold, timeout)
}

// txReader is a transmit queue's qcore.Ring.
type txReader struct {
	reader
	tx *TxQueue
}

// Read implements qcore.Ring: the reader's checks of the address (a
// posted send's chunk), then, from the same copy, its offset (0, where
// sends are posted) and the bits beyond the chunk (0). A completion
// reports the posted length. The chunk of each completed send goes back
// on the free stack.
func (r txReader) Read(cs []cqring.Completion) int {
	n := r.read(cs)
	r.tx.free.Release(cs[:n])
	for i := range cs[:n] {
		if c := &cs[i]; c.Err == 0 && (c.Meta[0] != 0 || c.Meta[1] != 0) {
			c.Err, c.Prov = cq.EIO, cq.ProvBadID
		}
	}
	return n
}

// Publish implements qcore.Ring: while sends published are still in the
// transmit ring, the kernel is kicked again when it asks (in copy mode it
// sends a bounded batch per system call).
func (r txReader) Publish() {
	r.Src.Publish()
	r.rekick()
}

// Notify implements qcore.Ring; a forwarder waiting for an armed CQ
// waits for these sends' completions now. A Flush with nothing new kicks
// the kernel again when it asks, for sends still in the transmit ring
// (copy mode sends a bounded batch per kick).
func (r txReader) Notify() (rang, suppressed bool) {
	rang, suppressed = r.notify(r.q.x.kick)
	if !rang && !suppressed {
		r.rekick()
	}
	if fw := r.q.FW; fw != nil {
		fw.Poke()
	}
	return rang, suppressed
}

// Arm implements qcore.Ring: the kernel is kicked for sends still in the
// transmit ring (in copy mode it sends a bounded batch per kick, and
// completes nothing it was not kicked for). Its write readiness then
// reports their completions; in zero-copy mode nothing does, and the
// wait after this arm is bounded while sends are owed (WaitInterrupt).
func (r txReader) Arm(threshold int) (late, ok bool) {
	r.rekick()
	return r.q.ArmReadiness()
}

// rekick kicks the kernel when published sends wait in the transmit ring
// and it asked for a kick. A failed kick is retried at the next poll.
func (r txReader) rekick() {
	q := r.q
	if q.sr.Out > 0 && q.pub != atomic.LoadUint32(q.x.tx.cons) && q.x.tx.needWakeup() {
		q.Notifies.Add(1)
		_ = q.x.kick()
	}
}
