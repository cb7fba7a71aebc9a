package queue

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vfnic/vfnic/cq"
	cqring "github.com/vfnic/vfnic/cq/ring"
	"github.com/vfnic/vfnic/eventfd"
	"github.com/vfnic/vfnic/nic"
)

// fakeRing hands out prepared completions, as many as asked, as a
// driver's batch read with errors in the middle of a batch would.
type fakeRing struct {
	tab     *cqring.Table
	ready   []cqring.Completion
	posted  int
	disarms int
	publish int
	armed   []int // the thresholds Arm was asked for
}

func (r *fakeRing) Read(cs []cqring.Completion) int {
	k := copy(cs, r.ready)
	r.ready = r.ready[k:]
	for _, c := range cs[:k] {
		if c.Done {
			r.posted--
		}
	}
	return k
}
func (r *fakeRing) Publish()                                     { r.publish++ }
func (r *fakeRing) Pending(max int) int                          { return min(len(r.ready), max) }
func (r *fakeRing) Outstanding() int                             { return r.posted }
func (r *fakeRing) Broken() bool                                 { return false }
func (r *fakeRing) Notify() (bool, bool)                         { return true, false }
func (r *fakeRing) Arm(t int) (bool, bool)                       { r.armed = append(r.armed, t); return false, true }
func (r *fakeRing) Disarm()                                      { r.disarms++ }
func (r *fakeRing) Err(c *cqring.Completion) error               { return c.Prov.Refusal() }
func (r *fakeRing) StrError(cq.ProvErrno, []byte) (string, bool) { return "", false }
func (r *fakeRing) Table() *cqring.Table                         { return r.tab }

// newFakeQueue is a queue of 8 slots over a fakeRing whose table is
// single-threaded.
func newFakeQueue(t *testing.T, name string) (*Queue, *fakeRing) {
	t.Helper()
	tab, err := cqring.NewSingleThreadedTable(8, 3)
	require.NoError(t, err)
	q := &Queue{Core: Core[Source]{Name: name, Vector: -1}}
	r := &fakeRing{tab: tab}
	q.Init(r, 8, nil)
	return q, r
}

// done is the completion of the seq-th operation posted, carrying ctx.
func done(ctx any, seq uint64) cqring.Completion {
	return cqring.Completion{Context: ctx, Len: 64, Done: true, Word: seq << 16}
}

// bad is done refused for a bad length.
func bad(ctx any, seq uint64) cqring.Completion {
	c := done(ctx, seq)
	c.Err, c.Prov = cq.EIO, cq.ProvBadLen
	return c
}

// TestHeldAfterAnError: completions a driver's batch read took past an
// error completion are handed out by the next Polls, in order, count as
// outstanding until then, and are canceled in posting order with those
// still posted when the device is taken back.
func TestHeldAfterAnError(t *testing.T) {
	q, r := newFakeQueue(t, "tx0")
	tab := r.tab
	// Posted a-h; the device completed a-e (b and d refused), which the
	// driver's read took from the table; f-h stay posted.
	for i := range 8 {
		w := q.Word(0)
		if i >= 5 {
			_, err := tab.Post(cqring.Op{Context: string(rune('a' + i)), Len: 64, Word: w})
			require.NoError(t, err)
		}
	}
	r.posted = 8
	r.ready = []cqring.Completion{done("a", 0), bad("b", 1), done("c", 2), bad("d", 3), done("e", 4)}
	out := make([]nic.Completion, 8)
	require.Equal(t, 2, q.Poll(out), "up to and including the error")
	require.Equal(t, "a", out[0].Context)
	require.ErrorIs(t, out[1].Err, cq.ProvBadLen)
	require.Equal(t, 3, q.Ready(8), "c, d and e are held")
	require.Equal(t, 6, q.Outstanding(), "c-e held, f-h on the device")
	require.Equal(t, 2, q.Poll(out))
	require.Equal(t, "c", out[0].Context)
	require.NoError(t, out[0].Err)
	require.Equal(t, "d", out[1].Context)
	require.Error(t, out[1].Err)
	require.Equal(t, 1, q.Ready(8), "e is held")

	// Held at close: read, never handed out, canceled with those posted.
	q.CloseQueue(nic.ErrRemovedClosed)
	var got []any
	for q.Poll(out) == 1 {
		require.ErrorIs(t, out[0].Err, nic.ErrCanceled)
		got = append(got, out[0].Context)
	}
	require.Equal(t, []any{"e", "f", "g", "h"}, got, "in posting order")
}

// TestArmCountsHeld: the ring is armed for what the threshold still needs
// beyond the completions the core already took from it (held after an
// error completion), since the ring counts from its own head; at least
// one, and threshold 0 unchanged.
func TestArmCountsHeld(t *testing.T) {
	q, r := newFakeQueue(t, "rx0")
	efd, err := eventfd.New()
	require.NoError(t, err)
	defer efd.Close()
	q.EFD = efd
	r.posted = 8
	r.ready = []cqring.Completion{done(0, 0), bad(1, 1), done(2, 2), done(3, 3), done(4, 4)}
	out := make([]nic.Completion, 8)
	require.Equal(t, 2, q.Poll(out), "up to and including the error")
	require.Equal(t, 3, q.Ready(8), "three held")
	for _, c := range []struct{ threshold, ring int }{{8, 5}, {4, 1}, {3, 1}, {1, 1}, {0, 0}} {
		r.armed = r.armed[:0]
		require.NoError(t, q.Arm(c.threshold))
		require.Equal(t, []int{c.ring}, r.armed, "threshold %d with 3 held", c.threshold)
	}
}
