// Package hugepage allocates pinned, page-aligned memory outside the Go heap
// for memory shared with devices: 2 MiB hugepages by default, 1 GiB where
// asked, and 4 KiB pages only when the caller allows the fallback. The
// garbage collector never moves or scans this memory, so a device may hold
// its address for as long as the Memory is open.
package hugepage

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Size is a page size in bytes.
type Size int64

// The page sizes that Alloc understands.
const (
	Size4K Size = 4 << 10
	Size2M Size = 2 << 20
	Size1G Size = 1 << 30
)

// String names the size the way /sys/kernel/mm/hugepages does.
func (s Size) String() string {
	switch s {
	case Size4K:
		return "4K"
	case Size2M:
		return "2M"
	case Size1G:
		return "1G"
	}
	return fmt.Sprintf("%dB", int64(s))
}

// Errors returned by Alloc.
var (
	// ErrNoHugepages means the kernel had no free hugepages of the asked size
	// (see /proc/sys/vm/nr_hugepages) and no fallback was allowed. The
	// error also wraps mmap's errno.
	ErrNoHugepages = errors.New("hugepage: no free hugepages of the requested size")
	// ErrBadSize means the length or the page size is not usable.
	ErrBadSize = errors.New("hugepage: bad size")
	// ErrPin means 4K memory could not be locked in RAM (needs CAP_IPC_LOCK
	// or a large enough RLIMIT_MEMLOCK). The error also wraps mlock's
	// errno: EPERM (os.ErrPermission) when the limit is 0, else ENOMEM.
	ErrPin = errors.New("hugepage: cannot pin memory")
)

// Options say what kind of pages Alloc may use.
type Options struct {
	// PageSize is Size2M (the default when zero), Size1G or Size4K.
	PageSize Size
	// AllowFallback lets Alloc use locked 4 KiB pages when hugepages of
	// PageSize are not available. Memory.PageSize reports what was used.
	AllowFallback bool
}

// Memory is one mapping of pinned memory. Its bytes stay at the same virtual
// address until Close.
type Memory struct {
	mu   sync.Mutex
	b    []byte
	page Size
}

// Alloc maps length bytes, rounded up to a whole number of pages, and
// faults them in so that no page is missing when a device first uses it.
func Alloc(length int, opts Options) (*Memory, error) {
	page := opts.PageSize
	if page == 0 {
		page = Size2M
	}
	if length <= 0 {
		return nil, fmt.Errorf("%w: length %d", ErrBadSize, length)
	}
	switch page {
	case Size4K:
		return alloc4K(length)
	case Size2M, Size1G:
	default:
		return nil, fmt.Errorf("%w: page size %d is not 4K, 2M or 1G", ErrBadSize, int64(page))
	}
	n, ok := roundUp(length, int(page))
	if !ok {
		return nil, fmt.Errorf("%w: length %d cannot be rounded up to whole %s pages", ErrBadSize, length, page)
	}
	shift := 21
	if page == Size1G {
		shift = 30
	}
	flags := unix.MAP_PRIVATE | unix.MAP_ANONYMOUS | unix.MAP_HUGETLB | unix.MAP_POPULATE |
		shift<<unix.MAP_HUGE_SHIFT
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, flags)
	if err != nil {
		if opts.AllowFallback {
			return alloc4K(length)
		}
		return nil, fmt.Errorf("%w: %d x %s pages: mmap: %w", ErrNoHugepages, n/int(page), page, err)
	}
	// MAP_HUGETLB reserves the pages at mmap time, so a short pool fails
	// above rather than with SIGBUS on first touch.
	dontFork(b)
	return &Memory{b: b, page: page}, nil
}

func alloc4K(length int) (*Memory, error) {
	n, ok := roundUp(length, int(Size4K))
	if !ok {
		return nil, fmt.Errorf("%w: length %d cannot be rounded up to whole %s pages", ErrBadSize, length, Size4K)
	}
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("hugepage: mmap %d bytes: %w", n, err)
	}
	// Hugepages are never swapped; small pages must be locked to stay put.
	if err := unix.Mlock(b); err != nil {
		_ = unix.Munmap(b)
		return nil, fmt.Errorf("%w: mlock %d bytes: %w", ErrPin, n, err)
	}
	dontFork(b)
	return &Memory{b: b, page: Size4K}, nil
}

// dontFork keeps a child process from sharing (and copy-on-write breaking)
// pages that a device writes into. Failure only loses that protection.
func dontFork(b []byte) { _ = unix.Madvise(b, unix.MADV_DONTFORK) }

// roundUp rounds n (> 0) up to a multiple of page; ok is false when the
// result would not fit in an int.
func roundUp(n, page int) (rounded int, ok bool) {
	if n > math.MaxInt-page+1 {
		return 0, false
	}
	return (n + page - 1) / page * page, true
}

// Bytes returns the memory. The slice is invalid after Close.
func (m *Memory) Bytes() []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.b
}

// Len returns the mapped length, a multiple of PageSize.
func (m *Memory) Len() int { return len(m.Bytes()) }

// PageSize returns the page size actually used.
func (m *Memory) PageSize() Size { return m.page }

// Addr returns the virtual address of the first byte (0 after Close).
func (m *Memory) Addr() uintptr {
	b := m.Bytes()
	if len(b) == 0 {
		return 0
	}
	return uintptr(unsafe.Pointer(&b[0]))
}

// String describes the mapping, e.g. "4 MiB in 2 x 2M pages".
func (m *Memory) String() string {
	n := m.Len()
	return fmt.Sprintf("%d KiB in %d x %s pages", n>>10, n/int(m.page), m.page)
}

// Close unmaps the memory. It is safe to call more than once.
func (m *Memory) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.b == nil {
		return nil
	}
	err := unix.Munmap(m.b)
	m.b = nil
	if err != nil {
		return fmt.Errorf("hugepage: munmap: %w", err)
	}
	return nil
}

// Free reports the free hugepages of a size from sysfs, for callers that
// want to explain an ErrNoHugepages or size a reservation.
func Free(size Size) (int, error) {
	path := fmt.Sprintf("/sys/kernel/mm/hugepages/hugepages-%dkB/free_hugepages", int64(size)>>10)
	var n int
	b, err := readFile(path)
	if err != nil {
		return 0, err
	}
	if _, err := fmt.Sscanf(string(b), "%d", &n); err != nil {
		return 0, fmt.Errorf("hugepage: parse %s: %w", path, err)
	}
	return n, nil
}
