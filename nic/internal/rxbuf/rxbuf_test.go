package rxbuf

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vfnic/vfnic/dma"
	"github.com/vfnic/vfnic/hugepage"
	"github.com/vfnic/vfnic/nic"
)

func newPool(t *testing.T, headroom int) Pool {
	t.Helper()
	space := dma.NewIdentitySpace()
	t.Cleanup(func() { _ = space.Close() })
	region, err := space.Alloc(4*2048, hugepage.Options{PageSize: hugepage.Size4K})
	require.NoError(t, err)
	p, err := dma.NewPool(region, 4, 2048)
	require.NoError(t, err)
	return New(p, headroom)
}

// TestLifecycle walks a buffer through free, posted, lent and back, with
// the frame headroom bytes in, and checks every address handed back.
func TestLifecycle(t *testing.T) {
	for _, headroom := range []int{0, 12} {
		p := newPool(t, headroom)
		b, ok := p.Get()
		require.True(t, ok, "taken off the free list: posted")
		frame := p.Start(b) + uintptr(headroom)
		require.Equal(t, b, p.Of(frame), "an address inside the buffer")
		_, err := p.Lent(frame)
		require.ErrorIs(t, err, ErrNotLent, "posted, not lent")
		posted, lent := p.Counts()
		require.Equal(t, [2]int{1, 0}, [2]int{posted, lent})

		p.Lend(b)
		got, err := p.Lent(frame)
		require.NoError(t, err)
		require.Equal(t, b, got)
		for _, bad := range []uintptr{frame + 1, frame - 1, p.Start(0) + uintptr(headroom) - 1, p.Start(4) + uintptr(headroom), 0,
			p.Start(1) + uintptr(headroom) + 1024, p.Start(3) + 2047, ^uintptr(0)} {
			_, err := p.Lent(bad)
			require.ErrorIs(t, err, ErrNotBuffer, "address %#x", bad)
			require.ErrorIs(t, err, nic.ErrBadBuffer)
		}
		data, err := p.Frame(frame, 64, 2048-headroom)
		require.NoError(t, err)
		require.Len(t, data, 64)
		require.Equal(t, &p.Buf(b)[headroom], &data[0], "the frame starts headroom bytes in")
		require.Equal(t, data, p.Bytes(frame, 64), "the ring reader's view of the same frame")
		for _, n := range []int{-1, 2048 - headroom + 1} {
			_, err := p.Frame(frame, n, 2048-headroom)
			require.ErrorIs(t, err, nic.ErrInvalid, "length %d", n)
		}
		posted, lent = p.Counts()
		require.Equal(t, [2]int{0, 1}, [2]int{posted, lent})

		require.NoError(t, p.Release(frame))
		require.ErrorIs(t, p.Release(frame), ErrNotLent, "released twice")
		require.Equal(t, 4, p.Free(), "back on the free list")
		posted, lent = p.Counts()
		require.Equal(t, [2]int{0, 0}, [2]int{posted, lent})
	}
}

// TestRecycle: a buffer the device held goes back to the free list once;
// a lent one stays lent until released.
func TestRecycle(t *testing.T) {
	p := newPool(t, 0)
	var bs [3]uint32
	for i := range bs {
		b, ok := p.Get()
		require.True(t, ok)
		bs[i] = b
	}
	p.Lend(bs[1])
	p.Recycle(bs[0])
	p.Recycle(bs[2])
	posted, lent := p.Counts()
	require.Equal(t, [2]int{0, 1}, [2]int{posted, lent})
	require.Equal(t, 3, p.Free(), "the never-used one and the two posted")
	require.NoError(t, p.Release(p.Start(bs[1])))
	require.Equal(t, 4, p.Free())
}

// TestOfAndBytes: Of finds the buffer of every address inside it by a
// multiplication, for power-of-two strides and others (1536, 9024 bytes),
// and Bytes is the frame's view up to the buffer's end, as the buffer's
// own slice gives it.
func TestOfAndBytes(t *testing.T) {
	for _, stride := range []int{128, 1536, 2048, 9024} {
		const n = 37
		space := dma.NewIdentitySpace()
		t.Cleanup(func() { _ = space.Close() })
		region, err := space.Alloc(n*stride, hugepage.Options{PageSize: hugepage.Size4K})
		require.NoError(t, err)
		dp, err := dma.NewPool(region, n, stride)
		require.NoError(t, err)
		p := New(dp, 12)
		require.Equal(t, stride, dp.BufSize())
		require.NotZero(t, p.recip, "stride %d: multiplied, not divided", stride)
		for b := uint32(0); b < n; b++ {
			for _, k := range []int{0, 1, 12, stride / 2, stride - 1} {
				require.Equal(t, b, p.Of(p.Start(b)+uintptr(k)), "stride %d, buffer %d, byte %d", stride, b, k)
			}
			got, want := p.Bytes(p.Start(b)+12, 60), p.Buf(b)[12:72]
			require.Equal(t, &want[0], &got[0], "stride %d, buffer %d", stride, b)
			require.Equal(t, [2]int{len(want), cap(want)}, [2]int{len(got), cap(got)})
		}
	}
}
