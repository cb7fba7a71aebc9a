package queue

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/eventfd"
	"github.com/vfnic/vfnic/nic"
)

// Forwarder signals the eventfd of the CQ a queue feeds when the queue's
// interrupt is another descriptor's readiness (a socket: eventfd.Readable),
// which cannot be wired to the CQ's eventfd as an MSI-X vector is. Once
// armed, its goroutine waits on the readiness (the runtime poller, the same
// eventfd.FD wait as WaitInterrupt's) and signals the CQ once. A spurious
// signal is allowed, a lost one is not.
type Forwarder struct {
	q        *Queue
	irq      *eventfd.FD // the CQ's
	owed     func() bool
	owedWait time.Duration
	poke     chan struct{}
	armed    atomic.Bool // the CQ asked for a signal that has not come yet
	stop     context.CancelFunc
	done     chan struct{}
}

// BindForwarded is BindCQ for a device whose queues' interrupts are
// readiness FDs: each queue bound gets a Forwarder from its EFD to c's
// eventfd (none when c has no wait object). owed, when it returns a
// non-nil function for a queue, bounds the forwarder's wait to owedWait
// while that function reports completions due that raise no readiness
// (AF_XDP's sends). The forwarders end at Unbind and at the device's
// close.
func (d *Device) BindForwarded(c *cq.CQ, i int, dir nic.Direction, owed func(q *Queue) func() bool, owedWait time.Duration) error {
	return d.BindCQ(c, i, dir, func(qs []*Queue) error {
		irq := c.Driver().Interrupt()
		if irq == nil {
			return nil
		}
		for _, q := range qs {
			if q.Bound() {
				return nil // refused by Bind, nothing changed
			}
		}
		for _, q := range qs {
			var f func() bool
			if owed != nil {
				f = owed(q)
			}
			ctx, stop := context.WithCancel(context.Background())
			fw := &Forwarder{q: q, irq: irq, owed: f, owedWait: owedWait, poke: make(chan struct{}, 1), stop: stop, done: make(chan struct{})}
			go fw.forward(ctx)
			q.Mu.Lock()
			q.FW = fw
			q.Mu.Unlock()
		}
		return nil
	}, func(s *Source) error {
		s.q.unforward()
		d.Mu.Lock()
		defer d.Mu.Unlock()
		return d.Unbind(s, false)
	})
}

// unforward ends the queue's forwarder, if it has one. Called unlocked:
// the forwarder may be waiting for the queue's lock.
func (q *Queue) unforward() {
	q.Mu.Lock()
	fw := q.FW
	q.FW = nil
	q.Mu.Unlock()
	if fw != nil {
		fw.stop()
		<-fw.done
	}
}

// Arm asks for one signal: at once when the queue has completions ready
// (late), else once the readiness comes. Called locked.
func (f *Forwarder) Arm() (late bool) {
	if f.q.ring.Pending(1) > 0 {
		return true
	}
	f.armed.Store(true)
	f.kick()
	return false
}

// Poke has an armed forwarder look at owed again (sends just flushed).
func (f *Forwarder) Poke() {
	if f.armed.Load() {
		f.kick()
	}
}

// Signal signals the CQ now if it is armed: completions the driver wrote
// itself (afpacket's sends).
func (f *Forwarder) Signal() {
	if f.armed.CompareAndSwap(true, false) {
		_ = f.irq.Add(1)
	}
}

func (f *Forwarder) kick() {
	select {
	case f.poke <- struct{}{}:
	default: // one pending poke is enough
	}
}

func (f *Forwarder) forward(ctx context.Context) {
	defer close(f.done)
	for {
		select {
		case <-ctx.Done():
			return
		case <-f.poke:
		}
		if !f.armed.Load() {
			continue
		}
		var deadline time.Time
		if f.owed != nil {
			if !f.owed() {
				continue // nothing can complete before a Flush, which pokes
			}
			deadline = time.Now().Add(f.owedWait)
		}
		if _, err := f.q.EFD.Wait(ctx, deadline); err != nil && !errors.Is(err, eventfd.ErrTimeout) {
			return // ctx ended, or the descriptor closed
		}
		if f.owed == nil && f.q.Ready(1) == 0 && f.armed.Load() {
			// Readable with nothing to read: AF_PACKET stays readable
			// while the slot before the kernel's position is the
			// caller's. No edge will come: look again in a moment
			// rather than wake the CQ's reader for nothing.
			select {
			case <-ctx.Done():
				return
			case <-time.After(staleReadiness):
			}
			f.kick()
			continue
		}
		f.Signal()
	}
}

// staleReadiness is how long a forwarder waits before it looks again at
// a readiness that reports nothing to read.
const staleReadiness = time.Millisecond
