package virtio

import (
	"fmt"

	"github.com/vfnic/vfnic/cq"
	cqring "github.com/vfnic/vfnic/cq/ring"
	"github.com/vfnic/vfnic/dma"
	"github.com/vfnic/vfnic/eventfd"
	"github.com/vfnic/vfnic/nic"
	qcore "github.com/vfnic/vfnic/nic/internal/queue"
	"github.com/vfnic/vfnic/nic/internal/rxbuf"
)

// queue is what receive and transmit queues share: the core's queue
// (lock, closed state, the CQ fed, counters, Poll, the CQ's reader) over
// the virtqueue.
type queue struct {
	qcore.Queue
	vq *vq
}

// init sets the core's identity of a queue over v: no vector until the
// device assigns one.
func (q *queue) init(v *vq, index int, efd *eventfd.FD) {
	q.vq = v
	q.Name, q.Pair, q.Vector, q.EFD = v.name, index, -1, efd
	q.QNum, q.Driver = uint32(v.qidx), "virtio"
}

// vqRing is the part of qcore.Ring both directions share: the
// virtqueue's publishing, counting and event suppression.
type vqRing struct{ v *vq }

// Publish implements qcore.Ring.
func (r vqRing) Publish() { r.v.publishUsed() }

// Pending implements qcore.Ring.
func (r vqRing) Pending(max int) int { return r.v.pending(max) }

// Outstanding implements qcore.Ring.
func (r vqRing) Outstanding() int { return r.v.nbufs }

// Broken implements qcore.Ring.
func (r vqRing) Broken() bool { return r.v.broken }

// Notify implements qcore.Ring.
func (r vqRing) Notify() (rang, suppressed bool) {
	n0, s0 := r.v.notifies, r.v.suppressed
	r.v.flush()
	return r.v.notifies != n0, r.v.suppressed != s0
}

// Arm implements qcore.Ring with the ring's event suppression: the
// packed ring's descriptor event (or the split ring's used_event) aimed
// at the threshold, else used-buffer notifications on.
func (r vqRing) Arm(threshold int) (late, ok bool) { return r.v.arm(threshold), true }

// Disarm implements qcore.Ring.
func (r vqRing) Disarm() {
	if r.v.armed {
		r.v.disarm()
	}
}

// StrError implements qcore.Ring: virtio reports cq's own codes, which
// the CQ describes itself, and a refused virtio-net header.
func (r vqRing) StrError(p cq.ProvErrno, _ []byte) (string, bool) {
	if p == provBadNetHdr {
		return errBadNetHdr.Error(), true
	}
	return "", false
}

// Table implements qcore.Ring.
func (r vqRing) Table() *cqring.Table { return r.v.tab }

// RxQueue is a virtio-net receive queue (nic.RxQueue).
type RxQueue struct {
	queue
	qcore.Rx
	bufs    rxbuf.Pool // frames netHdrLen bytes into each buffer
	bufSize uint32
	mrg     bool // MRG_RXBUF: check num_buffers
	skip    int  // buffers of a multi-buffer frame still to drop
	span    int  // buffers of that frame in all
	// csum: GUEST_CSUM, each header is checked and its checksum state
	// kept per buffer in meta (nethdr.go).
	csum bool
	// keepPartial: the consumer takes NEEDS_CSUM frames as they come
	// (KeepPartialChecksums); else the read pass completes each.
	keepPartial bool
	meta        []rxMeta
	offloadCounters
	// mbErrs are the multi-buffer errors of the batch the pass last
	// made, by position (a completion's Meta[0]).
	mbErrs [qcore.Batch]*nic.MultiBufferError
}

var (
	_ nic.RxQueue          = (*RxQueue)(nil)
	_ nic.InterruptSteerer = (*RxQueue)(nil)
)

func newRxQueue(v *vq, index int, efd *eventfd.FD, pool *dma.Pool, mrg bool) (*RxQueue, error) {
	if err := v.setReader(usedRx); err != nil {
		return nil, err
	}
	q := &RxQueue{bufs: rxbuf.New(pool, netHdrLen), bufSize: uint32(pool.BufSize()), mrg: mrg}
	q.init(v, index, efd)
	r := rxRing{vqRing{v}, q}
	q.Queue.Init(r, int(v.size), &q.bufs)
	q.Rx = qcore.NewRx(&q.Queue, r, int(q.bufSize)-netHdrLen)
	return q, nil
}

// rxRing is a receive queue's qcore.Ring and qcore.RxPoster.
type rxRing struct {
	vqRing
	q *RxQueue
}

// Room implements qcore.RxPoster: a receive buffer is one descriptor.
func (r rxRing) Room(held int) bool { return r.v.room() >= 1+held }

// PostBuf implements qcore.RxPoster: pool buffer b, one descriptor the
// device writes. ErrNoDesc when no id is free yet (ids freed by a read
// are published at its end).
func (r rxRing) PostBuf(b uint32, ctx any) error {
	q := r.q
	id, ok := r.v.reserve(&cqring.Op{Context: ctx, Buf: q.bufs.Start(b), Len: int(q.bufSize),
		Flags: cq.FlagRecv | cq.FlagMsg, Word: q.Word(0)}, 1)
	if !ok {
		return qcore.ErrNoDesc
	}
	r.v.add(id, q.bufs.Addr(b), q.bufSize, descWrite)
	return nil
}

// TxQueue is a virtio-net transmit queue (nic.TxQueue). Buffer id i always
// uses transmit buffer i, whose virtio-net header stays zero unless the
// queue has checksum offload (SendL4Checksum writes it per frame).
type TxQueue struct {
	queue
	pool     *dma.Pool
	maxFrame int
	csum     bool // CSUM negotiated: SendL4Checksum works
	offloadCounters
}

var (
	_ nic.TxQueue          = (*TxQueue)(nil)
	_ nic.InterruptSteerer = (*TxQueue)(nil)
)

func newTxQueue(v *vq, index int, efd *eventfd.FD, pool *dma.Pool, mtu int) (*TxQueue, error) {
	if err := v.setReader(usedTx); err != nil {
		return nil, err
	}
	if pool.Cap() < int(v.size) {
		return nil, fmt.Errorf("%w: %s: %d transmit buffers for %d descriptors", nic.ErrInvalid, v.name, pool.Cap(), v.size)
	}
	q := &TxQueue{pool: pool, maxFrame: min(pool.BufSize()-netHdrLen, mtu+nic.FrameOverhead)}
	q.init(v, index, efd)
	q.Queue.Init(txRing{vqRing{v}}, int(v.size), nil)
	return q, nil
}

// MaxFrame implements nic.TxQueue.
func (q *TxQueue) MaxFrame() int { return q.maxFrame }

// Send implements nic.TxQueue.
func (q *TxQueue) Send(frame []byte, ctx any) error { return q.post(len(frame), ctx, frame, nil) }

// SendFunc implements nic.TxQueue: fill writes into the transmit buffer
// of the descriptor, after its virtio-net header.
func (q *TxQueue) SendFunc(n int, ctx any, fill func([]byte)) error {
	return qcore.SendFunc(q.post, n, ctx, fill)
}

// post is send without the checksum offload.
func (q *TxQueue) post(n int, ctx any, frame []byte, fill func([]byte)) error {
	return q.send(n, ctx, frame, fill, false)
}

// send posts an n-byte frame, copied from frame or written by fill, with
// NEEDS_CSUM when partial (SendL4Checksum, which copies).
func (q *TxQueue) send(size int, ctx any, frame []byte, fill func([]byte), partial bool) error {
	if size < nic.MinFrame || size > q.maxFrame {
		// Allocates, as a caller's mistake may: the numbers say what is wrong.
		return fmt.Errorf("%w: frame of %d bytes outside [%d, %d]", nic.ErrFrameSize, size, nic.MinFrame, q.maxFrame)
	}
	if partial {
		if _, _, ok := l4Partial(frame, false); !ok {
			return errNoL4
		}
	}
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if err := q.Usable(); err != nil {
		return err
	}
	return q.put(size, ctx, frame, fill, partial)
}

// SendBurst implements nic.TxQueue: one lock for the burst, a descriptor
// per frame as Send's.
func (q *TxQueue) SendBurst(frames [][]byte, ctxs []any) (int, error) {
	return q.BurstVia(frames, ctxs, q.maxFrame, q.postPlain)
}

// postPlain is SendBurst's qcore.Post: put without the checksum offload.
func (q *TxQueue) postPlain(n int, ctx any, frame []byte, fill func([]byte)) error {
	return q.put(n, ctx, frame, fill, false)
}

// put posts a checked size-byte frame on a usable queue. Called locked.
func (q *TxQueue) put(size int, ctx any, frame []byte, fill func([]byte), partial bool) error {
	if q.vq.room() < 1 {
		return qcore.ErrNoDesc
	}
	id, ok := q.vq.reserve(&cqring.Op{Context: ctx, Len: size, Flags: cq.FlagSend | cq.FlagMsg, Word: q.Word(0)}, 1)
	if !ok {
		return qcore.ErrNoDesc
	}
	b := q.pool.Buf(uint32(id))
	n := netHdrLen + size
	qcore.Write(b[netHdrLen:n:n], frame, fill)
	if q.csum {
		// The buffer's header may hold a previous frame's offload.
		var h netHdr
		if partial {
			// From the queue's copy: what the device reads. A frame the
			// caller changed during the call so that it no longer parses
			// goes out as it is, without the offload.
			if start, off, ok := l4Partial(b[netHdrLen:n], true); ok {
				h = netHdr{flags: netHdrNeedsCsum, csumStart: start, csumOffset: off}
				q.txPartial.Add(1)
			}
		}
		h.encode(b)
	}
	q.vq.add(id, q.pool.Addr(uint32(id)), uint32(n), 0)
	return nil
}
