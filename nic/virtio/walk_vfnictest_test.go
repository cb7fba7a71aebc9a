//go:build vfnictest

package virtio

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/cq"
	cqring "github.com/vfnic/vfnic/cq/ring"
	"github.com/vfnic/vfnic/nic"
)

// TestOneDecodePerFrame walks received frames from the used descriptors
// the device wrote to the caller's records, through both APIs: the queue's
// Poll (nic.Completion) and a CQ the queue feeds (cq.Entry). The ring
// reader's decode hook counts how often each ring position is read and
// decoded: once per frame whichever API reads it, so both records are
// built from that one decode. Run with -tags vfnictest (make test does).
func TestOneDecodePerFrame(t *testing.T) {
	forRings(t, func(t *testing.T, packed bool) {
		decodes := map[uint32]int{}
		total := 0
		cqring.SetDecodeHook(func(pos uint32) { decodes[pos]++; total++ })
		t.Cleanup(func() { cqring.SetDecodeHook(nil) })

		r := newRig(t, 8, packed, true, 64<<10)
		rx := r.rxQueue(t, 16, 2048, true)
		ctx := postN(t, rx, 8)

		// The queue API.
		for i := range 3 {
			deliver(t, r.dev, frameFor(i, 64+i), 1)
		}
		var comps [8]nic.Completion
		n := rx.Poll(comps[:])
		require.Equal(t, 3, n)
		require.Equal(t, 3, total, "one decode per frame through Poll")
		for i, c := range comps[:n] {
			require.NoError(t, c.Err)
			require.Equal(t, &ctx[i], c.Context)
			require.Equal(t, frameFor(i, 64+i), c.Data)
			require.NoError(t, rx.Repost(c.Buf, &ctx[i]))
		}
		require.NoError(t, rx.Flush())

		// The CQ API, on the same queue.
		c := bindTest(t, &rx.queue, rx, cq.FormatData)
		for i := 3; i < 6; i++ {
			deliver(t, r.dev, frameFor(i, 64+i), 1)
		}
		total = 0
		ents := make([]cq.Entry, 8)
		n, err := c.Read(ents)
		require.NoError(t, err)
		require.Equal(t, 3, n)
		require.Equal(t, 3, total, "one decode per frame through the CQ")
		for i, e := range ents[:n] {
			f, err := rx.Frame(e.Buf, e.Len)
			require.NoError(t, err)
			require.Equal(t, frameFor(i+3, 67+i), f)
		}
		for pos, k := range decodes {
			require.Equal(t, 1, k, "ring position %d decoded %d times", pos, k)
		}

		// A refused entry: decoded once, and the same code through the
		// CQ as the queue API's error matches.
		tk, ok := r.dev.take()
		require.True(t, ok)
		r.dev.complete(tk.id, 3000, tk.ndesc) // longer than the buffer
		total = 0
		_, err = c.Read(ents)
		require.ErrorIs(t, err, cq.ErrAvail)
		var ee cq.ErrEntry
		require.NoError(t, c.ReadErr(&ee))
		require.Equal(t, cq.ProvBadLen, ee.ProvErrno)
		require.ErrorIs(t, completionError(&cqring.Completion{Prov: ee.ProvErrno, Err: ee.Err}), cq.ProvBadLen)
		require.Equal(t, 1, total, "the refused entry was decoded once")
	})
}
