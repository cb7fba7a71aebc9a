package suggest

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestClosest(t *testing.T) {
	words := []string{"port", "proto", "host", "snaplen", "count", "w", "i", "json"}
	for _, tc := range []struct{ in, want string }{
		{"prot", "port"}, // a swap is one edit; ties go to the first sorted
		{"hots", "host"},
		{"snaplne", "snaplen"},
		{"cont", "count"},
		{"jsno", "json"},
		{"xyzzy", ""},
		{"", "i"},
	} {
		require.Equal(t, tc.want, Closest(tc.in, words), tc.in)
	}
	require.Equal(t, "ab", Closest("a", []string{"a", "ab"}), "never the word itself")
	require.Equal(t, 1, distance("ab", "ba"))
	require.Equal(t, 3, distance("", "abc"))
	require.Equal(t, 2, distance("kitten", "sitten")+distance("a", "b"))
}
