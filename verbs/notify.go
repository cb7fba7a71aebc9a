package verbs

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/eventfd"
)

// CompChannel is a completion channel (struct ibv_comp_channel): a queue
// of completion events from any number of CQs, behind a file descriptor
// that is readable while events are queued. GetEvent sleeps on it through
// Go's runtime poller; an event loop in another library may watch Fd with
// epoll and call TryGetEvent. Its methods are safe for concurrent use.
type CompChannel struct {
	efd *eventfd.FD

	mu     sync.Mutex
	events []*CQ // queued events, one entry per event, from head on
	head   int
	users  int // CQs created with this channel and not destroyed
	closed bool
}

// NewCompChannel creates a completion channel (ibv_create_comp_channel).
func NewCompChannel() (*CompChannel, error) {
	efd, err := eventfd.New()
	if err != nil {
		return nil, fmt.Errorf("verbs: completion channel: %w", err)
	}
	return &CompChannel{efd: efd}, nil
}

// Fd returns the channel's descriptor, readable while events are queued,
// for poll, select or epoll; -1 after Close. The channel keeps ownership.
func (ch *CompChannel) Fd() int { return ch.efd.Fd() }

// GetEvent waits for a completion event and returns the CQ that raised it
// and that CQ's context (ibv_get_cq_event). Every event returned must be
// acknowledged with AckEvents. It returns ctx's error when ctx ends (one
// matching os.ErrDeadlineExceeded for a deadline) and os.ErrClosed when
// the channel is closed.
func (ch *CompChannel) GetEvent(ctx context.Context) (*CQ, any, error) {
	if ctx == nil {
		return nil, nil, invalid("nil context")
	}
	for {
		c, err := ch.pop()
		if c != nil || err != nil {
			if c == nil {
				return nil, nil, err
			}
			return c, c.ctx, nil
		}
		if _, err := ch.efd.Wait(ctx, time.Time{}); err != nil {
			switch {
			case errors.Is(err, eventfd.ErrClosed):
				return nil, nil, cq.ErrClosed
			case ctx.Err() != nil:
				return nil, nil, ctxError("verbs: get event", ctx)
			}
			return nil, nil, err
		}
	}
}

// TryGetEvent is GetEvent that does not wait: ErrNoEvent (EAGAIN) when no
// event is queued, as ibv_get_cq_event on a non-blocking channel.
func (ch *CompChannel) TryGetEvent() (*CQ, any, error) {
	c, err := ch.pop()
	switch {
	case err != nil:
		return nil, nil, err
	case c == nil:
		return nil, nil, ErrNoEvent
	}
	return c, c.ctx, nil
}

// pop takes the oldest event GetEvent may return; nil when none is
// queued. It passes over, and leaves queued, the events of a CQ being
// destroyed (dying): Destroy drops them when it succeeds, and GetEvent
// returns them when it fails. The descriptor stays readable exactly while
// such an event remains.
func (ch *CompChannel) pop() (*CQ, error) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.closed {
		return nil, cq.ErrClosed
	}
	var c *CQ
	for j := ch.head; j < len(ch.events); j++ {
		if x := ch.events[j]; !x.dying {
			// Out of the queue, the dying ones before it kept in order.
			c = x
			copy(ch.events[ch.head+1:j+1], ch.events[ch.head:j])
			ch.events[ch.head] = nil
			ch.head++
			c.got++
			break
		}
	}
	if ch.head == len(ch.events) {
		ch.events, ch.head = ch.events[:0], 0
	}
	// A waiter's read reset the counter while events may remain.
	ch.settle()
	return c, nil
}

// ready reports whether an event GetEvent may return is queued. Under mu.
func (ch *CompChannel) ready() bool {
	for _, x := range ch.events[ch.head:] {
		if !x.dying {
			return true
		}
	}
	return false
}

// settle makes the descriptor readable exactly while ready. Under mu.
func (ch *CompChannel) settle() {
	switch {
	case ch.closed:
	case ch.ready():
		_ = ch.efd.Add(1)
	default:
		_, _ = ch.efd.Take()
	}
}

// push queues an event for c. From c's interrupt handler. An event of a
// CQ being destroyed is queued too, for GetEvent to return if Destroy
// fails, but does not make the descriptor readable.
func (ch *CompChannel) push(c *CQ) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.closed {
		return
	}
	wasReady := c.dying || ch.ready()
	ch.events = append(ch.events, c)
	if !wasReady {
		_ = ch.efd.Add(1)
	}
}

// drop removes c's queued events (Destroy).
func (ch *CompChannel) drop(c *CQ) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	k := 0
	for _, x := range ch.events[ch.head:] {
		if x != c {
			ch.events[k] = x
			k++
		}
	}
	clear(ch.events[k:])
	ch.events, ch.head = ch.events[:k], 0
	if !ch.ready() && !ch.closed {
		_, _ = ch.efd.Take()
	}
}

// setDying marks c as being destroyed (Destroy, dying true) or no longer
// (a Destroy that failed, false), and makes the descriptor say whether
// GetEvent has an event to return now that c's count or not. Under mu.
func (ch *CompChannel) setDying(c *CQ, dying bool) {
	c.dying = dying
	ch.settle()
}

func (ch *CompChannel) use() error {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.closed {
		return cq.ErrClosed
	}
	ch.users++
	return nil
}

func (ch *CompChannel) unuse() {
	ch.mu.Lock()
	ch.users--
	ch.mu.Unlock()
}

// Close destroys the channel (ibv_destroy_comp_channel). It fails with an
// error matching cq.ErrBusy and syscall.EBUSY while CQs created with it
// are not destroyed.
// A GetEvent blocked on it returns os.ErrClosed. It is idempotent.
func (ch *CompChannel) Close() error {
	ch.mu.Lock()
	if ch.closed {
		ch.mu.Unlock()
		return nil
	}
	if ch.users > 0 {
		n := ch.users
		ch.mu.Unlock()
		s := "s"
		if n == 1 {
			s = ""
		}
		return &busyError{fmt.Sprintf("verbs: completion channel used by %d CQ%s", n, s)}
	}
	ch.closed = true
	ch.events, ch.head = nil, 0
	ch.mu.Unlock()
	return ch.efd.Close()
}

// AckEvents acknowledges n events that GetEvent returned for c
// (ibv_ack_cq_events); acknowledging in batches is cheaper. More than
// are unacknowledged counts as all of them.
func (c *CQ) AckEvents(n int) {
	ch := c.ch
	if ch == nil || n <= 0 {
		return
	}
	ch.mu.Lock()
	c.acked += min(uint64(n), c.got-c.acked)
	ch.mu.Unlock()
	select {
	case c.ackCh <- struct{}{}:
	default:
	}
}

// ReqNotify requests one completion event on the CQ's channel
// (ibv_req_notify_cq) for the next completion added to the CQ, or with
// solicitedOnly for the next solicited or error one. Completions already
// in the CQ raise no event; present reports them, so that the caller
// polls instead of sleeping (rxe's missed events). Arming again before
// the event gives one event; a "next" request takes precedence over a
// solicited one. A CQ without a channel only reports present. It must not
// be called between StartPoll and EndPoll.
//
// Every call arms the device, as rdma-core's providers write the arm
// doorbell on every ibv_req_notify_cq: the device's arm is one-shot, so a
// device interrupt that never arrives (lost) would otherwise leave the
// CQ armed here and disarmed there, with no event ever again. Re-arming
// an arm still pending moves the point it counts from up to the entries
// present now: they raise no event, and present reports them.
func (c *CQ) ReqNotify(solicitedOnly bool) (present bool, err error) {
	want := armNext
	if solicitedOnly {
		want = armSolicited
	}
	if c.ch != nil {
		c.nmu.Lock()
		defer c.nmu.Unlock()
	}
	// The fi_cq CQ underneath takes no lock of its own: this one keeps
	// the iterator out while the ring is counted.
	c.lock()
	defer c.unlock()
	if c.ch == nil {
		if present, err = c.held(); err != nil {
			return false, err
		}
	} else {
		// The stronger of the pending arm and this one: one event
		// fulfils both.
		arm := max(c.armed, want)
		if arm == armSolicited && c.swSolicited {
			return c.armSolicited()
		}
		if present, err = c.c.ReqNotify(arm == armSolicited); err != nil {
			return false, err
		}
		c.armed = arm
		if present && c.flags&IgnoreOverrun != 0 {
			// The fi_cq CQ counts an overrun as an entry held: ask
			// which it is.
			if present, err = c.held(); err != nil {
				return false, err
			}
		}
	}
	// Completions the iterator took from the ring but the caller has not
	// consumed are in the CQ too.
	return present || c.i < c.n || c.stashLen() > 0, nil
}

// held reports whether the ring holds a completion, error completions
// included. An overrun counts, so that the caller polls and meets
// cq.ErrOverrun, except on a CQ created IgnoreOverrun, where polling
// gives ErrEmpty: reporting it would have the caller poll for ever.
func (c *CQ) held() (bool, error) {
	switch _, err := c.c.Read(nil); err {
	case nil, cq.ErrAvail:
		return true, nil
	case cq.ErrOverrun:
		return c.flags&IgnoreOverrun == 0, nil
	case cq.ErrAgain:
		return false, nil
	default:
		return false, err
	}
}

// handle is the CQ's interrupt handler: each device interrupt fulfils the
// pending arm, if any, with one event on the channel. It returns when the
// CQ's eventfd is closed (Destroy).
func (c *CQ) handle(irq *eventfd.FD) {
	defer close(c.handlerDone)
	for {
		if _, err := irq.Wait(context.Background(), time.Time{}); err != nil {
			return
		}
		c.nmu.Lock()
		fire := c.armed != armNone
		if c.armed == armSolicited && c.swSolicited {
			fire = c.checkSolicited()
		}
		if fire {
			c.armed = armNone
		}
		c.nmu.Unlock()
		if fire {
			c.ch.push(c)
		}
	}
}
