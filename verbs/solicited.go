package verbs

import (
	"errors"

	"github.com/vfnic/vfnic/cq"
)

// SolicitedNotifier is a Provider whose devices raise a solicited-only
// arm's interrupt themselves, only for a solicited or an error completion
// (the software device, which knows a send's solicited bit).
//
// For any other provider (a NIC, whose interrupt follows every completion)
// the verbs layer filters: while a solicited-only arm is pending, each
// interrupt makes the CQ take the completions from the ring into a queue
// of its own, each read once, in order, ahead of the ring's; the event
// fires when one of them is an error. Without a messaging layer that
// carries a solicited bit, an error is the only solicited completion (the
// spec's "any unsuccessful work completion").
type SolicitedNotifier interface {
	Provider
	// NotifiesSolicited reports whether the device filters solicited-only
	// arms itself.
	NotifiesSolicited() bool
}

// stashed is a completion the CQ took from the ring to look for a
// solicited one, with what the iterator reports for it.
type stashed struct {
	e      cq.Entry
	addr   cq.Addr
	status WCStatus
	vendor uint32
}

// filtersSolicited reports whether p leaves solicited-only arms to the
// verbs layer.
func filtersSolicited(p Provider) bool {
	sn, ok := p.(SolicitedNotifier)
	return !ok || !sn.NotifiesSolicited()
}

// stashLen is the number of stashed completions not yet read.
func (c *CQ) stashLen() int { return len(c.stash) - c.sh }

// loadStash makes the oldest stashed completion current, with the
// successes that follow it up to a batch. The buffer is empty. Called
// locked.
func (c *CQ) loadStash() error {
	s := c.stash[c.sh:]
	if s[0].status != WCSuccess {
		c.ents[errSlot] = s[0].e
		c.co, c.valid, c.curErr = errSlot*entSize, true, true
		c.status, c.vendor = s[0].status, s[0].vendor
		c.popStash(1)
		return nil
	}
	k := 0
	for k < len(s) && k < batch && s[k].status == WCSuccess {
		c.ents[k], c.addrs[k] = s[k].e, s[k].addr
		k++
	}
	c.popStash(k)
	c.n = k
	c.co, c.valid, c.lim = 0, true, uintptr(k)*entSize
	c.status, c.vendor = WCSuccess, 0
	return nil
}

// popStash drops the k oldest stashed completions.
func (c *CQ) popStash(k int) {
	clear(c.stash[c.sh : c.sh+k]) // their contexts are the caller's now
	c.sh += k
	if c.sh == len(c.stash) {
		c.stash, c.sh = c.stash[:0], 0
	}
}

// drain moves every completion the ring holds to the stash and reports
// whether one of them is an error (solicited). Called locked, outside a
// batch. Errors other than an empty ring are returned (an overrun, unless
// the CQ ignores it; a closed CQ).
func (c *CQ) drain() (solicited bool, err error) {
	if c.dbuf == nil {
		c.dbuf, c.daddr = new([batch]cq.Entry), new([batch]cq.Addr)
	}
	for {
		var k int
		k, err = c.readRing(c.dbuf[:], c.daddr[:])
		for i := range k {
			c.stash = append(c.stash, stashed{e: c.dbuf[i], addr: c.daddr[i], status: WCSuccess})
		}
		clear(c.dbuf[:k])
		if k > 0 {
			continue
		}
		switch err {
		case cq.ErrAgain:
			return solicited, nil
		case cq.ErrAvail:
			status, vendor, err := c.readErr()
			if err != nil {
				return solicited, err
			}
			c.stash = append(c.stash, stashed{e: c.errEnt.Entry, addr: cq.AddrNotAvail, status: status, vendor: vendor})
			c.errEnt.Context = nil
			solicited = true
			continue
		}
		if err = c.mapErr(err); err == ErrEmpty {
			return solicited, nil
		}
		return solicited, err
	}
}

// armSolicited is ReqNotify's solicited-only arm when the verbs layer
// filters it. The completions present now raise no event: they are taken
// into the stash, so that the handler looks only at those written after
// the arm; the device is armed for the next completion, whatever it is.
// Called with nmu and the CQ's lock held.
func (c *CQ) armSolicited() (present bool, err error) {
	if c.single {
		// The handler would read the ring beside the caller's thread.
		return false, unsupported("solicited-only notification on a SingleThreaded CQ of a device that does not filter it")
	}
	switch _, err := c.drain(); err {
	case nil:
	case cq.ErrOverrun:
		present = true // the caller polls and meets it
	default:
		return false, err
	}
	p, err := c.c.ReqNotify(false)
	if err != nil {
		return false, err
	}
	c.armed = armSolicited
	if p {
		// Written between the drain and the arm: the handler takes it
		// and fires if it is an error.
		_ = c.irq.Add(1)
	}
	return present || c.i < c.n || c.stashLen() > 0, nil
}

// checkSolicited is the interrupt handler's part of a solicited-only arm
// that the verbs layer filters: it arms the device for the next
// completion again, then takes what the ring holds, so that a completion
// written meanwhile is either taken now or interrupts later. It reports
// whether the event fires: an error completion was taken, or the ring
// failed (an overrun), which the caller must learn.
func (c *CQ) checkSolicited() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	// The arm fails when the CQ is destroyed (then so does the drain) or
	// when a device queue has closed: nothing more comes from that one,
	// but what it flushed into the CQ at the close (the interrupt that
	// woke us) is still to be looked at.
	_, _ = c.c.ReqNotify(false)
	found, err := c.drain()
	if errors.Is(err, cq.ErrClosed) {
		return false // destroyed: the handler is about to return
	}
	return found || err != nil
}
