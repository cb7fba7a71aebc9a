package qpsim

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vfnic/vfnic/cq"
)

// ResizeCQ moves the unconsumed entries in order, keeps an entry written
// with a wrong phase wrong, and refuses a size below what the CQ holds.
func TestResizeCQ(t *testing.T) {
	d := newDev(t)
	c, err := d.OpenCQ(cq.Attr{Size: 8})
	require.NoError(t, err)
	q, err := d.NewQP(QPConfig{SendCQ: c, RecvCQ: c})
	require.NoError(t, err)
	defer q.Close()
	send := func(id int) {
		require.NoError(t, q.Send(999, id, []byte("x"), SendOpts{}))
		require.NoError(t, q.Flush(context.Background()))
	}
	send(0)
	require.Len(t, readN(t, c, 1), 1) // the reader is not at position 0
	for i := 1; i <= 5; i++ {
		if i == 3 {
			require.NoError(t, d.Inject(c, Fault{Kind: FaultWrongPhase}))
		}
		send(i)
	}
	require.NoError(t, d.Sync(context.Background()))
	_, err = d.ResizeCQ(c, 4, 0) // 6 entries held, the hole among them
	require.ErrorIs(t, err, cq.ErrInvalid)
	_, err = d.ResizeCQ(c, 8, 3) // and 3 more the caller keeps
	require.ErrorIs(t, err, cq.ErrInvalid)
	n, err := d.ResizeCQ(c, 9, 0)
	require.NoError(t, err)
	require.Equal(t, 16, n)
	ids := func(es []cq.Entry) (out []int) {
		for _, e := range es {
			out = append(out, e.Context.(int))
		}
		return out
	}
	ents := make([]cq.Entry, 8)
	k, err := c.Read(ents)
	require.NoError(t, err)
	require.Equal(t, []int{1, 2}, ids(ents[:k]))
	_, err = c.Read(ents)
	require.ErrorIs(t, err, cq.ErrAvail)
	var ee cq.ErrEntry
	require.NoError(t, c.ReadErr(&ee))
	require.Equal(t, cq.ProvBadPhase, ee.ProvErrno)
	require.Equal(t, []int{3, 4, 5}, ids(readN(t, c, 3)))
	// The new ring, written by the device over several laps.
	for i := 10; i < 50; i++ {
		send(i)
		require.Equal(t, []int{i}, ids(readN(t, c, 1)))
	}
	n, err = d.ResizeCQ(c, 2, 0)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	for i := 50; i < 60; i++ {
		send(i)
		require.Equal(t, []int{i}, ids(readN(t, c, 1)))
	}
}

// FlushOnClose completes the posted receives with WR_FLUSH_ERR.
func TestFlushOnClose(t *testing.T) {
	d := newDev(t)
	c, err := d.OpenCQ(cq.Attr{Size: 8})
	require.NoError(t, err)
	q, err := d.NewQP(QPConfig{SendCQ: c, RecvCQ: c, FlushOnClose: true})
	require.NoError(t, err)
	mem, err := d.Alloc(4096)
	require.NoError(t, err)
	require.NoError(t, q.PostRecv("a", mem.Bytes()[:128], RecvOpts{}))
	require.NoError(t, q.PostRecv("b", mem.Bytes()[128:256], RecvOpts{}))
	require.NoError(t, q.Close())
	for _, want := range []string{"a", "b"} {
		_, err := c.Read(make([]cq.Entry, 1))
		require.ErrorIs(t, err, cq.ErrAvail)
		var ee cq.ErrEntry
		require.NoError(t, c.ReadErr(&ee))
		require.Equal(t, want, ee.Context)
		require.Equal(t, cq.ECANCELED, ee.Err)
		require.Equal(t, cq.ProvErrno(StatusWRFlushErr), ee.ProvErrno)
		require.Equal(t, cq.FlagRecv|cq.FlagMsg, ee.Flags)
	}
	_, err = c.Read(make([]cq.Entry, 1))
	require.ErrorIs(t, err, cq.ErrAgain)
}
