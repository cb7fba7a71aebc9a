package cq

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// thresholdCQ is a CQ with a threshold wait condition fed by n fake
// sources.
func thresholdCQ(t *testing.T, n int) (*CQ, []*fakeSource) {
	t.Helper()
	c, err := New(Attr{WaitObj: WaitFD, WaitCond: CondThreshold}, Limits{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	srcs := make([]*fakeSource, n)
	for i := range srcs {
		srcs[i] = &fakeSource{c: c}
		require.NoError(t, c.addSource(srcs[i]))
	}
	return c, srcs
}

// A threshold SRead on a CQ with several sources (a device's receive and
// transmit rings, bound to one CQ) wakes once the threshold is reached
// over all of them, although each device ring counts only its own
// entries: with two entries on each of two sources, cond 4 returns the
// four at once, not at its timeout.
func TestSReadThresholdOverSources(t *testing.T) {
	c, srcs := thresholdCQ(t, 2)
	go func() {
		time.Sleep(20 * time.Millisecond)
		srcs[0].produce(2)
		time.Sleep(5 * time.Millisecond)
		srcs[1].produce(2)
	}()
	start := time.Now()
	n, err := c.SRead(context.Background(), make([]Entry, 8), 4, 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, 4, n)
	require.Less(t, time.Since(start), 2*time.Second, "slept through its threshold")
}

// Each of several sources is armed for its share of the entries still
// missing beyond those it holds, so that the one that gets its share
// fires, and no earlier than need be.
func TestArmThresholdShares(t *testing.T) {
	c, srcs := thresholdCQ(t, 3)
	srcs[0].produce(1)
	require.NoError(t, c.arm(8))
	// 7 missing over 3 sources: 3 more each (on top of the one held).
	require.Equal(t, []int{4}, srcs[0].armedWith())
	require.Equal(t, []int{3}, srcs[1].armedWith())
	require.Equal(t, []int{3}, srcs[2].armedWith())
	// Without a threshold, each is armed for its next entry, as before.
	require.NoError(t, c.arm(1))
	require.Equal(t, []int{4, 1}, srcs[0].armedWith())

	// More sources than armLocked keeps counts for: each is armed for its
	// next entry.
	c, srcs = thresholdCQ(t, 10)
	srcs[9].produce(2)
	require.NoError(t, c.arm(8))
	require.Equal(t, []int{1}, srcs[0].armedWith())
	require.Equal(t, []int{3}, srcs[9].armedWith())

	// Entries spread one at a time over the sources: the reader wakes
	// early and counts again, and returns once eight are queued.
	c, srcs = thresholdCQ(t, 3)
	go func() {
		for i := range 8 {
			time.Sleep(2 * time.Millisecond)
			srcs[i%3].produce(1)
		}
	}()
	start := time.Now()
	n, err := c.SRead(context.Background(), make([]Entry, 16), 8, 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, 8, n)
	require.Less(t, time.Since(start), 2*time.Second, "slept through its threshold")
}

// With one source the device counts every entry of the CQ: it is armed
// with the whole threshold, and the reader sleeps until it is reached.
func TestSReadThresholdOneSource(t *testing.T) {
	c, srcs := thresholdCQ(t, 1)
	go func() {
		time.Sleep(10 * time.Millisecond)
		srcs[0].produce(2)
		time.Sleep(30 * time.Millisecond)
		srcs[0].produce(2)
	}()
	start := time.Now()
	n, err := c.SRead(context.Background(), make([]Entry, 8), 4, 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, 4, n)
	require.GreaterOrEqual(t, time.Since(start), 35*time.Millisecond, "returned before its threshold")
	require.Equal(t, []int{4}, srcs[0].armedWith(), "armed once, with the whole threshold")
}
