// Package suggest finds the word a user probably meant: the "did you
// mean" of vfnic's unknown flags and of filter keywords.
package suggest

import "slices"

// Closest returns the word of words nearest to s, within two edits
// (insertions, deletions, substitutions and swaps of neighbours), or ""
// when none is that near. Ties go to the word first in sorted order, so
// the answer does not depend on the order of words.
func Closest(s string, words []string) string {
	sorted := slices.Sorted(slices.Values(words))
	best, bestD := "", 3
	for _, w := range sorted {
		if w == s {
			continue
		}
		if d := distance(s, w); d < bestD {
			best, bestD = w, d
		}
	}
	return best
}

// distance is the optimal-string-alignment distance: Levenshtein's, with
// a swap of two neighbouring letters counting as one edit ("prot", "port").
func distance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}
