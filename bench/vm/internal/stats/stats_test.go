package stats

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestMedian(t *testing.T) {
	require.Zero(t, Median(nil))
	require.Equal(t, 2.0, Median([]float64{3, 1, 2}))
	in := []float64{4, 1, 3, 2}
	require.Equal(t, 2.5, Median(in))
	require.Equal(t, []float64{4, 1, 3, 2}, in, "the input is not sorted in place")
}
