package eventfd

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A wait with a context that can end allocates no more than one with
// context.Background once the FD has registered that context (a server
// reads with the same one again and again). Both allocate nothing, but
// under the race detector the 8-byte buffers of Add and of the poller's
// Read escape, so the test compares the two.
func TestWaitContextNoAllocs(t *testing.T) {
	eachWait(t, func(t *testing.T, e *FD, wait waitFunc) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		allocs := func(ctx context.Context) float64 {
			require.NoError(t, e.Add(1))
			_, err := wait(ctx, time.Time{})
			require.NoError(t, err)
			return testing.AllocsPerRun(50, func() {
				_ = e.Add(1)
				if n, err := wait(ctx, time.Time{}); n != 1 || err != nil {
					t.Errorf("wait: %d %v", n, err)
				}
			})
		}
		require.Equal(t, allocs(context.Background()), allocs(ctx))
	})
}

// The end of a context the FD still watches for an earlier wait wakes
// the current sleeper, which sees that its own context goes on and sleeps
// again until its event.
func TestWaitOtherContextEnds(t *testing.T) {
	eachWait(t, func(t *testing.T, e *FD, wait waitFunc) {
		other, cancelOther := context.WithCancel(context.Background())
		_, err := wait(other, time.Now().Add(time.Millisecond))
		require.ErrorIs(t, err, ErrTimeout)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			time.Sleep(10 * time.Millisecond)
			cancelOther()
			time.Sleep(20 * time.Millisecond)
			_ = e.Add(3)
		}()
		t0 := time.Now()
		n, err := wait(ctx, time.Time{})
		require.NoError(t, err)
		require.EqualValues(t, 3, n)
		require.GreaterOrEqual(t, time.Since(t0), 25*time.Millisecond, "returned before its event")
	})
}

// Two thread sleepers with their own contexts: the end of one's context
// returns that one, and the other sleeps on until its event.
func TestWaitThreadCancelOneOfTwo(t *testing.T) {
	e, err := New()
	require.NoError(t, err)
	defer e.Close()
	ctx1, cancel1 := context.WithCancel(context.Background())
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	type result struct {
		n   uint64
		err error
	}
	r1, r2 := make(chan result, 1), make(chan result, 1)
	go func() { n, err := e.waitThread(ctx1, time.Time{}, true); r1 <- result{n, err} }()
	go func() { n, err := e.waitThread(ctx2, time.Time{}, true); r2 <- result{n, err} }()
	time.Sleep(20 * time.Millisecond)
	cancel1()
	select {
	case r := <-r1:
		require.ErrorIs(t, r.err, context.Canceled)
	case <-time.After(5 * time.Second):
		t.Fatal("the canceled sleeper did not return")
	}
	select {
	case r := <-r2:
		t.Fatalf("the other sleeper returned: %d %v", r.n, r.err)
	case <-time.After(20 * time.Millisecond):
	}
	require.NoError(t, e.Add(1))
	select {
	case r := <-r2:
		require.NoError(t, r.err)
		require.EqualValues(t, 1, r.n)
	case <-time.After(5 * time.Second):
		t.Fatal("the other sleeper did not wake on its event")
	}
}

// An FD keeps few registrations of contexts no wait uses, and none after
// Close; a context that ends after Close touches nothing.
func TestWatchesBounded(t *testing.T) {
	eachWait(t, func(t *testing.T, e *FD, wait waitFunc) {
		var cancels []context.CancelFunc
		for range 10 {
			ctx, cancel := context.WithCancel(context.Background())
			cancels = append(cancels, cancel)
			require.NoError(t, e.Add(1))
			_, err := wait(ctx, time.Time{})
			require.NoError(t, err)
		}
		e.mu.Lock()
		kept := len(e.watches)
		e.mu.Unlock()
		require.LessOrEqual(t, kept, maxIdleWatches)
		cancels[9]() // an ended context's registration goes at the next wait that has one
		live, cancel := context.WithCancel(context.Background())
		defer cancel()
		require.NoError(t, e.Add(1))
		_, err := wait(live, time.Time{})
		require.NoError(t, err)
		e.mu.Lock()
		for _, w := range e.watches {
			require.NoError(t, w.ctx.Err(), "a registration of an ended context stayed")
		}
		e.mu.Unlock()
		require.NoError(t, e.Close())
		e.mu.Lock()
		require.Empty(t, e.watches)
		e.mu.Unlock()
		for _, c := range cancels {
			c()
		}
	})
}

// uncomparable is a context whose type == cannot compare.
type uncomparable struct {
	context.Context
	tags []string
}

// A context of a type that is not comparable still wakes its sleeper,
// and comparing it with the FD's registrations does not panic.
func TestWaitUncomparableContext(t *testing.T) {
	eachWait(t, func(t *testing.T, e *FD, wait waitFunc) {
		base, cancel := context.WithCancel(context.Background())
		ctx := uncomparable{Context: base, tags: []string{"x"}}
		for range 3 {
			require.NoError(t, e.Add(1))
			_, err := wait(ctx, time.Time{})
			require.NoError(t, err)
		}
		go func() { time.Sleep(10 * time.Millisecond); cancel() }()
		_, err := wait(ctx, time.Time{})
		require.ErrorIs(t, err, context.Canceled)
	})
}
