package virtio

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/nic"
)

// TestRemovedCancelsOutstanding: when the kernel takes the device back,
// each operation still posted completes once with ErrCanceled and its
// context, and then every operation, a blocked reader included, fails
// with an error wrapping nic.ErrRemoved and nic.ErrClosed.
func TestRemovedCancelsOutstanding(t *testing.T) {
	forRings(t, func(t *testing.T, packed bool) {
		r := newRig(t, 8, packed, true, 64<<10)
		rx := r.rxQueue(t, 16, 2048, false)
		for i := range 5 {
			require.NoError(t, rx.PostRecv(i))
		}
		require.NoError(t, rx.Flush())
		// One completes normally before the removal.
		x, ok := r.dev.take()
		require.True(t, ok)
		r.dev.complete(x.id, writeFrame(x, frameFor(1, 64), 1), x.ndesc)
		var comps [8]nic.Completion
		require.Equal(t, 1, rx.Poll(comps[:]))
		require.NoError(t, comps[0].Err)
		require.NoError(t, rx.Repost(comps[0].Buf, 0))

		// A reader blocks; the removal wakes it, and it reads each
		// outstanding operation once as canceled, then the removal error.
		type result struct {
			seen map[any]int
			err  error
		}
		woke := make(chan result, 1)
		go func() {
			res := result{seen: map[any]int{}}
			out := make([]nic.Completion, 4)
			for {
				n, err := rx.SRead(context.Background(), out, 1, -1)
				for _, c := range out[:n] {
					if !errors.Is(c.Err, nic.ErrCanceled) || !errors.Is(c.Err, nic.ErrRemoved) || c.Data != nil {
						res.err = fmt.Errorf("completion %+v is not a canceled one", c)
						woke <- res
						return
					}
					res.seen[c.Context]++
				}
				if err != nil {
					res.err = err
					woke <- res
					return
				}
			}
		}()
		time.Sleep(20 * time.Millisecond)
		rx.CloseQueue(nic.ErrRemovedClosed)
		_ = rx.Interrupt().Close() // as teardown does, after the queues
		select {
		case res := <-woke:
			require.ErrorIs(t, res.err, nic.ErrRemoved)
			require.ErrorIs(t, res.err, nic.ErrClosed)
			require.Equal(t, map[any]int{0: 1, 1: 1, 2: 1, 3: 1, 4: 1}, res.seen,
				"the five posted once each, the reposted one under its new context")
		case <-time.After(5 * time.Second):
			t.Fatal("the blocked reader was not woken")
		}
		require.Zero(t, rx.Poll(comps[:]), "nothing left")
		require.ErrorIs(t, rx.PostRecv(nil), nic.ErrRemoved)
		require.ErrorIs(t, rx.Flush(), nic.ErrRemoved)
	})
}

// TestCloseCancelsNothing: a plain Close reports no canceled operations.
func TestCloseCancelsNothing(t *testing.T) {
	r := newRig(t, 8, true, true, 64<<10)
	tx := r.txQueue(t, 1500)
	require.NoError(t, tx.Send(frameFor(1, 64), "a"))
	require.NoError(t, tx.Flush())
	tx.CloseQueue(nic.ErrClosed)
	var comps [4]nic.Completion
	require.Zero(t, tx.Poll(comps[:]))
	require.ErrorIs(t, tx.Send(frameFor(2, 64), nil), nic.ErrClosed)
}
