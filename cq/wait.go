package cq

import (
	"context"
	"errors"
	"runtime"
	"time"

	"github.com/vfnic/vfnic/eventfd"
)

// SRead is the blocking Read (fi_cq_sread). It returns as soon as
// completions are available, or, on a CQ opened with CondThreshold, when
// cond entries are queued (at most len(ents)). A timeout below zero waits
// forever, zero tries once; the timeout counts down across spurious
// wake-ups. When it expires the queue is read once more, and ErrTimeout
// is returned if nothing was there. A Signal, even one sent before the
// call, wakes SRead with ErrSignaled when nothing is queued; both errors
// match ErrAgain. ctx cancellation returns ctx.Err(); Close returns
// ErrClosed. On a CQ without a wait object SRead returns ErrNoWait.
//
// SRead arms the device's interrupt, polls once more, then sleeps on the
// CQ's eventfd (eventfd.FD.Wait): parked on the runtime poller, holding no
// OS thread, or, on a thread pinned to one CPU, with that thread asleep in
// the kernel so that the interrupt wakes it directly. Any number of goroutines may block at once: one
// waits on the eventfd and wakes the others.
func (c *CQ) SRead(ctx context.Context, ents []Entry, cond int, timeout time.Duration) (int, error) {
	return c.sread(ctx, ents, nil, cond, timeout)
}

// SReadFrom is SRead with source addresses, as ReadFrom (fi_cq_sreadfrom).
func (c *CQ) SReadFrom(ctx context.Context, ents []Entry, addrs []Addr, cond int, timeout time.Duration) (int, error) {
	if len(addrs) < len(ents) {
		return 0, errShortAddrs
	}
	return c.sread(ctx, ents, addrs[:len(ents)], cond, timeout)
}

func (c *CQ) sread(ctx context.Context, ents []Entry, addrs []Addr, cond int, timeout time.Duration) (int, error) {
	if c.attr.WaitObj == WaitNone {
		return 0, ErrNoWait
	}
	if ctx == nil {
		return 0, errNilContext
	}
	if len(ents) == 0 {
		return c.read(ents, addrs)
	}
	thr := 1
	if c.attr.WaitCond == CondThreshold && cond > 1 {
		thr = min(cond, len(ents))
	}
	return eventfd.Block(ctx, cqRead{c: c, ents: ents, addrs: addrs, thr: thr}, timeout)
}

// cqRead is one SRead, for eventfd.Block (the loop a NIC queue's SRead
// runs too). Its reads are all or nothing: Poll moves entries only when
// it ends the call.
type cqRead struct {
	c     *CQ
	ents  []Entry
	addrs []Addr
	thr   int
}

// Poll implements eventfd.Reader: a Signal, even one sent before the call,
// ends it (ErrSignaled when nothing is queued); otherwise a read once thr
// entries are queued.
func (r cqRead) Poll(int) (int, bool, error) {
	if r.c.signal.Swap(false) {
		n, err := r.c.read(r.ents, r.addrs)
		if err == ErrAgain {
			err = ErrSignaled
		}
		return n, true, err
	}
	return r.c.tryRead(r.ents, r.addrs, r.thr)
}

// Arm implements eventfd.Reader; the token is the wake-up generation taken
// before arming (park).
func (r cqRead) Arm(int) (uint64, error) {
	gen := r.c.generation()
	return gen, r.c.arm(r.thr)
}

// Sleep implements eventfd.Reader.
func (r cqRead) Sleep(ctx context.Context, deadline time.Time, gen uint64) error {
	return r.c.park(ctx, deadline, gen)
}

// Expire implements eventfd.Reader: the queue is read once more.
func (r cqRead) Expire(int) (int, error) { return r.c.finalRead(r.ents, r.addrs) }

// Stop implements eventfd.Reader.
func (r cqRead) Stop(_ int, err error) (int, error) { return 0, err }

// tryRead reads when enough entries are queued; done says whether the
// result is final.
func (c *CQ) tryRead(ents []Entry, addrs []Addr, thr int) (int, bool, error) {
	if thr > 1 && c.pending(thr) < thr {
		return 0, false, nil
	}
	n, err := c.read(ents, addrs)
	if err == ErrAgain {
		return 0, false, nil
	}
	return n, true, err
}

func (c *CQ) finalRead(ents []Entry, addrs []Addr) (int, error) {
	n, err := c.read(ents, addrs)
	if err == ErrAgain {
		err = ErrTimeout
	}
	return n, err
}

// pending counts ready entries over all sources, up to max.
func (c *CQ) pending(max int) int {
	c.lock()
	defer c.unlock()
	return c.pendingLocked(max)
}

func (c *CQ) pendingLocked(max int) int {
	if c.closed || c.fatal {
		return max
	}
	n := 0
	for _, s := range c.sources() {
		n += s.Pending(max - n)
		if n >= max {
			return max
		}
	}
	return n
}

func (c *CQ) arm(thr int) error {
	if c.attr.WaitObj == WaitYield {
		return nil
	}
	c.lock()
	defer c.unlock()
	return c.armLocked(thr)
}

// armLocked arms the sources' interrupts for thr entries queued. A device
// counts the entries of its own ring only, so with several sources (a
// device's receive and transmit rings bound to one CQ) each is armed for
// its share of what is missing beyond what it holds, d = ceil((thr -
// held) / n) more: once thr entries are queued, one source has d more and
// fires. A source that fires first only wakes the reader to count again;
// one that holds its share already when armed (the device got there
// between the count and the arm) fires at once (Source.Arm), or the
// reader would sleep through it.
func (c *CQ) armLocked(thr int) error {
	if c.closed {
		return nil
	}
	srcs := c.sources()
	if len(srcs) == 1 || thr <= 1 {
		for _, s := range srcs {
			if err := s.Arm(false, thr); err != nil {
				return err
			}
		}
		return nil
	}
	// The counts of the first sources, kept on the stack: with more
	// sources than that, each is armed for its next entry (d = 1).
	var buf [8]int
	var held []int
	d := 1
	if len(srcs) <= len(buf) {
		held = buf[:len(srcs)]
		total := 0
		for i, s := range srcs {
			held[i] = s.Pending(thr)
			total += held[i]
		}
		if total < thr {
			d = (thr - total + len(srcs) - 1) / len(srcs)
		}
	}
	for i, s := range srcs {
		var h int
		if held != nil {
			h = held[i]
		} else {
			h = s.Pending(thr)
		}
		if err := s.Arm(false, h+d); err != nil {
			return err
		}
	}
	return nil
}

func (c *CQ) generation() uint64 {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.wakeGen
}

// park sleeps until an interrupt, a Signal, the deadline, ctx or Close. The
// first goroutine to park waits on the eventfd (one waiter at a time); the
// others wait for it to wake and re-poll. gen, taken before arming, makes a
// wake-up that happened since then return at once, so no interrupt is lost
// between a follower's last poll and its sleep.
func (c *CQ) park(ctx context.Context, deadline time.Time, gen uint64) error {
	if c.attr.WaitObj == WaitYield {
		runtime.Gosched()
		select {
		case <-c.done:
			return ErrClosed
		default:
			return ctx.Err()
		}
	}
	c.wmu.Lock()
	if c.wakeGen != gen {
		c.wmu.Unlock()
		return nil
	}
	if !c.leading {
		c.leading = true
		c.wmu.Unlock()
		_, err := c.wait.Wait(ctx, deadline)
		c.wmu.Lock()
		c.leading = false
		c.wakeGen++
		// Followers took wakeCh to sleep on: close it to wake them. With
		// none (the usual single reader) keep it, so a wake-up allocates
		// nothing.
		if c.wakeTaken {
			close(c.wakeCh)
			c.wakeCh = make(chan struct{})
			c.wakeTaken = false
		}
		c.wmu.Unlock()
		switch {
		case err == nil, errors.Is(err, eventfd.ErrTimeout):
			return nil
		case errors.Is(err, eventfd.ErrClosed):
			return ErrClosed
		case ctx.Err() != nil:
			return ctx.Err()
		}
		return err
	}
	ch := c.wakeCh
	c.wakeTaken = true
	c.wmu.Unlock()
	var tc <-chan time.Time
	if !deadline.IsZero() {
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		tc = t.C
	}
	select {
	case <-ch:
	case <-tc:
	case <-ctx.Done():
		return ctx.Err()
	case <-c.done:
		return ErrClosed
	}
	return nil
}

// Signal wakes a goroutine blocked in SRead, which returns ErrSignaled if
// nothing is queued (fi_cq_signal). A Signal with no reader blocked is
// remembered and consumed by the next SRead. It returns ErrNoWait on a CQ
// without a wait object.
func (c *CQ) Signal() error {
	if c.attr.WaitObj == WaitNone {
		return ErrNoWait
	}
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return ErrClosed
	}
	c.signal.Store(true)
	if c.wait != nil {
		if err := c.wait.Add(1); err != nil && !errors.Is(err, eventfd.ErrClosed) {
			return err
		}
	}
	return nil
}

// WaitFD returns the file descriptor of the CQ's wait object (FI_GETWAIT),
// an eventfd usable with poll, select and epoll, for CQs opened with WaitFD
// or WaitUnspec. Before blocking on it, call TryWait. Other wait objects
// have no descriptor: ErrNoData. The descriptor stays owned by the CQ.
func (c *CQ) WaitFD() (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return -1, ErrClosed
	}
	if c.wait == nil || (c.attr.WaitObj != WaitFD && c.attr.WaitObj != WaitUnspec) {
		return -1, ErrNoData
	}
	return c.wait.Fd(), nil
}

// TryWait readies the wait object for a caller about to block on WaitFD
// (fi_trywait): it returns ErrAgain when completions (or an error, or an
// overrun) are already queued, so the caller reads instead of blocking;
// otherwise it clears the descriptor, arms the device interrupts and
// returns nil, after which the descriptor becomes readable when an entry
// arrives.
func (c *CQ) TryWait() error {
	if c.wait == nil {
		return ErrNoWait
	}
	c.lock()
	defer c.unlock()
	if c.closed {
		return ErrClosed
	}
	if c.pendingLocked(1) > 0 {
		return ErrAgain
	}
	if _, err := c.wait.Take(); err != nil {
		return err
	}
	if err := c.armLocked(1); err != nil {
		return err
	}
	if c.pendingLocked(1) > 0 {
		return ErrAgain
	}
	return nil
}

// ReqNotify arms the device interrupt of every source for one completion
// beyond those the CQ holds now (solicitedOnly: a solicited or error one),
// and reports whether entries are held, so that a caller polls them
// instead of sleeping: the primitive under verbs' ibv_req_notify_cq, where
// entries present at the arm raise no event. One interrupt per arm, on
// the CQ's wait object (the eventfd of Driver.Interrupt); SRead and
// TryWait must not be used on the same CQ, as they consume it.
func (c *CQ) ReqNotify(solicitedOnly bool) (present bool, err error) {
	c.lock()
	defer c.unlock()
	if c.closed {
		return false, ErrClosed
	}
	for _, s := range c.sources() {
		if err := s.Arm(solicitedOnly, 0); err != nil {
			return false, err
		}
	}
	// Counted after the arm: an entry that lands between the arm and this
	// count both fires and is reported (a spurious wake-up, allowed),
	// where one counted before the arm could be neither.
	return c.pendingLocked(1) > 0, nil
}
