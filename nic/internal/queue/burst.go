package queue

import (
	"fmt"

	"github.com/vfnic/vfnic/nic"
)

// Post is a driver's send path after the checks every send shares
// (LockSend's): it posts one n-byte frame, copied from frame or written by
// fill (Write), with ctx. Called with Mu held, the queue usable and n
// within the queue's bounds; it returns nic.ErrFull (or an error that
// wraps it) when the ring has no room. The driver's Send and SendFunc
// call it after LockSend, its SendBurst through BurstVia.
type Post func(n int, ctx any, frame []byte, fill func([]byte)) error

// ErrBurstContexts is SendBurst's error for contexts that are neither nil
// nor one per frame.
var ErrBurstContexts = fmt.Errorf("%w: SendBurst with a context slice whose length is not the frames'", nic.ErrInvalid)

// BurstVia is nic.TxQueue.SendBurst over a driver's post, for a queue
// that takes frames of at most max bytes: the frames posted in order
// under one lock until one is refused, ctxs[i] (nil ctxs: no contexts)
// with frames[i]. It returns how many were posted and why the next was
// not (ErrFrameSize, the ring full, the queue closed or broken).
func (q *Queue) BurstVia(frames [][]byte, ctxs []any, max int, post Post) (int, error) {
	if ctxs != nil && len(ctxs) != len(frames) {
		return 0, ErrBurstContexts
	}
	if len(frames) == 0 {
		return 0, nil
	}
	q.Mu.Lock()
	defer q.Mu.Unlock()
	if err := q.Usable(); err != nil {
		return 0, err
	}
	for i, f := range frames {
		if len(f) < nic.MinFrame || len(f) > max {
			return i, ErrFrameSize
		}
		var ctx any
		if ctxs != nil {
			ctx = ctxs[i]
		}
		if err := post(len(f), ctx, f, nil); err != nil {
			return i, err
		}
	}
	return len(frames), nil
}
