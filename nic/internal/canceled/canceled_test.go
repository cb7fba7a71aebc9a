package canceled

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/cq"
	cqring "github.com/vfnic/vfnic/cq/ring"
	"github.com/vfnic/vfnic/nic"
)

// TestList: completions come out one at a time in the order added, to
// Poll as kept and to a CQ as flushed entries; Drop forgets the rest.
func TestList(t *testing.T) {
	var l List
	errC := errors.New("canceled")
	for _, ctx := range []any{"a", "b", "c", "d"} {
		l.Add(ctx, 2, errC)
	}
	require.Equal(t, 4, l.Len())
	require.Zero(t, l.Take(nil), "no room")
	out := make([]nic.Completion, 3)
	require.Equal(t, 1, l.Take(out), "one per call")
	require.Equal(t, nic.Completion{Context: "a", Queue: 2, Err: errC}, out[0])
	var c cqring.Completion
	require.True(t, l.Next(&c, cq.FlagRecv|cq.FlagMsg))
	require.Equal(t, cqring.Completion{Context: "b", Flags: cq.FlagRecv | cq.FlagMsg, Err: cq.ECANCELED}, c)
	require.Equal(t, 2, l.Len())
	l.Drop()
	require.Zero(t, l.Len())
	require.Zero(t, l.Take(out))
	require.False(t, l.Next(&c, 0))
}
