package eventfd

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

type waitResult struct {
	n   uint64
	err error
}

// pollerWait starts a wait on the runtime poller and returns its result
// channel.
func pollerWait(e *FD, ctx context.Context, deadline time.Time) <-chan waitResult {
	r := make(chan waitResult, 1)
	go func() {
		n, err := e.waitPoller(ctx, deadline, nil)
		r <- waitResult{n, err}
	}()
	return r
}

// result waits up to 2 s for a wait to return.
func result[T any](t *testing.T, r <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-r:
		return v
	case <-time.After(2 * time.Second):
		t.Fatalf("%s: still waiting after 2s", what)
	}
	var zero T
	return zero
}

// still checks that a wait has not returned.
func still(t *testing.T, r <-chan waitResult, what string) {
	t.Helper()
	select {
	case v := <-r:
		t.Fatalf("%s returned early: %d %v", what, v.n, v.err)
	default:
	}
}

// A second sleeper on the poller, with a deadline, times out at its
// deadline while a first one without a deadline sleeps on; the first
// then takes the next event.
func TestPollerSecondWaiterDeadline(t *testing.T) {
	e, err := New()
	require.NoError(t, err)
	defer e.Close()
	a := pollerWait(e, context.Background(), time.Time{})
	time.Sleep(20 * time.Millisecond)
	start := time.Now()
	deadline := start.Add(50 * time.Millisecond)
	b := result(t, pollerWait(e, context.Background(), deadline), "the second sleeper, with a 50ms deadline")
	require.ErrorIs(t, b.err, ErrTimeout)
	require.False(t, time.Now().Before(deadline), "returned before its deadline")
	still(t, a, "the first sleeper, without a deadline")
	require.NoError(t, e.Add(2))
	require.Equal(t, waitResult{2, nil}, result(t, a, "the first sleeper"))
}

// A second sleeper on the poller returns when its context is cancelled,
// while a first one sleeps on until its event.
func TestPollerSecondWaiterCancel(t *testing.T) {
	e, err := New()
	require.NoError(t, err)
	defer e.Close()
	a := pollerWait(e, context.Background(), time.Time{})
	time.Sleep(20 * time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	br := pollerWait(e, ctx, time.Time{})
	time.Sleep(20 * time.Millisecond)
	cancel()
	b := result(t, br, "the second sleeper, cancelled")
	require.ErrorIs(t, b.err, context.Canceled)
	still(t, a, "the first sleeper")
	require.NoError(t, e.Add(1))
	require.Equal(t, waitResult{1, nil}, result(t, a, "the first sleeper"))
}

// A second sleeper on the poller without a deadline does not clear the
// deadline of the first; it takes the next event.
func TestPollerSecondWaiterKeepsFirstDeadline(t *testing.T) {
	e, err := New()
	require.NoError(t, err)
	defer e.Close()
	start := time.Now()
	deadline := start.Add(50 * time.Millisecond)
	a := pollerWait(e, context.Background(), deadline)
	time.Sleep(10 * time.Millisecond)
	b := pollerWait(e, context.Background(), time.Time{})
	ar := result(t, a, "the first sleeper, with a 50ms deadline")
	require.ErrorIs(t, ar.err, ErrTimeout)
	require.False(t, time.Now().Before(deadline), "returned before its deadline")
	time.Sleep(10 * time.Millisecond)
	still(t, b, "the second sleeper, without a deadline")
	require.NoError(t, e.Add(3))
	require.Equal(t, waitResult{3, nil}, result(t, b, "the second sleeper"))
}

// Close wakes the sleeper on the poller and those waiting their turn.
func TestPollerCloseWakesEverySleeper(t *testing.T) {
	e, err := New()
	require.NoError(t, err)
	var rs []<-chan waitResult
	for range 3 {
		rs = append(rs, pollerWait(e, context.Background(), time.Time{}))
	}
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, e.Close())
	for i, r := range rs {
		require.ErrorIs(t, result(t, r, "a sleeper at Close").err, ErrClosed, "sleeper %d", i)
	}
}

// A wait on the poller with no other sleeper allocates nothing, with or
// without a deadline and a context (once registered): taking the turn
// is one channel send.
func TestPollerWaitNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes the read buffer escape")
	}
	e, err := New()
	require.NoError(t, err)
	defer e.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, c := range []context.Context{context.Background(), ctx} {
		for _, timeout := range []time.Duration{0, time.Minute} {
			wait := func() {
				var deadline time.Time
				if timeout > 0 {
					deadline = time.Now().Add(timeout)
				}
				_ = e.Add(1)
				if n, err := e.waitPoller(c, deadline, nil); n != 1 || err != nil {
					t.Errorf("wait: %d %v", n, err)
				}
			}
			wait() // registers ctx
			require.Zero(t, testing.AllocsPerRun(100, wait), "context %v, timeout %v", c, timeout)
		}
	}
}
