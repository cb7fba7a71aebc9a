package hugepage

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestFallback4K(t *testing.T) {
	m, err := Alloc(10000, Options{PageSize: Size4K})
	require.NoError(t, err)
	require.Equal(t, 12288, m.Len())
	require.Equal(t, Size4K, m.PageSize())
	require.Zero(t, m.Addr()%4096)
	b := m.Bytes()
	b[0], b[len(b)-1] = 1, 2
	require.NoError(t, m.Close())
	require.NoError(t, m.Close(), "Close is idempotent")
	require.Nil(t, m.Bytes())
	require.Zero(t, m.Addr())
}

func TestBadSizes(t *testing.T) {
	_, err := Alloc(0, Options{})
	require.ErrorIs(t, err, ErrBadSize)
	_, err = Alloc(4096, Options{PageSize: 12345})
	require.ErrorIs(t, err, ErrBadSize)
}

func TestHugepages2M(t *testing.T) {
	free, err := Free(Size2M)
	if err != nil || free < 2 {
		// The host has none reserved; the VM tests reserve and cover them.
		m, err := Alloc(4<<20, Options{})
		require.ErrorIs(t, err, ErrNoHugepages)
		require.Nil(t, m)
		m, err = Alloc(4<<20, Options{AllowFallback: true})
		require.NoError(t, err)
		require.Equal(t, Size4K, m.PageSize())
		require.NoError(t, m.Close())
		return
	}
	m, err := Alloc(3<<20, Options{})
	require.NoError(t, err)
	require.Equal(t, Size2M, m.PageSize())
	require.Equal(t, 4<<20, m.Len())
	require.Zero(t, m.Addr()%uintptr(Size2M))
	require.NoError(t, m.Close())
}
