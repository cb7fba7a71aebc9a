package leakcheck

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/eventfd"
	"github.com/vfnic/vfnic/hugepage"
)

func TestCountsFDsAndDMAMemory(t *testing.T) {
	before, err := Snapshot()
	require.NoError(t, err)
	e, err := eventfd.New()
	require.NoError(t, err)
	during, err := Snapshot()
	require.NoError(t, err)
	require.Equal(t, before.FDs+1, during.FDs, "an open eventfd counts")
	require.NoError(t, e.Close())
	after, err := Snapshot()
	require.NoError(t, err)
	require.Equal(t, before, after)

	if free, err := hugepage.Free(hugepage.Size2M); err == nil && free > 0 {
		m, err := hugepage.Alloc(2<<20, hugepage.Options{})
		require.NoError(t, err)
		with, err := Snapshot()
		require.NoError(t, err)
		require.Equal(t, before.Maps+1, with.Maps, "a hugepage mapping counts")
		require.NoError(t, m.Close())
	}
}
