package ring

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/cq"
)

// TestPostSlot: a table posted by slot completes the id the device names
// (the slot), refuses a slot posted twice, out of range or in a table
// whose ids carry a generation, and counts outstanding posts as Post does.
func TestPostSlot(t *testing.T) {
	u := newUsedRing(t, 8)
	tab := u.tab // 8 slots, 3-bit ids: no generation
	id, err := tab.PostSlot(5, Op{Context: "five", Buf: 0x5000, Len: 100, Flags: cq.FlagRecv | cq.FlagMsg})
	require.NoError(t, err)
	require.EqualValues(t, 5, id)
	_, err = tab.PostSlot(5, Op{Len: 100})
	require.ErrorIs(t, err, cq.ErrInvalid, "slot 5 is outstanding")
	_, err = tab.PostSlot(8, Op{Len: 100})
	require.ErrorIs(t, err, cq.ErrInvalid, "slot 8 of 8")
	_, err = tab.PostSlot(2, Op{Len: 100, Flags: cq.FlagRecv | cq.FlagMultiRecv})
	require.ErrorIs(t, err, cq.ErrInvalid, "no multi-receive")
	require.Equal(t, 1, tab.Outstanding())

	u.put(0, 5, 60)
	u.put(1, 5, 60) // the same slot again: no longer outstanding
	u.publish(2)
	var c Completion
	require.True(t, u.src.Next(&c))
	require.Zero(t, c.Err)
	require.Equal(t, "five", c.Context)
	require.EqualValues(t, 0x5000, c.Buf)
	require.Equal(t, 60, c.Len)
	require.True(t, u.src.Next(&c))
	require.Equal(t, cq.ProvBadID, c.Prov)
	u.src.Publish()
	require.Zero(t, tab.Outstanding())
	_, err = tab.PostSlot(5, Op{Len: 100})
	require.NoError(t, err, "released, slot 5 posts again")

	gen, err := NewTable(8, 16)
	require.NoError(t, err)
	_, err = gen.PostSlot(0, Op{Len: 1})
	require.ErrorIs(t, err, cq.ErrInvalid, "ids with a generation")
}
