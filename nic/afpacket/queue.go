package afpacket

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/vfnic/vfnic/cq"
	cqring "github.com/vfnic/vfnic/cq/ring"
	"github.com/vfnic/vfnic/nic"
	qcore "github.com/vfnic/vfnic/nic/internal/queue"
	"golang.org/x/sys/unix"
)

// Errors returned on the data path, prepared so that returning them does
// not allocate.
var (
	errNoBuffer  = fmt.Errorf("%w: every receive slot is posted or lent out (Release or Repost some)", nic.ErrFull)
	errNoDesc    = fmt.Errorf("%w: every send waits for Flush or for its completion to be read", nic.ErrFull)
	errNotLent   = fmt.Errorf("%w: buffer is not lent to the caller", nic.ErrBadBuffer)
	errNotBuffer = fmt.Errorf("%w: address is not a frame in this queue's ring", nic.ErrBadBuffer)
)

// hdrLen is struct tpacket2_hdr's size: a frame starts no closer to its
// slot's start.
const hdrLen = 32

// RxLayout describes a TPACKET_V2 receive ring of n slots of size bytes
// as cq/ring reads it: the slot's position is its id; tp_status (the
// first word) carries TP_STATUS_USER when the kernel has written a frame,
// cleared and replaced by Held when the reader consumes it; Len is
// tp_snaplen, Meta[0] tp_mac (the frame's offset in the slot) and Meta[1]
// tp_len (the frame's length on the wire).
func RxLayout(n, size int) cqring.Layout {
	return cqring.Layout{Name: "tpacket-v2", EntrySize: size, Entries: n,
		Convention: cqring.DescriptorDone, OwnerOff: 0, OwnerMask: unix.TP_STATUS_USER, Held: held, IDIsIndex: true,
		Fields: cqring.Fields{
			Len:  cqring.Field{Off: 8, Bits: 32},
			Meta: [2]cqring.Field{{Off: 12, Bits: 16}, {Off: 4, Bits: 32}},
		}}
}

// Slot states.
const (
	slotFree   = iota // the driver's (status Held), not posted
	slotPosted        // the kernel's (status zero, then USER)
	slotLent          // a frame lent to the caller (status Held)
)

// RxQueue is the receive queue: the TPACKET_V2 ring (nic.RxQueue).
type RxQueue struct {
	qcore.Core[struct{}]
	d      *Device
	ring   []byte
	size   int // slot size
	src    *cqring.RingSource
	tab    *cqring.Table
	state  []uint8
	mac    []uint16 // the lent frame's offset in its slot
	next   int      // the slot PostRecv tries first: after the last posted
	out    int
	broken bool
}

var _ nic.RxQueue = (*RxQueue)(nil)

func newRxQueue(d *Device, n, size int) (*RxQueue, error) {
	src, err := cqring.NewRingSource(cqring.RingConfig{Mem: d.ring, Layout: RxLayout(n, size)})
	if err != nil {
		return nil, fmt.Errorf("%w: afpacket: %v", nic.ErrInvalid, err)
	}
	tab, err := cqring.NewTable(n, bits.Len(uint(n-1)))
	if err != nil {
		return nil, err
	}
	if err := src.BindTable(0, tab); err != nil {
		return nil, err
	}
	return &RxQueue{Core: qcore.Core[struct{}]{Name: "rx-" + d.ifname, Vector: -1, EFD: d.irq},
		d: d, ring: d.ring, size: size, src: src, tab: tab, state: make([]uint8, n), mac: make([]uint16, n)}, nil
}

// status is slot i's tp_status word.
func (q *RxQueue) status(i int) *uint32 { return (*uint32)(unsafe.Pointer(&q.ring[i*q.size])) }

// Size implements nic.Queue.
func (q *RxQueue) Size() int { return len(q.state) }

// Outstanding implements nic.Queue.
func (q *RxQueue) Outstanding() int {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	return q.out
}

// MaxFrame implements nic.RxQueue: a slot less the kernel's headers
// (tpacket2_hdr, sockaddr_ll, alignment).
func (q *RxQueue) MaxFrame() int { return q.size - 66 }

func (q *RxQueue) usable() error {
	switch {
	case q.Closed:
		return q.CloseErr
	case q.broken:
		return nic.ErrBroken
	}
	return nil
}

// PostRecv implements nic.RxQueue: the first free slot from the one after
// the last posted, in ring order (the order the kernel fills them in).
func (q *RxQueue) PostRecv(ctx any) error {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if err := q.usable(); err != nil {
		return err
	}
	n := len(q.state)
	for k := range n {
		if i := (q.next + k) % n; q.state[i] == slotFree {
			return q.post(i, ctx)
		}
	}
	return errNoBuffer
}

// post hands slot i to the kernel: zero in its status word, after the
// table holds the posting. Called locked.
func (q *RxQueue) post(i int, ctx any) error {
	if _, err := q.tab.PostSlot(uint32(i), cqring.Op{Context: ctx, Buf: uintptr(unsafe.Pointer(&q.ring[i*q.size])),
		Len: q.size, Flags: cq.FlagRecv | cq.FlagMsg}); err != nil {
		return errNoBuffer
	}
	q.state[i] = slotPosted
	q.out++
	q.next = (i + 1) % len(q.state)
	atomic.StoreUint32(q.status(i), 0) // release: the kernel's from now on
	return nil
}

// lent returns the slot of a frame lent to the caller at buf.
func (q *RxQueue) lent(buf uintptr) (int, error) {
	base := uintptr(unsafe.Pointer(&q.ring[0]))
	if buf < base || buf >= base+uintptr(len(q.ring)) {
		return 0, errNotBuffer
	}
	i := int((buf - base) / uintptr(q.size))
	if q.state[i] != slotLent {
		return 0, errNotLent
	}
	if buf != base+uintptr(i*q.size)+uintptr(q.mac[i]) {
		return 0, errNotBuffer
	}
	return i, nil
}

// Repost implements nic.RxQueue.
func (q *RxQueue) Repost(buf uintptr, ctx any) error {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if err := q.usable(); err != nil {
		return err
	}
	i, err := q.lent(buf)
	if err != nil {
		return err
	}
	q.state[i] = slotFree
	return q.post(i, ctx)
}

// Release implements nic.RxQueue: the slot stays the driver's until
// PostRecv posts it again.
func (q *RxQueue) Release(buf uintptr) error {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if q.Closed {
		return nic.ErrClosed
	}
	i, err := q.lent(buf)
	if err != nil {
		return err
	}
	q.state[i] = slotFree
	return nil
}

// Frame implements nic.RxQueue.
func (q *RxQueue) Frame(buf uintptr, length int) ([]byte, error) {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if q.Closed {
		return nil, nic.ErrClosed
	}
	i, err := q.lent(buf)
	if err != nil {
		return nil, err
	}
	off := i*q.size + int(q.mac[i])
	if length < 0 || off+length > (i+1)*q.size {
		return nil, fmt.Errorf("%w: %d bytes in the frame's slot", nic.ErrInvalid, length)
	}
	return q.ring[off : off+length : off+length], nil
}

// Flush implements nic.Queue: posting hands a slot over at once.
func (q *RxQueue) Flush() error {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	return q.usable()
}

// Poll implements nic.Queue.
func (q *RxQueue) Poll(out []nic.Completion) int {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if q.Closed {
		return 0
	}
	n, errs := 0, 0
	var bytes uint64
	var c cqring.Completion
	for n < len(out) && q.take(&c) {
		o := &out[n]
		n++
		if c.Err != 0 {
			*o = nic.Completion{Context: c.Context, Queue: 0, Err: refused(&c)}
			errs++
			break
		}
		i := int(c.ID)
		off := i*q.size + int(q.mac[i])
		*o = nic.Completion{Context: c.Context, Buf: c.Buf, Data: q.ring[off : off+c.Len : off+c.Len], Len: c.Len}
		bytes += uint64(c.Len)
	}
	if n > 0 {
		q.src.Publish()
		q.Count(n, errs, bytes)
	}
	return n
}

// take reads the next frame through the ring reader (the slot's status,
// loaded first, then one copy of its header), then checks the header's
// fields from that copy: the frame lies inside the slot after the
// kernel's header, is whole (tp_len is the snap length) and holds an
// Ethernet header; a refused slot goes back to the driver (free).
func (q *RxQueue) take(c *cqring.Completion) bool {
	if q.broken || !q.src.Next(c) {
		return false
	}
	if c.Done {
		q.out--
	}
	i := int(c.ID)
	if c.Err != 0 {
		if c.Done {
			q.state[i] = slotFree
		}
		c.Buf = 0
		return true
	}
	mac, wire := c.Meta[0], c.Meta[1]
	switch {
	case mac < hdrLen || mac+uint64(c.Len) > uint64(q.size):
		c.Err, c.Prov = cq.EIO, cq.ProvBadLen
	case wire != uint64(c.Len):
		c.Err, c.Prov = cq.ETRUNC, cq.ProvMultiBuffer // longer than the slot holds
	case c.Len < nic.MinFrame:
		c.Err, c.Prov = cq.EIO, cq.ProvBadLen
	default:
		q.state[i], q.mac[i] = slotLent, uint16(mac)
		c.Buf += uintptr(mac)
		return true
	}
	q.state[i] = slotFree
	c.Buf = 0
	return true
}

// refused is the queue API's error for an entry refused.
func refused(c *cqring.Completion) error {
	if err := c.Prov.Refusal(); err != nil {
		return err
	}
	return nic.ErrDeviceStatus
}

// Arm implements nic.Queue: the socket is readable once the kernel has
// written a frame; nothing to arm.
func (q *RxQueue) Arm(threshold int) error {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	return q.usable()
}

// SRead implements nic.Queue.
func (q *RxQueue) SRead(ctx context.Context, out []nic.Completion, threshold int, timeout time.Duration) (int, error) {
	return nic.SRead(ctx, q, out, threshold, timeout)
}

func (q *RxQueue) close() {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if !q.Closed {
		q.Closed, q.CloseErr = true, nic.ErrClosed
	}
}

// TxQueue is the transmit queue (nic.TxQueue): frames wait in the
// queue's own buffers until Flush sends them with one sendmmsg(2); each
// then completes, in order.
type TxQueue struct {
	qcore.Core[struct{}]
	d        *Device
	maxFrame int
	bufs     [][]byte // a frame per slot, reused
	ctxs     []any
	lens     []int
	msgs     []unix.Mmsghdr
	iovs     []unix.Iovec
	// Slots from head: done (sent, completion unread) up to sent, then
	// pending up to tail. Free-running counters.
	head, sent, tail int
}

var _ nic.TxQueue = (*TxQueue)(nil)

func newTxQueue(d *Device, n, maxFrame int) *TxQueue {
	q := &TxQueue{Core: qcore.Core[struct{}]{Name: "tx-" + d.ifname, Vector: -1, EFD: d.irq}, d: d, maxFrame: maxFrame,
		bufs: make([][]byte, n), ctxs: make([]any, n), lens: make([]int, n), msgs: make([]unix.Mmsghdr, n), iovs: make([]unix.Iovec, n)}
	mem := make([]byte, n*maxFrame)
	for i := range q.bufs {
		q.bufs[i] = mem[i*maxFrame : (i+1)*maxFrame : (i+1)*maxFrame]
	}
	return q
}

// Size implements nic.Queue.
func (q *TxQueue) Size() int { return len(q.bufs) }

// Outstanding implements nic.Queue.
func (q *TxQueue) Outstanding() int {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	return q.tail - q.head
}

// MaxFrame implements nic.TxQueue.
func (q *TxQueue) MaxFrame() int { return q.maxFrame }

// Send implements nic.TxQueue.
func (q *TxQueue) Send(frame []byte, ctx any) error {
	if len(frame) < nic.MinFrame || len(frame) > q.maxFrame {
		return fmt.Errorf("%w: frame of %d bytes outside [%d, %d]", nic.ErrFrameSize, len(frame), nic.MinFrame, q.maxFrame)
	}
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if q.Closed {
		return q.CloseErr
	}
	if q.tail-q.head == len(q.bufs) {
		return errNoDesc
	}
	i := q.tail % len(q.bufs)
	q.lens[i] = copy(q.bufs[i], frame)
	q.ctxs[i] = ctx
	q.tail++
	return nil
}

// Flush implements nic.Queue: one sendmmsg for the frames waiting (two
// when they wrap around the slots). A busy socket (EAGAIN, ENOBUFS)
// keeps them for the next Flush or Poll.
func (q *TxQueue) Flush() error {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if q.Closed {
		return q.CloseErr
	}
	return q.flush()
}

func (q *TxQueue) flush() error {
	for q.sent < q.tail {
		n := len(q.bufs)
		first := q.sent % n
		k := min(q.tail-q.sent, n-first)
		for j := range k {
			i := first + j
			q.iovs[i] = unix.Iovec{Base: &q.bufs[i][0]}
			q.iovs[i].SetLen(q.lens[i])
			q.msgs[i] = unix.Mmsghdr{}
			q.msgs[i].Hdr.Iov = &q.iovs[i]
			q.msgs[i].Hdr.SetIovlen(1)
		}
		// A raw system call: it never blocks (MSG_DONTWAIT), and one
		// that takes tens of microseconds as an ordinary system call lets
		// the runtime's sysmon take the polling core's P each time.
		r, _, e := unix.RawSyscall6(unix.SYS_SENDMMSG, uintptr(q.d.fd), uintptr(unsafe.Pointer(&q.msgs[first])), uintptr(k), unix.MSG_DONTWAIT, 0, 0)
		q.Notifies.Add(1)
		if e != 0 {
			if errors.Is(e, unix.EAGAIN) || errors.Is(e, unix.ENOBUFS) || errors.Is(e, unix.EINTR) {
				return nil
			}
			return fmt.Errorf("afpacket: sendmmsg on %s: %w", q.d.ifname, e)
		}
		q.sent += int(r)
		if int(r) < k {
			return nil // the socket took what it could: the rest at the next flush
		}
	}
	return nil
}

// Poll implements nic.Queue: the sends sendmmsg took, in order; frames
// still waiting are sent first.
func (q *TxQueue) Poll(out []nic.Completion) int {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if q.Closed {
		return 0
	}
	if q.sent < q.tail {
		_ = q.flush() // its error comes back from the next Flush
	}
	n := 0
	var bytes uint64
	for n < len(out) && q.head < q.sent {
		i := q.head % len(q.bufs)
		out[n] = nic.Completion{Context: q.ctxs[i], Len: q.lens[i]}
		q.ctxs[i] = nil
		bytes += uint64(q.lens[i])
		q.head++
		n++
	}
	q.Count(n, 0, bytes)
	return n
}

// Arm implements nic.Queue.
func (q *TxQueue) Arm(threshold int) error {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if q.Closed {
		return q.CloseErr
	}
	return nil
}

// WaitInterrupt implements nic.Queue: at once while sends are done or
// waiting (their completions need no event), else the socket's
// readiness.
func (q *TxQueue) WaitInterrupt(ctx context.Context, deadline time.Time) error {
	q.Mu.Lock()
	owed := q.tail > q.head && !q.Closed
	q.Mu.Unlock()
	if owed {
		return nil
	}
	return q.Core.WaitInterrupt(ctx, deadline)
}

// SRead implements nic.Queue.
func (q *TxQueue) SRead(ctx context.Context, out []nic.Completion, threshold int, timeout time.Duration) (int, error) {
	return nic.SRead(ctx, q, out, threshold, timeout)
}

func (q *TxQueue) close() {
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if !q.Closed {
		q.Closed, q.CloseErr = true, nic.ErrClosed
	}
}
