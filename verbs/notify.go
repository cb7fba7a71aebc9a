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

// pop takes the oldest event, skipping those of CQs being destroyed; nil
// when none is queued. The descriptor stays readable exactly while events
// remain.
func (ch *CompChannel) pop() (*CQ, error) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.closed {
		return nil, cq.ErrClosed
	}
	var c *CQ
	for c == nil && ch.head < len(ch.events) {
		c = ch.events[ch.head]
		ch.events[ch.head] = nil
		ch.head++
		if c.dying {
			c = nil
		}
	}
	if c != nil {
		c.got++
	}
	if ch.head == len(ch.events) {
		ch.events, ch.head = ch.events[:0], 0
		_, _ = ch.efd.Take()
	} else {
		// A waiter's read reset the counter while events remain.
		_ = ch.efd.Add(1)
	}
	return c, nil
}

// push queues an event for c. From c's interrupt handler.
func (ch *CompChannel) push(c *CQ) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.closed || c.dying {
		return
	}
	ch.events = append(ch.events, c)
	if len(ch.events)-ch.head == 1 {
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
	if k == 0 && !ch.closed {
		_, _ = ch.efd.Take()
	}
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
// error matching cq.ErrBusy while CQs created with it are not destroyed.
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
		return fmt.Errorf("verbs: %w: completion channel used by %d CQ(s)", cq.ErrBusy, n)
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
	if want == armSolicited && c.ch != nil && c.swSolicited && c.armed < want {
		if c.single {
			// The handler would read the ring beside the caller's thread.
			return false, unsupported("solicited-only notification on a SingleThreaded CQ of a device that does not filter it")
		}
		// Completions present now raise no event: take them, so that the
		// handler looks only at those written after the arm.
		if _, err := c.drain(); err != nil {
			return false, err
		}
		p, err := c.c.ReqNotify(false)
		if err != nil {
			return false, err
		}
		c.armed = want
		if p {
			// Written between the drain and the arm: the handler takes it
			// and fires if it is an error.
			_ = c.irq.Add(1)
		}
		return c.i < c.n || c.stashLen() > 0, nil
	}
	if c.ch == nil || c.armed >= want {
		// Nothing to arm: an arm already pending keeps counting from when
		// it was made, so re-arming the device would lose its event.
		switch _, err := c.c.Read(nil); err {
		case nil, cq.ErrAvail, cq.ErrOverrun:
			present = true
		case cq.ErrAgain:
		default:
			return false, err
		}
	} else {
		if present, err = c.c.ReqNotify(want == armSolicited); err != nil {
			return false, err
		}
		c.armed = want
	}
	// Completions the iterator took from the ring but the caller has not
	// consumed are in the CQ too.
	return present || c.i < c.n || c.stashLen() > 0, nil
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
