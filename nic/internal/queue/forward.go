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
// eventfd.FD as WaitInterrupt's) and signals the CQ once. A spurious
// signal is allowed, a lost one is not.
type Forwarder struct {
	q     *Queue
	irq   *eventfd.FD // the CQ's
	how   Forwarding
	poke  chan struct{}
	armed atomic.Bool // the CQ asked for a signal that has not come yet
	looks atomic.Uint64
	ready func() bool // the wait's condition, made once
	stop  context.CancelFunc
	done  chan struct{}
}

// Forwarding says how a queue's forwarder learns that completions are
// ready. The zero value: they raise the queue's readiness (a receive
// ring the kernel writes).
type Forwarding struct {
	// Owed, when not nil, reports completions due that raise no
	// readiness (AF_XDP's sends): the forwarder waits for the readiness
	// at most OwedWait while Owed reports true, and not at all while it
	// reports false (a Flush pokes it, Forwarder.Poke).
	Owed     func() bool
	OwedWait time.Duration
	// Signalled says the driver writes the queue's completions itself
	// and calls Forwarder.Signal when it does (afpacket's sends): the
	// readiness tells nothing of them, and the forwarder has no
	// goroutine.
	Signalled bool
}

// BindForwarded is BindCQ for a device whose queues' interrupts are
// readiness FDs: each queue bound gets a Forwarder from its EFD to c's
// eventfd (none when c has no wait object), which waits as how(q) says.
// The forwarders end at Unbind and at the device's close.
func (d *Device) BindForwarded(c *cq.CQ, i int, dir nic.Direction, how func(q *Queue) Forwarding) error {
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
			ctx, stop := context.WithCancel(context.Background())
			fw := &Forwarder{q: q, irq: irq, how: how(q), poke: make(chan struct{}, 1), stop: stop, done: make(chan struct{})}
			fw.ready = fw.look
			if fw.how.Signalled {
				stop()
				close(fw.done)
			} else {
				go fw.forward(ctx)
			}
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

// Poke has an armed forwarder look at Owed again (sends just flushed).
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

// Looks counts the times the forwarder woke to look at its queue: a
// readiness that was stale (nothing to read) costs one each time it
// raises an event, never a look per interval.
func (f *Forwarder) Looks() uint64 { return f.looks.Load() }

func (f *Forwarder) kick() {
	select {
	case f.poke <- struct{}{}:
	default: // one pending poke is enough
	}
}

// look is the forwarder's condition to stop waiting: the queue holds a
// completion, or the CQ needs no signal any more. Asked on the waiting
// goroutine with the descriptor's read lock held (eventfd.FD.WaitFor):
// the queue's lock it takes is never held by a Close of the queue's
// readiness FD (unforward comes first, unlocked).
func (f *Forwarder) look() bool {
	f.looks.Add(1)
	return !f.armed.Load() || f.q.Ready(1) > 0
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
		var err error
		if f.how.Owed != nil {
			if !f.how.Owed() {
				continue // nothing can complete before a Flush, which pokes
			}
			f.looks.Add(1)
			_, err = f.q.EFD.Wait(ctx, time.Now().Add(f.how.OwedWait))
		} else {
			// Not Wait: a readiness can last with nothing to read
			// (AF_PACKET stays readable while the slot before the
			// kernel's position is the caller's). WaitFor looks at the
			// queue after each new event and sleeps on until one
			// brings a completion.
			err = f.q.EFD.WaitFor(ctx, time.Time{}, f.ready)
		}
		if err != nil && !errors.Is(err, eventfd.ErrTimeout) {
			return // ctx ended, or the descriptor closed
		}
		f.Signal()
	}
}
