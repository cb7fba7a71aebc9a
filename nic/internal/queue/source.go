package queue

import (
	"fmt"
	"math/bits"

	"github.com/vfnic/vfnic/cq"
	cqring "github.com/vfnic/vfnic/cq/ring"
	"github.com/vfnic/vfnic/nic"
)

// SourceRing is most of a Ring for a driver whose ring is read by one
// cqring.RingSource over one table, whose refusals all carry cq/ring's
// codes and whose interrupt needs no disarming (a socket's readiness:
// nic/afxdp, nic/afpacket). The driver embeds it and adds Read (with
// Take), Notify, Arm and Broken. The core calls it locked.
type SourceRing struct {
	Src *cqring.RingSource
	Tab *cqring.Table
	// Out counts the postings not completed: the driver adds its posts,
	// Take subtracts the completions.
	Out int
}

// NewSourceRing makes the reader of cfg's ring and its table of slots
// entries.
func NewSourceRing(cfg cqring.RingConfig, slots int) (SourceRing, error) {
	src, err := cqring.NewRingSource(cfg)
	if err != nil {
		return SourceRing{}, fmt.Errorf("%w: %s: %v", nic.ErrInvalid, cfg.Layout.Name, err)
	}
	// The queue's lock serialises posts and reads (Poll and a bound CQ's
	// ReadBatch both take it): no lock or release store of the table's own.
	tab, err := cqring.NewSingleThreadedTable(slots, bits.Len(uint(slots-1)))
	if err != nil {
		return SourceRing{}, fmt.Errorf("%w: %s: %v", nic.ErrInvalid, cfg.Layout.Name, err)
	}
	if err := src.BindTable(0, tab); err != nil {
		return SourceRing{}, err
	}
	return SourceRing{Src: src, Tab: tab}, nil
}

// Take is the ring reader's batch read into cs, each completion that
// ends a posting counted off Out.
func (r *SourceRing) Take(cs []cqring.Completion) int {
	n := r.Src.NextBatch(cs)
	for i := range cs[:n] {
		if cs[i].Done {
			r.Out--
		}
	}
	return n
}

// Publish implements Ring.
func (r *SourceRing) Publish() { r.Src.Publish() }

// Pending implements Ring.
func (r *SourceRing) Pending(max int) int { return r.Src.Pending(max) }

// Outstanding implements Ring.
func (r *SourceRing) Outstanding() int { return r.Out }

// Disarm implements Ring: a readiness needs no disarming.
func (r *SourceRing) Disarm() {}

// Err implements Ring: every refusal carries a cq/ring code.
func (r *SourceRing) Err(c *cqring.Completion) error {
	if err := c.Prov.Refusal(); err != nil {
		return err
	}
	return nic.ErrDeviceStatus
}

// StrError implements Ring: only cq's own codes, which the CQ describes
// itself.
func (r *SourceRing) StrError(prov cq.ProvErrno, data []byte) (string, bool) { return "", false }

// Table implements Ring.
func (r *SourceRing) Table() *cqring.Table { return r.Tab }

// ArmReadiness is Ring.Arm for a queue whose interrupt is a readiness,
// which needs no arming: a CQ the queue feeds is armed through its
// Forwarder (late: completions are ready now). Called locked.
func (q *Queue) ArmReadiness() (late, ok bool) {
	if q.FW != nil {
		return q.FW.Arm(), true
	}
	return false, true
}

// Notifier is a Ring whose Notify can fail (a system call): Flush returns
// the error NotifyErr gives back once.
type Notifier interface {
	NotifyErr() error
}

// ErrFrameSize is a send's error for a frame shorter than nic.MinFrame or
// longer than the queue takes, prepared once so that returning it does
// not allocate.
var ErrFrameSize = fmt.Errorf("%w: frame outside [%d, MaxFrame] bytes", nic.ErrFrameSize, nic.MinFrame)

// ErrNilFill is SendFunc's error for a nil fill.
var ErrNilFill = fmt.Errorf("%w: SendFunc with a nil fill", nic.ErrInvalid)

// SendFunc is nic.TxQueue.SendFunc over a driver's one send path, send,
// which takes the frame's length and either the frame to copy or fill:
// a nil fill is refused before send runs.
func SendFunc(send func(n int, ctx any, frame []byte, fill func([]byte)) error, n int, ctx any, fill func([]byte)) error {
	if fill == nil {
		return ErrNilFill
	}
	return send(n, ctx, nil, fill)
}

// Write puts a send's frame into its buffer b, whose length is the
// frame's: fill's in-place write (SendFunc), else a copy of frame (Send).
// One send path serves both, without a closure per Send.
func Write(b, frame []byte, fill func([]byte)) {
	if fill != nil {
		fill(b)
		return
	}
	copy(b, frame)
}

// LockSend begins a send of a frame of n bytes on a queue that takes at
// most max: nil with Mu held (the caller unlocks), or why not (the
// frame's size, the queue closed or broken) with Mu not held.
func (q *Queue) LockSend(n, max int) error {
	if err := checkFrame(n, max); err != nil {
		return err
	}
	q.Mu.Lock()
	if err := q.Usable(); err != nil {
		q.Mu.Unlock()
		return err
	}
	return nil
}

// FreeSlots is a stack of a table's free slots, for a driver that keys a
// buffer of its own to each slot and posts with PostSlot: the slot whose
// send completed last is posted next, so that the buffers in use stay
// few and in the CPU's caches (as DPDK's mempool cache keeps recently
// freed mbufs), where the table's own free queue would cycle through
// every buffer. Used under the queue's lock.
type FreeSlots struct{ s []uint32 }

// NewFreeSlots returns the stack of slots 0 to n-1, slot 0 on top.
func NewFreeSlots(n int) FreeSlots {
	f := FreeSlots{s: make([]uint32, n)}
	for i := range f.s {
		f.s[i] = uint32(n - 1 - i)
	}
	return f
}

// Post posts op into the slot on top, which it returns; ErrNoDesc when
// none is free (or the table has not published the slot's release yet,
// which it does at the end of each read).
func (f *FreeSlots) Post(t *cqring.Table, op cqring.Op) (uint32, error) {
	top := len(f.s) - 1
	if top < 0 {
		return 0, ErrNoDesc
	}
	slot := f.s[top]
	if _, err := t.PostSlot(slot, op); err != nil {
		return 0, ErrNoDesc
	}
	f.s = f.s[:top]
	return slot, nil
}

// Release puts back the slots of the completions in cs that ended their
// posting (Done; with ids without generation bits, an id is its slot).
func (f *FreeSlots) Release(cs []cqring.Completion) {
	for i := range cs {
		if cs[i].Done {
			f.s = append(f.s, cs[i].ID) // within capacity: one per slot
		}
	}
}
