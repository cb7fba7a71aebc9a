package nic

import (
	"context"
	"errors"
	"fmt"
	"github.com/vfnic/vfnic/cq"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/pci"
)

func TestRegister(t *testing.T) {
	open := func(context.Context, pci.Device, Config) (Device, error) { return nil, errors.New("test driver") }
	match := func(d pci.Device) bool { return d.VendorID == 0xabcd }
	require.ErrorIs(t, Register(Driver{Name: "", Match: match, Open: open}), ErrInvalid)
	require.ErrorIs(t, Register(Driver{Name: "x", Open: open}), ErrInvalid)
	require.ErrorIs(t, Register(Driver{Name: "x", Match: match}), ErrInvalid)
	require.NoError(t, Register(Driver{Name: "nic-test", Match: match, Open: open}))
	require.ErrorIs(t, Register(Driver{Name: "nic-test", Match: match, Open: open}), ErrInvalid, "names are unique")
	openName := func(context.Context, string, Config) (Device, error) { return nil, ErrNotSupported }
	for _, bad := range []string{"", "abcd", "0000", "Xyz", "x-y", "9x"} {
		require.ErrorIs(t, Register(Driver{Name: "named-" + bad, Scheme: bad, OpenName: openName}), ErrInvalid, "scheme %q", bad)
	}
	require.ErrorIs(t, Register(Driver{Name: "named-x", Scheme: "testnic"}), ErrInvalid, "no OpenName")
	require.ErrorIs(t, Register(Driver{Name: "named-both", Scheme: "testnic", OpenName: openName, Match: match, Open: open}), ErrInvalid)
	require.NoError(t, Register(Driver{Name: "named", Scheme: "testnic", OpenName: func(_ context.Context, name string, _ Config) (Device, error) {
		return nil, fmt.Errorf("opened %q", name)
	}}))
	require.ErrorIs(t, Register(Driver{Name: "named2", Scheme: "testnic", OpenName: openName}), ErrInvalid, "schemes are unique")
	require.Contains(t, Schemes(), "testnic")
	_, err := Open(context.Background(), "testnic:eth1@2", Config{})
	require.EqualError(t, err, `opened "eth1@2"`)
	_, err = Open(context.Background(), "nosuch:eth1", Config{})
	require.ErrorIs(t, err, ErrNoDriver)
	_, ok0 := Lookup(pci.Device{VendorID: 0xabcd})
	require.True(t, ok0, "named drivers do not hide PCI ones")
	require.Contains(t, Drivers(), "nic-test")
	d, ok := Lookup(pci.Device{VendorID: 0xabcd})
	require.True(t, ok)
	require.Equal(t, "nic-test", d.Name)
	_, ok = Lookup(pci.Device{VendorID: 0x1234})
	require.False(t, ok)
}

func TestOpenBadAddress(t *testing.T) {
	_, err := Open(context.Background(), "not-an-address", Config{})
	require.ErrorIs(t, err, pci.ErrBadAddress)
}

// fakeQueue is a Waitable whose completions arrive on a schedule.
type fakeQueue struct {
	ready    []Completion // delivered by the next Poll
	arrivals []arrival    // delivered when an interrupt is waited for
	arms     []int
	waits    int
	armErr   error
}

type arrival struct {
	after time.Duration
	comps []Completion
}

func (q *fakeQueue) Poll(out []Completion) int {
	n := copy(out, q.ready)
	q.ready = q.ready[n:]
	return n
}

func (q *fakeQueue) Arm(threshold int) error {
	q.arms = append(q.arms, threshold)
	return q.armErr
}

func (q *fakeQueue) WaitInterrupt(ctx context.Context, deadline time.Time) error {
	q.waits++
	if len(q.arrivals) == 0 {
		if deadline.IsZero() {
			<-ctx.Done()
			return ctx.Err()
		}
		select {
		case <-time.After(time.Until(deadline)):
			return ErrTimeout
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	a := q.arrivals[0]
	q.arrivals = q.arrivals[1:]
	time.Sleep(a.after)
	q.ready = append(q.ready, a.comps...)
	return nil
}

func comps(n int) []Completion {
	c := make([]Completion, n)
	for i := range c {
		c[i].Len = 60 + i
	}
	return c
}

func TestSRead(t *testing.T) {
	ctx := context.Background()
	out := make([]Completion, 8)

	t.Run("ready", func(t *testing.T) {
		q := &fakeQueue{ready: comps(3)}
		n, err := SRead(ctx, q, out, 1, time.Second)
		require.NoError(t, err)
		require.Equal(t, 3, n)
		require.Empty(t, q.arms, "no arm when completions are waiting")
	})
	t.Run("timeout", func(t *testing.T) {
		q := &fakeQueue{}
		start := time.Now()
		n, err := SRead(ctx, q, out, 1, 30*time.Millisecond)
		require.ErrorIs(t, err, ErrTimeout)
		require.Zero(t, n)
		require.GreaterOrEqual(t, time.Since(start), 30*time.Millisecond)
		require.Equal(t, []int{1}, q.arms)
	})
	t.Run("try-once", func(t *testing.T) {
		q := &fakeQueue{}
		_, err := SRead(ctx, q, out, 1, 0)
		require.ErrorIs(t, err, ErrTimeout)
		require.ErrorIs(t, err, os.ErrDeadlineExceeded)
		require.Empty(t, q.arms, "a zero timeout polls once and never sleeps")
		_, err = SRead(nil, q, out, 1, 0) //nolint:staticcheck // a nil context is what is tested
		require.ErrorIs(t, err, ErrInvalid)
	})
	t.Run("nil-queue", func(t *testing.T) {
		// A nil queue is refused like a nil context, also with nothing to
		// read into: a caller's bug is reported, not hidden by a panic or
		// by an empty out.
		for _, o := range [][]Completion{out, nil} {
			n, err := SRead(ctx, nil, o, 1, time.Millisecond)
			require.ErrorIs(t, err, ErrInvalid)
			require.ErrorContains(t, err, "nil queue")
			require.Zero(t, n)
		}
	})
	t.Run("threshold-accumulates", func(t *testing.T) {
		q := &fakeQueue{ready: comps(1), arrivals: []arrival{{time.Millisecond, comps(2)}, {time.Millisecond, comps(3)}}}
		n, err := SRead(ctx, q, out, 5, time.Second)
		require.NoError(t, err)
		require.Equal(t, 6, n)
		require.Equal(t, []int{4, 2}, q.arms, "each arm asks for what is still missing")
	})
	t.Run("threshold-capped", func(t *testing.T) {
		q := &fakeQueue{arrivals: []arrival{{0, comps(2)}}}
		n, err := SRead(ctx, q, out[:2], 10, time.Second)
		require.NoError(t, err)
		require.Equal(t, 2, n)
		require.Equal(t, []int{2}, q.arms)
	})
	t.Run("timeout-returns-what-came", func(t *testing.T) {
		q := &fakeQueue{arrivals: []arrival{{0, comps(1)}}}
		n, err := SRead(ctx, q, out, 4, 30*time.Millisecond)
		require.NoError(t, err)
		require.Equal(t, 1, n)
	})
	t.Run("error-completion-ends", func(t *testing.T) {
		bad := comps(2)
		bad[1].Err = cq.ProvBadID
		q := &fakeQueue{ready: bad}
		n, err := SRead(ctx, q, out, 5, time.Second)
		require.NoError(t, err)
		require.Equal(t, 2, n)
		require.ErrorIs(t, out[1].Err, cq.ProvBadID)
	})
	t.Run("cancel", func(t *testing.T) {
		q := &fakeQueue{}
		cctx, cancel := context.WithCancel(ctx)
		go func() { time.Sleep(10 * time.Millisecond); cancel() }()
		_, err := SRead(cctx, q, out, 1, -1)
		require.ErrorIs(t, err, context.Canceled)
	})
	t.Run("arm-error", func(t *testing.T) {
		q := &fakeQueue{armErr: ErrBroken}
		_, err := SRead(ctx, q, out, 1, time.Second)
		require.ErrorIs(t, err, ErrBroken)
	})
	t.Run("empty-out", func(t *testing.T) {
		n, err := SRead(ctx, &fakeQueue{ready: comps(1)}, nil, 1, time.Second)
		require.NoError(t, err)
		require.Zero(t, n)
	})
}

func TestQueueStatsAdd(t *testing.T) {
	var s QueueStats
	s.Add(QueueStats{Packets: 1, Bytes: 2, Errors: 3, Notifies: 4, Suppressed: 5, Interrupts: 6})
	s.Add(QueueStats{Packets: 1, Bytes: 2, Errors: 3, Notifies: 4, Suppressed: 5, Interrupts: 6})
	require.Equal(t, QueueStats{2, 4, 6, 8, 10, 12}, s)
	require.Equal(t, "{Packets:2 Bytes:4 Errors:6 Notifies:8 Suppressed:10 Interrupts:12}", fmt.Sprintf("%+v", s))
}
