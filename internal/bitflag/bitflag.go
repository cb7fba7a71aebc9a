// Package bitflag formats bit sets by name, for the String methods of the
// flag types of package cq (libfabric's names) and package verbs (verbs'
// names).
package bitflag

import (
	"strconv"
	"strings"
)

// Name is the name of one or more bits.
type Name[T ~uint32 | ~uint64] struct {
	Bits T
	Name string
}

// String joins with "|" the names of the bits set in f, in the order of
// names, then any bits left as one hexadecimal number; "0" for no bit.
func String[T ~uint32 | ~uint64](f T, names []Name[T]) string {
	if f == 0 {
		return "0"
	}
	var parts []string
	for _, n := range names {
		if f&n.Bits != 0 {
			parts = append(parts, n.Name)
			f &^= n.Bits
		}
	}
	if f != 0 {
		parts = append(parts, "0x"+strconv.FormatUint(uint64(f), 16))
	}
	return strings.Join(parts, "|")
}
