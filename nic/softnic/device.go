package softnic

import (
	"errors"
	"fmt"
	"math/bits"
	"net"
	"sync/atomic"

	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/dma"
	"github.com/vfnic/vfnic/eventfd"
	"github.com/vfnic/vfnic/hugepage"
	"github.com/vfnic/vfnic/nic"
	qcore "github.com/vfnic/vfnic/nic/internal/queue"
)

// Limits of a device's rings.
const (
	// DefaultQueueSize is the ring size of a zero nic.Config.
	DefaultQueueSize = 256
	// MaxQueueSize is the largest ring; larger sizes are capped.
	MaxQueueSize = 4096
)

// Device is one end of a wire as a nic.Device. Its queues keep the
// drivers' contracts: receive buffers and transmit copies in DMA memory
// (4 KiB pages unless nic.Config.Memory asks for others), completions
// read through cq/ring from a completion ring the wire writes as a
// device does, an interrupt eventfd per queue, BindCQ. A transmit queue's
// Flush runs the device: it carries the frames to the peer's receive
// queues, writes their completions and raises the interrupts that were
// armed, before it returns.
type Device struct {
	wire *Wire
	end  int
	addr string
	mac  net.HardwareAddr
	info nic.Info

	space *dma.Space
	rx    []*RxQueue
	tx    []*TxQueue
	efds  []*eventfd.FD // the queues' interrupt eventfds

	linkIRQ atomic.Uint64

	// core is the lock (Close, BindCQ, Link), the closed state, the
	// queues as the core sees them, the CQs they feed, and the vectors:
	// vector 2i is receive queue i's interrupt, 2i+1 transmit queue i's,
	// each routed to the queue's eventfd or to the CQ it feeds.
	core qcore.Device
	// cqIRQ is, per vector, the eventfd of the CQ its queue was last
	// bound to (route maps the core's fds back to eventfds). Guarded by
	// core.Mu.
	cqIRQ []*eventfd.FD
}

var _ nic.Device = (*Device)(nil)

// newDevice makes end's device with cfg.
func newDevice(w *Wire, end int, cfg nic.Config) (*Device, error) {
	pairs := max(cfg.QueuePairs, 1)
	if cfg.QueuePairs < 0 || pairs > w.opt.MaxQueuePairs {
		return nil, fmt.Errorf("%w: softnic: %d queue pairs (1 to %d)", nic.ErrInvalid, cfg.QueuePairs, w.opt.MaxQueuePairs)
	}
	size := cfg.QueueSize
	if size == 0 {
		size = DefaultQueueSize
	}
	if size < 2 {
		return nil, fmt.Errorf("%w: softnic: queue size %d (2 to %d)", nic.ErrInvalid, size, MaxQueueSize)
	}
	size = 1 << (bits.Len(uint(min(size, MaxQueueSize))) - 1) // a power of two, rounded down
	maxFrame := w.opt.MTU + nic.FrameOverhead
	rxBufs := cfg.RxBuffers
	if rxBufs == 0 {
		rxBufs = 2 * size
	}
	bufSize := cfg.BufferSize
	if bufSize == 0 {
		bufSize = max(2048, maxFrame)
	}
	if rxBufs < 1 || bufSize < nic.MinFrame || bufSize > 1<<20 {
		return nil, fmt.Errorf("%w: softnic: %d receive buffers of %d bytes (at least 1 of %d to %d)",
			nic.ErrInvalid, rxBufs, bufSize, nic.MinFrame, 1<<20)
	}
	mem := cfg.Memory
	if mem.PageSize == 0 {
		// No hugepages needed: the software device pins nothing for a
		// real device, and 4 KiB pages work on any host.
		mem = hugepage.Options{PageSize: hugepage.Size4K, AllowFallback: true}
	}
	d := &Device{wire: w, end: end, addr: w.address(end), mac: w.mac(end), space: dma.NewIdentitySpace()}
	d.core = qcore.Device{Name: d.addr, FDs: make([]int, 2*pairs), Enable: d.route}
	d.cqIRQ = make([]*eventfd.FD, 2*pairs)
	d.info = nic.Info{
		Driver: "softnic", Address: d.addr, Model: "software NIC (in-process wire)", MAC: d.mac, MTU: w.opt.MTU,
		QueuePairs: pairs, MaxQueuePairs: w.opt.MaxQueuePairs, QueueSize: size, RxBuffers: rxBufs, BufferSize: bufSize,
		Vectors: 2 * pairs, Features: []string{"rss", "faults", "multi-buffer"},
	}
	for i := range pairs {
		rq, err := newRxQueue(d, i, size, rxBufs, bufSize, mem)
		if err == nil {
			d.rx, d.core.Rx = append(d.rx, rq), append(d.core.Rx, &rq.Queue)
			var tq *TxQueue
			tq, err = newTxQueue(d, i, size, maxFrame, mem)
			if err == nil {
				d.tx, d.core.Tx = append(d.tx, tq), append(d.core.Tx, &tq.Queue)
			}
		}
		if err != nil {
			return nil, errors.Join(err, d.core.Teardown(nic.ErrClosed, d.hw))
		}
	}
	for _, q := range d.core.Rx {
		d.core.FDs[q.Vector] = q.EFD.Fd()
	}
	for _, q := range d.core.Tx {
		d.core.FDs[q.Vector] = q.EFD.Fd()
	}
	return d, nil
}

// Wire returns the wire the device is an end of.
func (d *Device) Wire() *Wire { return d.wire }

// End is the device's end of its wire, 0 or 1.
func (d *Device) End() int { return d.end }

// Info implements nic.Device.
func (d *Device) Info() nic.Info { return qcore.Info(d.info, d.mac) }

// MAC implements nic.Device.
func (d *Device) MAC() net.HardwareAddr { return append(net.HardwareAddr(nil), d.mac...) }

// Link implements nic.Device: up while the wire is up and the other end
// is open.
func (d *Device) Link() (nic.Link, error) {
	d.core.Mu.Lock()
	closed := d.core.Closed
	d.core.Mu.Unlock()
	if closed {
		return nic.Link{}, nic.ErrClosed
	}
	_, up := d.wire.up(d.end)
	l := nic.Link{Up: up, Reported: true}
	if up {
		l.SpeedMbps, l.FullDuplex = 10000, true
	}
	return l, nil
}

// linkChanged counts a link change as a configuration interrupt.
func (d *Device) linkChanged() { d.linkIRQ.Add(1) }

// Stats implements nic.Device.
func (d *Device) Stats() nic.Stats { return d.core.Stats(d.linkIRQ.Load()) }

// QueuePairs implements nic.Device.
func (d *Device) QueuePairs() int { return len(d.rx) }

// Rx implements nic.Device.
func (d *Device) Rx(i int) (nic.RxQueue, error) { return qcore.RxAt(d.rx, i, d.addr) }

// Tx implements nic.Device.
func (d *Device) Tx(i int) (nic.TxQueue, error) { return qcore.TxAt(d.tx, i, d.addr) }

// RxQueue returns receive queue i with its concrete type.
func (d *Device) RxQueue(i int) (*RxQueue, error) { return qcore.QueueAt(d.rx, i, d.addr, "receive") }

// TxQueue returns transmit queue i with its concrete type.
func (d *Device) TxQueue(i int) (*TxQueue, error) { return qcore.QueueAt(d.tx, i, d.addr, "transmit") }

// queueOf returns the queue of pair i in direction dir (one of nic.Recv,
// nic.Send).
func (d *Device) queueOf(dir nic.Direction, i int) (*queue, error) {
	if dir == nic.Recv {
		q, err := d.RxQueue(i)
		if err != nil {
			return nil, err
		}
		return &q.queue, nil
	}
	if dir != nic.Send {
		return nil, fmt.Errorf("%w: %s: direction %#x (nic.Recv or nic.Send)", nic.ErrInvalid, d.addr, uint8(dir))
	}
	q, err := d.TxQueue(i)
	if err != nil {
		return nil, err
	}
	return &q.queue, nil
}

// InjectRing makes the device write fault f into the completion ring of
// the queue of pair i in direction dir (nic.Recv or nic.Send), at its next
// completion.
func (d *Device) InjectRing(dir nic.Direction, i int, f RingFault) error {
	if f < RingBadID || f > RingRewriteID {
		return fmt.Errorf("%w: softnic: unknown ring fault %v", nic.ErrInvalid, f)
	}
	q, err := d.queueOf(dir, i)
	if err != nil {
		return err
	}
	r := q.dev
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.dead {
		return nic.ErrClosed
	}
	r.faults = append(r.faults, f)
	return nil
}

// Receive hands frame to the device as if it came off the wire, into
// receive queue i, whatever its length: a frame longer than a buffer
// fills several (each completing with an error matching
// cq.ProvMultiBuffer), as a NIC that takes long frames does. It reports
// whether the frame was placed (false: the queue had too few buffers
// posted, or is closed). frame is not kept.
func (d *Device) Receive(i int, frame []byte) (bool, error) {
	q, err := d.RxQueue(i)
	if err != nil {
		return false, err
	}
	return q.receive(frame) == received, nil
}

// BindCQ implements nic.Device. Entry.Queue is 2i for the receive queue
// of pair i and 2i+1 for its transmit queue; each queue has its own
// interrupt, which then signals the CQ.
func (d *Device) BindCQ(c *cq.CQ, i int, dir nic.Direction) error {
	return d.core.BindCQ(c, i, dir, func(qs []*qcore.Queue) error {
		for _, q := range qs {
			if !q.Bound() { // a bound one is refused, its routing kept
				d.cqIRQ[q.Vector] = c.Driver().Interrupt()
			}
		}
		return nil
	}, d.unbind)
}

// unbind gives a queue its own completions and interrupt back.
func (d *Device) unbind(s *qcore.Source) error {
	d.core.Mu.Lock()
	defer d.core.Mu.Unlock()
	return d.core.Unbind(s, false)
}

// route points each queue's interrupt at the eventfd of its vector's fd,
// as enabling MSI-X with eventfds does: the queue's own, or that of the
// CQ it feeds. Called with core.Mu held.
func (d *Device) route(fds []int) error {
	for _, qs := range [][]*qcore.Queue{d.core.Rx, d.core.Tx} {
		for _, q := range qs {
			irq := q.EFD
			if c := d.cqIRQ[q.Vector]; c != nil && fds[q.Vector] == c.Fd() {
				irq = c
			} else if fds[q.Vector] != irq.Fd() {
				return fmt.Errorf("%w: %s: vector %d routed to an unknown fd %d", nic.ErrInvalid, d.addr, q.Vector, fds[q.Vector])
			}
			d.ringOf(q).target(irq)
		}
	}
	return nil
}

// ringOf is the device side of q, one of the device's queues.
func (d *Device) ringOf(q *qcore.Queue) *devRing {
	if q.Vector%2 == 0 {
		return d.rx[q.Pair].dev
	}
	return d.tx[q.Pair].dev
}

// Close implements nic.Device: the queues stop (operations in progress
// finish first), operations still outstanding on a queue bound to a CQ
// complete there as flushed (cq.ECANCELED), the memory and eventfds are
// released and the CQs unbound; the peer sees the link go down.
// Idempotent.
func (d *Device) Close() error { return d.close(nic.ErrClosed) }

// Remove closes the device as the kernel taking a device back does:
// operations fail with an error matching nic.ErrRemoved and nic.ErrClosed,
// and each receive still posted on a queue that feeds no CQ completes
// with nic.ErrCanceled (Poll reports them).
func (d *Device) Remove() error { return d.close(nic.ErrRemovedClosed) }

// close stops the device side of every queue (the wire writes nothing
// more), then has the core close the queues, free the memory (hw) and let
// the CQs go, and takes the end off the wire.
func (d *Device) close(why error) error {
	for _, q := range d.rx {
		q.dev.kill()
	}
	for _, q := range d.tx {
		q.dev.kill()
	}
	err := d.core.Close(why, nil, d.hw)
	d.wire.closed(d)
	return err
}

// hw frees what the device used, once its queues are closed and their
// device sides dead.
func (d *Device) hw() error {
	var errs []error
	for _, e := range d.efds {
		errs = append(errs, e.Close())
	}
	return errors.Join(append(errs, d.space.Close())...)
}
