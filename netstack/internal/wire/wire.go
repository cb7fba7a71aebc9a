// Package wire is a test-only nic.Device pair joined by an in-memory
// wire: a frame sent and flushed on one device is copied into a posted
// receive buffer of the other, whose interrupt eventfd fires if armed.
// It lets the netstack package's tests run two stacks against each other
// on the host, at full speed and under the race detector. Its buffers are
// Go memory, not DMA memory; it models no device-side faults beyond
// dropping frames (SetDrop) and being taken back (Remove).
package wire

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/eventfd"
	"github.com/vfnic/vfnic/nic"
)

// Buffer and frame sizes: frames up to MaxFrame, a full-size frame with
// two VLAN tags, as the drivers' queues take.
const (
	BufSize  = 2048
	MaxFrame = 1500 + nic.FrameOverhead
)

// Device is one end of the wire.
type Device struct {
	mac  net.HardwareAddr
	peer *Device
	drop *atomic.Bool
	rx   *queue
	tx   *queue
}

var _ nic.Device = (*Device)(nil)

// Pair returns two devices joined by a wire, with one queue pair of size
// descriptors each (twice as many receive buffers).
func Pair(size int) (*Device, *Device, error) {
	drop := new(atomic.Bool)
	a := &Device{mac: net.HardwareAddr{0x02, 0, 0, 0, 0, 1}, drop: drop}
	b := &Device{mac: net.HardwareAddr{0x02, 0, 0, 0, 0, 2}, drop: drop}
	a.peer, b.peer = b, a
	for _, d := range []*Device{a, b} {
		var err error
		if d.rx, err = newQueue(d, size, 2*size, true); err != nil {
			return nil, nil, err
		}
		if d.tx, err = newQueue(d, size, size, false); err != nil {
			return nil, nil, err
		}
	}
	return a, b, nil
}

// SetDrop makes the wire drop every frame (in both directions) while on.
func (d *Device) SetDrop(on bool) { d.drop.Store(on) }

// Close implements nic.Device.
func (d *Device) Close() error {
	d.rx.close(nic.ErrClosed)
	d.tx.close(nic.ErrClosed)
	return nil
}

// Remove closes the device as the kernel taking it back does: posted
// receive buffers complete with errors matching nic.ErrCanceled, then
// every operation fails with an error matching nic.ErrRemoved and
// nic.ErrClosed, and the interrupt eventfds close.
func (d *Device) Remove() {
	why := fmt.Errorf("wire: %w (%w)", nic.ErrRemoved, nic.ErrClosed)
	d.rx.close(why)
	d.tx.close(why)
}

// Info implements nic.Device.
func (d *Device) Info() nic.Info {
	return nic.Info{Driver: "wire", Model: "in-memory test wire", MAC: d.mac, MTU: 1500,
		QueuePairs: 1, MaxQueuePairs: 1, QueueSize: d.rx.size, RxBuffers: len(d.rx.lent), BufferSize: BufSize}
}

// MAC implements nic.Device.
func (d *Device) MAC() net.HardwareAddr { return d.mac }

// Link implements nic.Device.
func (d *Device) Link() (nic.Link, error) { return nic.Link{Up: true}, nil }

// Stats implements nic.Device.
func (d *Device) Stats() nic.Stats {
	r, t := d.rx.Stats(), d.tx.Stats()
	return nic.Stats{Rx: r, Tx: t, RxQueues: []nic.QueueStats{r}, TxQueues: []nic.QueueStats{t}}
}

// QueuePairs implements nic.Device.
func (d *Device) QueuePairs() int { return 1 }

// Rx implements nic.Device.
func (d *Device) Rx(i int) (nic.RxQueue, error) {
	if i != 0 {
		return nil, nic.ErrInvalid
	}
	return d.rx, nil
}

// Tx implements nic.Device.
func (d *Device) Tx(i int) (nic.TxQueue, error) {
	if i != 0 {
		return nil, nic.ErrInvalid
	}
	return d.tx, nil
}

// BindCQ implements nic.Device: not supported.
func (d *Device) BindCQ(*cq.CQ, int, nic.Direction) error { return nic.ErrNotSupported }

type done struct {
	buf int // buffer index
	n   int
	ctx any
	err error
}

// queue is a receive or transmit queue. Receive: posted buffers wait in
// posted until a frame arrives; transmit: sent frames wait in unsent
// until Flush carries them to the peer.
type queue struct {
	dev  *Device
	rx   bool
	size int
	slab []byte
	efd  *eventfd.FD

	mu     sync.Mutex
	free   []int  // buffers not lent
	lent   []bool // buffers posted or completed and not yet returned
	posted []done // receive: posted buffers; transmit: sent, not flushed
	ready  []done // completions not read
	armed  bool
	err    error // set once closed

	packets, bytes, errs, notifies, irqs atomic.Uint64
}

func newQueue(d *Device, size, bufs int, rx bool) (*queue, error) {
	efd, err := eventfd.New()
	if err != nil {
		return nil, err
	}
	q := &queue{dev: d, rx: rx, size: size, slab: make([]byte, bufs*BufSize), efd: efd,
		lent: make([]bool, bufs), posted: make([]done, 0, size), ready: make([]done, 0, bufs)}
	for i := range bufs {
		q.free = append(q.free, i)
	}
	return q, nil
}

func (q *queue) close(why error) {
	q.mu.Lock()
	if q.err != nil {
		q.mu.Unlock()
		return
	}
	q.err = why
	if errors.Is(why, nic.ErrRemoved) {
		for _, p := range q.posted {
			q.ready = append(q.ready, done{buf: -1, ctx: p.ctx, err: fmt.Errorf("%w (%w)", nic.ErrCanceled, nic.ErrRemoved)})
		}
	} else {
		q.ready = q.ready[:0]
	}
	q.posted = q.posted[:0]
	q.mu.Unlock()
	_ = q.efd.Close()
}

func (q *queue) buf(i int) []byte { return q.slab[i*BufSize : (i+1)*BufSize] }

func (q *queue) Index() int             { return 0 }
func (q *queue) Size() int              { return q.size }
func (q *queue) MaxFrame() int          { return MaxFrame }
func (q *queue) Interrupt() *eventfd.FD { return q.efd }

func (q *queue) Outstanding() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.posted) + len(q.ready)
}

// Flush carries sent frames to the peer (transmit queue).
func (q *queue) Flush() error {
	q.mu.Lock()
	if q.err != nil {
		defer q.mu.Unlock()
		return q.err
	}
	q.notifies.Add(1)
	if q.rx || len(q.posted) == 0 {
		q.mu.Unlock()
		return nil
	}
	peer := q.dev.peer.rx
	drop := q.dev.drop.Load()
	for _, p := range q.posted {
		if !drop {
			peer.deliver(q.buf(p.buf)[:p.n])
		}
		q.ready = append(q.ready, p)
	}
	q.posted = q.posted[:0]
	q.signalLocked()
	q.mu.Unlock()
	return nil
}

// deliver copies a frame into the next posted receive buffer; with none
// posted the frame is lost, as on a NIC whose ring is empty.
func (q *queue) deliver(frame []byte) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.err != nil || len(q.posted) == 0 {
		q.errs.Add(1)
		return
	}
	p := q.posted[0]
	q.posted = append(q.posted[:0], q.posted[1:]...)
	p.n = copy(q.buf(p.buf), frame)
	q.ready = append(q.ready, p)
	q.signalLocked()
}

func (q *queue) signalLocked() {
	if q.armed && len(q.ready) > 0 {
		q.armed = false
		q.irqs.Add(1)
		_ = q.efd.Add(1)
	}
}

func (q *queue) Poll(out []nic.Completion) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := 0
	for n < len(out) && n < len(q.ready) {
		p := q.ready[n]
		c := nic.Completion{Context: p.ctx, Len: p.n, Err: p.err}
		if p.err == nil {
			if q.rx {
				b := q.buf(p.buf)[:p.n]
				c.Buf, c.Data = uintptr(unsafe.Pointer(&b[0])), b
			} else {
				q.lent[p.buf] = false
				q.free = append(q.free, p.buf)
			}
			q.packets.Add(1)
			q.bytes.Add(uint64(p.n))
		} else {
			q.errs.Add(1)
		}
		out[n] = c
		n++
		if p.err != nil {
			break // an error completion is the last of a batch
		}
	}
	q.ready = append(q.ready[:0], q.ready[n:]...)
	if n > 0 {
		q.armed = false
	}
	return n
}

func (q *queue) SRead(ctx context.Context, out []nic.Completion, threshold int, timeout time.Duration) (int, error) {
	return nic.SRead(ctx, q, out, threshold, timeout)
}

func (q *queue) Arm(int) error {
	_, _ = q.efd.TakeLeft()
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.err != nil {
		return q.err
	}
	q.armed = true
	return nil
}

func (q *queue) WaitInterrupt(ctx context.Context, deadline time.Time) error {
	_, err := q.efd.Await(ctx, deadline)
	switch {
	case errors.Is(err, eventfd.ErrTimeout):
		return nic.ErrTimeout
	case errors.Is(err, eventfd.ErrClosed):
		return nic.ErrClosed
	}
	return err
}

func (q *queue) Stats() nic.QueueStats {
	return nic.QueueStats{Packets: q.packets.Load(), Bytes: q.bytes.Load(), Errors: q.errs.Load(),
		Notifies: q.notifies.Load(), Interrupts: q.irqs.Load()}
}

func (q *queue) PostRecv(ctx any) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.err != nil {
		return q.err
	}
	if len(q.free) == 0 || len(q.posted) == q.size {
		return nic.ErrFull
	}
	i := q.free[len(q.free)-1]
	q.free = q.free[:len(q.free)-1]
	q.lent[i] = true
	q.posted = append(q.posted, done{buf: i, ctx: ctx})
	return nil
}

// index maps a received frame's address back to its buffer.
func (q *queue) index(buf uintptr) (int, error) {
	base := uintptr(unsafe.Pointer(&q.slab[0]))
	if buf < base || (buf-base)%BufSize != 0 || int(buf-base)/BufSize >= len(q.lent) {
		return 0, nic.ErrBadBuffer
	}
	i := int(buf-base) / BufSize
	if !q.lent[i] {
		return 0, nic.ErrBadBuffer
	}
	for _, p := range q.posted {
		if p.buf == i {
			return 0, nic.ErrBadBuffer // posted, not received
		}
	}
	return i, nil
}

func (q *queue) Repost(buf uintptr, ctx any) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.err != nil {
		return q.err
	}
	i, err := q.index(buf)
	if err != nil {
		return err
	}
	if len(q.posted) == q.size {
		return nic.ErrFull
	}
	q.posted = append(q.posted, done{buf: i, ctx: ctx})
	return nil
}

func (q *queue) Release(buf uintptr) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.err != nil {
		return q.err
	}
	i, err := q.index(buf)
	if err != nil {
		return err
	}
	q.lent[i] = false
	q.free = append(q.free, i)
	return nil
}

func (q *queue) Frame(buf uintptr, length int) ([]byte, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	i, err := q.index(buf)
	if err != nil || length < 0 || length > BufSize {
		return nil, nic.ErrBadBuffer
	}
	return q.buf(i)[:length], nil
}

// Send copies frame into a transmit buffer; Flush carries it to the peer.
func (q *queue) Send(frame []byte, ctx any) error {
	if len(frame) < nic.MinFrame || len(frame) > MaxFrame {
		return nic.ErrFrameSize
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.err != nil {
		return q.err
	}
	if len(q.free) == 0 {
		return nic.ErrFull
	}
	i := q.free[len(q.free)-1]
	q.free = q.free[:len(q.free)-1]
	q.lent[i] = true
	q.posted = append(q.posted, done{buf: i, n: copy(q.buf(i), frame), ctx: ctx})
	return nil
}

var (
	_ nic.RxQueue = (*queue)(nil)
	_ nic.TxQueue = (*queue)(nil)
)

// String describes the receive queue's state, for a test's failure message.
func (d *Device) String() string {
	q := d.rx
	q.mu.Lock()
	defer q.mu.Unlock()
	return fmt.Sprintf("rx posted %d ready %d free %d armed %v", len(q.posted), len(q.ready), len(q.free), q.armed)
}
