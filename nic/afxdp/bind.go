package afxdp

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/eventfd"
	"github.com/vfnic/vfnic/nic"
	qcore "github.com/vfnic/vfnic/nic/internal/queue"
)

// forwarder signals the eventfd of the CQ a queue feeds. The CQ's wait
// object is an eventfd, which the socket's readiness cannot be wired to
// as an MSI-X vector is: an armed queue has this goroutine parked on the
// socket's readiness (the runtime poller, the same eventfd.FD wait) that
// signals the CQ's eventfd once it is readable.
type forwarder struct {
	q     *queue
	tx    bool
	irq   *eventfd.FD   // the CQ's
	arm   chan struct{} // pokes the forwarder: an arm, or sends flushed while armed
	armed atomic.Bool   // the CQ asked for a signal that has not come yet
	stop  context.CancelFunc
	done  chan struct{}
}

// BindCQ implements nic.Device. Entry.Queue is 2i for the receive queue of
// pair i and 2i+1 for its transmit queue. A receive entry's Buf is the
// frame (RxQueue.Frame, Repost, Release).
func (d *Device) BindCQ(c *cq.CQ, i int, dir nic.Direction) error {
	var started []*forwarder
	err := d.core.BindCQ(c, i, dir, func(qs []*qcore.Queue) error {
		irq := c.Driver().Interrupt()
		if irq == nil {
			return nil // a CQ without a wait object is never armed
		}
		for _, qq := range qs {
			if qq.Bound() {
				return nil // refused by the core, nothing changed
			}
		}
		for _, qq := range qs {
			q, tx := d.queueOf(qq)
			ctx, stop := context.WithCancel(context.Background())
			fw := &forwarder{q: q, tx: tx, irq: irq, arm: make(chan struct{}, 1), stop: stop, done: make(chan struct{})}
			go fw.forward(ctx)
			started = append(started, fw)
			q.Mu.Lock()
			q.fw = fw
			q.Mu.Unlock()
		}
		return nil
	}, d.unbind)
	if err != nil {
		for _, fw := range started {
			fw.halt()
		}
	}
	return err
}

// queueOf is the afxdp queue of a core's queue, and whether it transmits.
func (d *Device) queueOf(qq *qcore.Queue) (*queue, bool) {
	if rx := d.rx[qq.Pair]; &rx.Queue == qq {
		return &rx.queue, false
	}
	return &d.tx[qq.Pair].queue, true
}

// unbind gives a queue its own completions back (the CQ letting go).
func (d *Device) unbind(s *qcore.Source) error {
	q, _ := d.queueOf(s.Queue())
	q.unforward()
	d.core.Mu.Lock()
	defer d.core.Mu.Unlock()
	return d.core.Unbind(s, false)
}

// forward signals the CQ's eventfd once, after an arm, the socket is
// readable (a receive queue), or after TxOwedWait at the most while sends
// are owed (a transmit queue: AF_XDP signals no completion; its Flush
// pokes the forwarder while armed). A spurious signal is allowed, a lost
// one is not.
func (fw *forwarder) forward(ctx context.Context) {
	defer close(fw.done)
	for {
		select {
		case <-ctx.Done():
			return
		case <-fw.arm:
		}
		if !fw.armed.Load() {
			continue
		}
		var deadline time.Time
		if fw.tx {
			if fw.q.Outstanding() == 0 {
				continue // nothing can complete before a Flush, which pokes
			}
			deadline = time.Now().Add(TxOwedWait)
		}
		if _, err := fw.q.x.irq.Wait(ctx, deadline); err != nil && !errors.Is(err, eventfd.ErrTimeout) {
			return // ctx ended, or the socket closed
		}
		if fw.armed.CompareAndSwap(true, false) {
			_ = fw.irq.Add(1)
		}
	}
}

// poke wakes the forwarder (non-blocking: one pending poke is enough).
func (fw *forwarder) poke() {
	select {
	case fw.arm <- struct{}{}:
	default:
	}
}

// halt ends the forwarder and waits for it.
func (fw *forwarder) halt() {
	fw.stop()
	<-fw.done
}

// unforward ends the queue's forwarder, if it has one.
func (q *queue) unforward() {
	q.Mu.Lock()
	fw := q.fw
	q.fw = nil
	q.Mu.Unlock()
	if fw != nil {
		fw.halt()
	}
}
