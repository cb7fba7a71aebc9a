package virtio

import (
	"context"
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

		// A reader blocks; the removal wakes it.
		woke := make(chan error, 1)
		go func() {
			_, err := rx.SRead(context.Background(), make([]nic.Completion, 1), 1, -1)
			woke <- err
		}()
		time.Sleep(20 * time.Millisecond)
		rx.close(errRemoved)
		_ = rx.Interrupt().Close() // as teardown does, after the queues
		seen := map[any]bool{}
		for {
			n := rx.Poll(comps[:])
			if n == 0 {
				break
			}
			require.Equal(t, 1, n, "one error completion per Poll")
			require.ErrorIs(t, comps[0].Err, nic.ErrCanceled)
			require.ErrorIs(t, comps[0].Err, nic.ErrRemoved)
			require.Nil(t, comps[0].Data)
			require.False(t, seen[comps[0].Context], "each once")
			seen[comps[0].Context] = true
		}
		require.Equal(t, map[any]bool{0: true, 1: true, 2: true, 3: true, 4: true}, seen, "the five posted, the reposted one under its new context")

		select {
		case err := <-woke:
			require.ErrorIs(t, err, nic.ErrRemoved)
			require.ErrorIs(t, err, nic.ErrClosed)
		case <-time.After(5 * time.Second):
			t.Fatal("the blocked reader was not woken")
		}
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
	tx.close(nic.ErrClosed)
	var comps [4]nic.Completion
	require.Zero(t, tx.Poll(comps[:]))
	require.ErrorIs(t, tx.Send(frameFor(2, 64), nil), nic.ErrClosed)
}
