package dma

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPoolOverOrder: a pool over caller memory hands buffers out in index
// order, then in the order they came back, allocating nothing.
func TestPoolOverOrder(t *testing.T) {
	mem := make([]byte, 4*128)
	p, err := NewPoolOver(mem, 4, 128)
	require.NoError(t, err)
	var got []uint32
	for range 4 {
		b, ok := p.Get()
		require.True(t, ok)
		got = append(got, b)
	}
	require.Equal(t, []uint32{0, 1, 2, 3}, got)
	_, ok := p.Get()
	require.False(t, ok)
	require.Equal(t, &mem[256], &p.Buf(2)[0])
	allocs := testing.AllocsPerRun(10, func() {
		for _, b := range []uint32{2, 0, 3, 1} {
			require.NoError(t, p.Put(b))
		}
		got = got[:0]
		for p.Free() > 0 {
			b, _ := p.Get()
			got = append(got, b)
		}
	})
	require.Zero(t, allocs)
	require.Equal(t, []uint32{2, 0, 3, 1}, got)
	_, err = NewPoolOver(mem, 4, 100)
	require.ErrorIs(t, err, ErrBadRange, "not a multiple of 64")
	_, err = NewPoolOver(mem, 5, 128)
	require.ErrorIs(t, err, ErrBadRange, "more than mem holds")
}
