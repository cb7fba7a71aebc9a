// Package canceled keeps, for the NIC drivers, the operations a queue
// still held when it closed, and hands them out one completion at a time:
// to the queue's own Poll (nic.ErrCanceled after the kernel took the device
// back) or to the cq.CQ the queue fed (flushed: cq.ECANCELED, as verbs'
// IBV_WC_WR_FLUSH_ERR and fi_cq's FI_ECANCELED report them).
package canceled

import (
	"github.com/vfnic/vfnic/cq"
	cqring "github.com/vfnic/vfnic/cq/ring"
	"github.com/vfnic/vfnic/nic"
)

// Flushed is what a driver's StrError says of ProvErrno 0 in an error
// completion: the only error entry its queues make with that number is a
// flushed one (Next).
const Flushed = "operation flushed: its queue closed before the device completed it"

// List is the completions a closed queue still owes, in the order they
// were added. It is not safe for concurrent use: the queue's lock guards
// it. The zero List is empty.
type List struct {
	comps []nic.Completion
}

// Add keeps a completion for the operation posted with ctx on queue
// (nic.Completion.Queue), failed with err. Close path: it may allocate.
func (l *List) Add(ctx any, queue int, err error) {
	l.comps = append(l.comps, nic.Completion{Context: ctx, Queue: queue, Err: err})
}

// Len is the number of completions still kept.
func (l *List) Len() int { return len(l.comps) }

// Take moves the first kept completion into out and returns 1, or 0 when
// out is empty or nothing is kept: one per call, since an error
// completion is always the last of a Poll.
func (l *List) Take(out []nic.Completion) int {
	if len(out) == 0 || len(l.comps) == 0 {
		return 0
	}
	out[0] = l.comps[0]
	l.comps[0] = nic.Completion{} // the context is the caller's now
	l.comps = l.comps[1:]
	if len(l.comps) == 0 {
		l.comps = nil
	}
	return 1
}

// Next takes the first kept completion (Take) into c as a CQ reads it: a
// refused entry for the operation's context with cq.ECANCELED, flags (the
// flags its queue posts with, cq.FlagRecv or cq.FlagSend with cq.FlagMsg),
// no length and ProvErrno 0. False when nothing is kept.
func (l *List) Next(c *cqring.Completion, flags cq.Flags) bool {
	var one [1]nic.Completion
	if l.Take(one[:]) == 0 {
		return false
	}
	*c = cqring.Completion{Context: one[0].Context, Flags: flags, Err: cq.ECANCELED}
	return true
}

// Drop forgets every kept completion: the CQ they were for is gone (a
// closed CQ loses what it still held).
func (l *List) Drop() { l.comps = nil }
