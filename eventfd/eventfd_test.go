package eventfd

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestAddTake(t *testing.T) {
	e, err := New()
	require.NoError(t, err)
	defer e.Close()
	n, err := e.Take()
	require.NoError(t, err)
	require.Zero(t, n)
	require.NoError(t, e.Add(2))
	require.NoError(t, e.Add(3))
	n, err = e.Take()
	require.NoError(t, err)
	require.EqualValues(t, 5, n, "the counter merges events")
}

func TestWaitWakes(t *testing.T) {
	e, err := New()
	require.NoError(t, err)
	defer e.Close()
	go func() {
		time.Sleep(10 * time.Millisecond)
		_ = e.Add(1)
	}()
	n, err := e.Wait(context.Background(), time.Time{})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
}

func TestWaitTimeoutAndCancel(t *testing.T) {
	e, err := New()
	require.NoError(t, err)
	defer e.Close()
	_, err = e.Wait(context.Background(), time.Now().Add(20*time.Millisecond))
	require.ErrorIs(t, err, ErrTimeout)

	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(10 * time.Millisecond); cancel() }()
	_, err = e.Wait(ctx, time.Time{})
	require.ErrorIs(t, err, context.Canceled)

	// After a cancellation the FD still works.
	require.NoError(t, e.Add(1))
	n, err := e.Wait(context.Background(), time.Now().Add(time.Second))
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
}

func TestCloseWakesWaiter(t *testing.T) {
	e, err := New()
	require.NoError(t, err)
	done := make(chan error)
	go func() {
		_, err := e.Wait(context.Background(), time.Time{})
		done <- err
	}()
	time.Sleep(10 * time.Millisecond)
	require.NoError(t, e.Close())
	require.True(t, errors.Is(<-done, ErrClosed))
	require.NoError(t, e.Close(), "Close is idempotent")
	require.ErrorIs(t, e.Add(1), ErrClosed)
	require.Equal(t, -1, e.Fd())
}
