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

// ErrBurstContexts is a burst's error (SendBurst, RepostBurst) for
// contexts that are neither nil nor one per frame or buffer.
var ErrBurstContexts = fmt.Errorf("%w: a burst's context slice is neither nil nor as long as its frames or buffers", nic.ErrInvalid)

// checkContexts checks a burst of n items' contexts: nil, or one each.
func checkContexts(n int, ctxs []any) error {
	if ctxs != nil && len(ctxs) != n {
		return ErrBurstContexts
	}
	return nil
}

// contextAt is item i's context in a burst (nil when ctxs is).
func contextAt(ctxs []any, i int) any {
	if ctxs == nil {
		return nil
	}
	return ctxs[i]
}

// checkFrame is every send's check of a frame's length: ErrFrameSize
// outside [nic.MinFrame, max].
func checkFrame(n, max int) error {
	if n < nic.MinFrame || n > max {
		return ErrFrameSize
	}
	return nil
}

// BurstVia is nic.TxQueue.SendBurst over a driver's post, for a queue
// that takes frames of at most max bytes: the frames posted in order
// under one lock until one is refused, ctxs[i] (nil ctxs: no contexts)
// with frames[i]. It returns how many were posted and why the next was
// not (ErrFrameSize, the ring full, the queue closed or broken).
func (q *Queue) BurstVia(frames [][]byte, ctxs []any, max int, post Post) (int, error) {
	if err := checkContexts(len(frames), ctxs); err != nil {
		return 0, err
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
		if err := checkFrame(len(f), max); err != nil {
			return i, err
		}
		if err := post(len(f), contextAt(ctxs, i), f, nil); err != nil {
			return i, err
		}
	}
	return len(frames), nil
}
