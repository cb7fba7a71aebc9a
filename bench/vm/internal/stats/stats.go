// Package stats holds the arithmetic bench/vm's host and guest programs
// share.
package stats

import "slices"

// Median returns the median of v (the mean of the middle two for an even
// count), 0 for none. v is not modified.
func Median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	v = slices.Clone(v)
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}
