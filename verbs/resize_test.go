package verbs_test

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/cq/qpsim"
	"github.com/vfnic/vfnic/verbs"
)

// rdma-core test_cq.py: resize 3 to 1 to 7; shrinking below the held
// entries fails and loses nothing.
func TestResize(t *testing.T) {
	e := newEnv(t)
	c := e.cq(verbs.CQInitAttr{CQE: 3})
	a := e.qp(c, false)
	defer func() { _ = a.Close(); _ = c.Close() }()
	require.GreaterOrEqual(t, c.CQE(), 3)
	require.NoError(t, c.Resize(1))
	require.GreaterOrEqual(t, c.CQE(), 1)
	require.NoError(t, c.Resize(7))
	require.GreaterOrEqual(t, c.CQE(), 7)
	require.ErrorIs(t, c.Resize(0), os.ErrInvalid)
	require.ErrorIs(t, c.Resize(verbs.QueryDevice(e.p).MaxCQE+1), os.ErrInvalid)

	for i := range 5 {
		e.send(a, nowhere(a), uint64(i), 10, qpsim.SendOpts{})
	}
	size := c.CQE()
	err := c.Resize(4)
	require.ErrorIs(t, err, os.ErrInvalid)
	require.Equal(t, size, c.CQE())
	// One taken into the iterator's buffer still counts as held.
	require.NoError(t, c.StartPoll())
	require.Equal(t, uint64(0), c.WRID())
	c.EndPoll()
	require.ErrorIs(t, c.Resize(2), os.ErrInvalid)
	require.NoError(t, c.Resize(4)) // 4 held: 3 in the ring, 1 buffered
	require.Equal(t, 4, c.CQE())
	wcs := drain(t, c)
	require.Len(t, wcs, 4)
	for i, w := range wcs {
		require.Equal(t, uint64(i+1), w.WRID)
	}
	// The new ring keeps going, over several laps.
	for i := range 10 {
		e.send(a, nowhere(a), uint64(100+i), 10, qpsim.SendOpts{})
		wcs := drain(t, c)
		require.Len(t, wcs, 1)
		require.Equal(t, uint64(100+i), wcs[0].WRID)
	}
}

// Resizing while the device writes: every completion is read once, in
// order, across resizes up and down.
func TestResizeWhileWriting(t *testing.T) {
	e := newEnv(t)
	c := e.cq(verbs.CQInitAttr{CQE: 512})
	a := e.qp(c, false) // 256 sends outstanding at most: the CQ never overruns
	defer func() { _ = a.Close(); _ = c.Close() }()
	const total = 20000
	payload := make([]byte, 16)
	errc := make(chan error, 1)
	go func() {
		for i := uint64(0); i < total; {
			err := a.Send(a.Addr(), i, payload, qpsim.SendOpts{})
			switch {
			case err == nil:
				i++
			case errors.Is(err, qpsim.ErrQueueFull):
			default:
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	sizes := []int{256, 4096, 512, 1024, 256}
	next, resizes, refused := uint64(0), 0, 0
	wcs := make([]verbs.WC, 32)
	for k := 0; next < total; k++ {
		n, err := c.Poll(wcs)
		require.NoError(t, err)
		for _, w := range wcs[:n] {
			require.Equal(t, verbs.WCSuccess, w.Status)
			require.Equal(t, next, w.WRID, "in order, none lost, none twice")
			next++
		}
		if k%7 == 0 {
			switch err := c.Resize(sizes[k%len(sizes)]); {
			case err == nil:
				resizes++
			case errors.Is(err, os.ErrInvalid):
				refused++ // held more than the size: nothing changed
			default:
				require.NoError(t, err)
			}
		}
	}
	require.NoError(t, <-errc)
	require.NoError(t, a.Flush(context.Background()))
	n, err := c.Poll(wcs)
	require.NoError(t, err)
	require.Zero(t, n)
	t.Logf("%d completions, %d resizes, %d refused", total, resizes, refused)
	require.Positive(t, resizes)
}
