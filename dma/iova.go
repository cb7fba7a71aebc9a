package dma

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
)

// Range is an inclusive window of I/O virtual addresses [Start, End]. It has
// the same fields as vfio.IOVARange, so one converts to the other directly.
type Range struct{ Start, End uint64 }

// Size returns the number of addresses in the range.
func (r Range) Size() uint64 { return r.End - r.Start + 1 }

func (r Range) String() string { return fmt.Sprintf("[%#x, %#x]", r.Start, r.End) }

// Errors of the IOVA allocator.
var (
	// ErrNoIOVA means no free window in the reported ranges fits the request.
	ErrNoIOVA = errors.New("dma: IOVA space exhausted")
	// ErrBadRange means a range or a request is malformed (empty, reversed,
	// overlapping, unaligned, or not owned by the allocator).
	ErrBadRange = errors.New("dma: bad IOVA range")
)

// IOVAAllocator hands out device addresses from the ranges the IOMMU reported,
// first fit, never crossing a hole between ranges. It is safe for concurrent use.
type IOVAAllocator struct {
	mu   sync.Mutex
	free []Range // sorted, disjoint, not adjacent
	all  []Range
}

// NewIOVAAllocator allocates from ranges, but never below floor: a floor
// keeps IOVA 0 (and, if asked, everything below guest RAM's top) unused so
// that a zero or stale address written by a buggy device never hits a buffer.
func NewIOVAAllocator(ranges []Range, floor uint64) (*IOVAAllocator, error) {
	rs := append([]Range(nil), ranges...)
	sort.Slice(rs, func(i, j int) bool { return rs[i].Start < rs[j].Start })
	a := &IOVAAllocator{}
	for i, r := range rs {
		if r.End < r.Start {
			return nil, fmt.Errorf("%w: %v is reversed", ErrBadRange, r)
		}
		if i > 0 && r.Start <= rs[i-1].End {
			return nil, fmt.Errorf("%w: %v overlaps %v", ErrBadRange, r, rs[i-1])
		}
		a.all = append(a.all, r)
		if r.End < floor {
			continue
		}
		if r.Start < floor {
			r.Start = floor
		}
		a.free = append(a.free, r)
	}
	if len(a.free) == 0 {
		return nil, fmt.Errorf("%w: no range above floor %#x in %s", ErrNoIOVA, floor, fmtRanges(ranges))
	}
	return a, nil
}

// Ranges returns the ranges the allocator was made from.
func (a *IOVAAllocator) Ranges() []Range { return append([]Range(nil), a.all...) }

// Alloc returns size bytes of IOVA space aligned to align (a power of two).
func (a *IOVAAllocator) Alloc(size, align uint64) (uint64, error) {
	if size == 0 || align == 0 || align&(align-1) != 0 {
		return 0, fmt.Errorf("%w: size %#x align %#x", ErrBadRange, size, align)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for i, r := range a.free {
		start := (r.Start + align - 1) &^ (align - 1)
		if start < r.Start || start > r.End || r.End-start < size-1 {
			continue // alignment overflowed or the window is too small
		}
		end := start + size - 1
		var parts []Range
		if start > r.Start {
			parts = append(parts, Range{r.Start, start - 1})
		}
		if end < r.End {
			parts = append(parts, Range{end + 1, r.End})
		}
		a.free = append(a.free[:i], append(parts, a.free[i+1:]...)...)
		return start, nil
	}
	return 0, fmt.Errorf("%w: no window of %#x bytes aligned to %#x in %s (free: %s)",
		ErrNoIOVA, size, align, fmtRanges(a.all), fmtRanges(a.free))
}

// Free returns [iova, iova+size) to the allocator.
func (a *IOVAAllocator) Free(iova, size uint64) error {
	if size == 0 || iova+size-1 < iova {
		return fmt.Errorf("%w: free %#x+%#x", ErrBadRange, iova, size)
	}
	r := Range{iova, iova + size - 1}
	a.mu.Lock()
	defer a.mu.Unlock()
	inside := false
	for _, w := range a.all {
		if r.Start >= w.Start && r.End <= w.End {
			inside = true
		}
	}
	i := sort.Search(len(a.free), func(i int) bool { return a.free[i].Start > r.Start })
	if !inside || (i > 0 && a.free[i-1].End >= r.Start) || (i < len(a.free) && a.free[i].Start <= r.End) {
		return fmt.Errorf("%w: %v was not allocated", ErrBadRange, r)
	}
	a.free = append(a.free[:i], append([]Range{r}, a.free[i:]...)...)
	// Merge with neighbours so large requests keep fitting.
	if i+1 < len(a.free) && a.free[i].End+1 == a.free[i+1].Start {
		a.free[i].End = a.free[i+1].End
		a.free = append(a.free[:i+1], a.free[i+2:]...)
	}
	if i > 0 && a.free[i-1].End+1 == a.free[i].Start {
		a.free[i-1].End = a.free[i].End
		a.free = append(a.free[:i], a.free[i+1:]...)
	}
	return nil
}

func fmtRanges(rs []Range) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = r.String()
	}
	return strings.Join(s, " ")
}
