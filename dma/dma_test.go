package dma

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/hugepage"
	"golang.org/x/sys/unix"
)

// The ranges a q35 guest with aw-bits=48 reports: a hole at the interrupt window.
var q35 = []Range{{0, 0xfedfffff}, {0xfef00000, 1<<48 - 1}}

func TestIOVAHolesAndAlignment(t *testing.T) {
	a, err := NewIOVAAllocator([]Range{{0x1000, 0x4fff}, {0x10000, 0x1ffff}}, 0x1000)
	require.NoError(t, err)
	x, err := a.Alloc(0x3000, 0x1000)
	require.NoError(t, err)
	require.EqualValues(t, 0x1000, x)
	// 0x2000 bytes do not fit in what is left of the first range (0x4000-0x4fff):
	// the allocation goes to the second range rather than across the hole.
	y, err := a.Alloc(0x2000, 0x1000)
	require.NoError(t, err)
	require.EqualValues(t, 0x10000, y)
	z, err := a.Alloc(0x1000, 0x8000)
	require.NoError(t, err)
	require.EqualValues(t, 0x18000, z)
	require.NoError(t, a.Free(x, 0x3000))
	require.NoError(t, a.Free(y, 0x2000))
	require.NoError(t, a.Free(z, 0x1000))
	// Freed space coalesces: the whole first range is one window again.
	w, err := a.Alloc(0x4000, 0x1000)
	require.NoError(t, err)
	require.EqualValues(t, 0x1000, w)
}

func TestIOVAExhaustion(t *testing.T) {
	a, err := NewIOVAAllocator([]Range{{0x1000, 0x2fff}}, 0)
	require.NoError(t, err)
	_, err = a.Alloc(0x2000, 0x1000)
	require.NoError(t, err)
	_, err = a.Alloc(0x1000, 0x1000)
	require.ErrorIs(t, err, ErrNoIOVA)
	require.Contains(t, err.Error(), "[0x1000, 0x2fff]", "the error names the ranges")
}

func TestIOVAFloorAndAboveRAM(t *testing.T) {
	a, err := NewIOVAAllocator(q35, 1<<32)
	require.NoError(t, err)
	x, err := a.Alloc(2<<20, 2<<20)
	require.NoError(t, err)
	require.EqualValues(t, uint64(1<<32), x)
	_, err = NewIOVAAllocator([]Range{{0, 0xffff}}, 0x10000)
	require.ErrorIs(t, err, ErrNoIOVA)
}

func TestIOVABadInput(t *testing.T) {
	_, err := NewIOVAAllocator([]Range{{5, 4}}, 0)
	require.ErrorIs(t, err, ErrBadRange)
	_, err = NewIOVAAllocator([]Range{{0, 10}, {5, 20}}, 0)
	require.ErrorIs(t, err, ErrBadRange)
	a, err := NewIOVAAllocator(q35, 0x1000)
	require.NoError(t, err)
	_, err = a.Alloc(0x1000, 3)
	require.ErrorIs(t, err, ErrBadRange)
	_, err = a.Alloc(0, 0x1000)
	require.ErrorIs(t, err, ErrBadRange)
	require.ErrorIs(t, a.Free(0x1000, 0x1000), ErrBadRange, "never allocated")
	require.ErrorIs(t, a.Free(0xfee00000, 0x1000), ErrBadRange, "in the hole")
	x, err := a.Alloc(0x1000, 0x1000)
	require.NoError(t, err)
	require.NoError(t, a.Free(x, 0x1000))
	require.ErrorIs(t, a.Free(x, 0x1000), ErrBadRange, "double free")
	_, err = a.Alloc(1<<50, 0x1000)
	require.ErrorIs(t, err, ErrNoIOVA)
	_, err = a.Alloc(0x1000, 1<<63)
	require.ErrorIs(t, err, ErrNoIOVA, "alignment past the top")
}

type fakeMapper struct {
	maps   map[uint64]int
	fail   bool
	events []string
}

func (f *fakeMapper) MapDMA(mem []byte, iova uint64) error {
	if f.fail {
		return errors.New("boom")
	}
	f.maps[iova] = len(mem)
	f.events = append(f.events, fmt.Sprintf("map %#x", iova))
	return nil
}

func (f *fakeMapper) UnmapDMA(iova, size uint64) error {
	if f.maps[iova] != int(size) {
		return errors.New("unknown mapping")
	}
	delete(f.maps, iova)
	f.events = append(f.events, fmt.Sprintf("unmap %#x", iova))
	return nil
}

var small = hugepage.Options{PageSize: hugepage.Size4K}

func TestSpaceMapsAtAllocatedIOVA(t *testing.T) {
	m := &fakeMapper{maps: map[uint64]int{}}
	s, err := NewSpace(m, q35, 1<<32)
	require.NoError(t, err)
	r, err := s.Alloc(8192, small)
	require.NoError(t, err)
	require.EqualValues(t, uint64(1<<32), r.IOVA())
	require.Equal(t, 8192, m.maps[1<<32])
	r2, err := s.Alloc(4096, small)
	require.NoError(t, err)
	require.EqualValues(t, uint64(1<<32)+8192, r2.IOVA())
	require.NoError(t, r.Close())
	require.NoError(t, r.Close(), "idempotent")
	require.NotContains(t, m.maps, uint64(1<<32))
	require.NoError(t, s.Close())
	require.Empty(t, m.maps, "Space.Close unmaps what is left")
	_, err = s.Alloc(4096, small)
	require.ErrorIs(t, err, ErrClosed)
}

// TestSpaceDetach: Detach takes every region out of the device's reach
// (each IOMMU mapping removed once) and leaves the memory readable until
// Close, which frees it without unmapping a second time; no region is
// made after Detach.
func TestSpaceDetach(t *testing.T) {
	m := &fakeMapper{maps: map[uint64]int{}}
	s, err := NewSpace(m, q35, 1<<32)
	require.NoError(t, err)
	r, err := s.Alloc(8192, small)
	require.NoError(t, err)
	r.Bytes()[100] = 7
	require.NoError(t, s.Detach())
	require.Empty(t, m.maps, "the device reaches nothing")
	require.NoError(t, s.Detach(), "idempotent")
	require.Equal(t, byte(7), r.Bytes()[100], "the memory stays readable")
	_, err = s.Alloc(4096, small)
	require.ErrorIs(t, err, ErrClosed)
	require.NoError(t, s.Close(), "no second unmap")
	require.Nil(t, r.Bytes())
	require.Equal(t, []string{"map 0x100000000", "unmap 0x100000000"}, m.events)
}

func TestSpaceMapFailureRollsBack(t *testing.T) {
	m := &fakeMapper{maps: map[uint64]int{}, fail: true}
	s, err := NewSpace(m, []Range{{0x1000, 0x1fff}}, 0)
	require.NoError(t, err)
	_, err = s.Alloc(4096, small)
	require.Error(t, err)
	m.fail = false
	r, err := s.Alloc(4096, small)
	require.NoError(t, err, "the IOVA of the failed attempt was given back")
	require.EqualValues(t, 0x1000, r.IOVA())
	require.NoError(t, s.Close())
}

func TestCarve(t *testing.T) {
	s := NewIdentitySpace()
	defer s.Close()
	r, err := s.Alloc(8192, small)
	require.NoError(t, err)
	require.EqualValues(t, r.IOVA(), uint64(uintptrOf(r.Bytes())), "identity")
	a, err := r.Carve(100, 64)
	require.NoError(t, err)
	b, err := r.Carve(256, 256)
	require.NoError(t, err)
	require.Zero(t, b.IOVA%256)
	require.GreaterOrEqual(t, b.IOVA, a.IOVA+100)
	require.Len(t, b.Bytes, 256)
	require.Equal(t, 256, cap(b.Bytes), "a slice cannot grow into its neighbour")
	_, err = r.Carve(8192, 64)
	require.ErrorIs(t, err, ErrNoRoom)
	_, err = r.Carve(64, 3)
	require.ErrorIs(t, err, ErrBadRange)
	require.NoError(t, r.Close())
	_, err = r.Carve(64, 64)
	require.ErrorIs(t, err, ErrClosed)
}

func TestPool(t *testing.T) {
	s := NewIdentitySpace()
	defer s.Close()
	r, err := s.Alloc(64<<10, small)
	require.NoError(t, err)
	p, err := NewPool(r, 8, 2000)
	require.NoError(t, err)
	require.Equal(t, 2048, p.BufSize())
	seen := map[uint32]bool{}
	for i := 0; i < 8; i++ {
		idx, ok := p.Get()
		require.True(t, ok)
		require.False(t, seen[idx])
		seen[idx] = true
		got, err := p.Index(p.Addr(idx) + 100)
		require.NoError(t, err)
		require.Equal(t, idx, got)
		require.Len(t, p.Buf(idx), 2048)
	}
	_, ok := p.Get()
	require.False(t, ok, "exhausted")
	require.NoError(t, p.Put(3))
	require.ErrorIs(t, p.Put(3), ErrBadBuffer, "double put")
	require.ErrorIs(t, p.Put(8), ErrBadBuffer)
	require.Nil(t, p.Buf(99))
	_, err = p.Index(p.Addr(0) - 1)
	require.ErrorIs(t, err, ErrBadBuffer)
	_, err = p.Index(p.Addr(7) + 2048)
	require.ErrorIs(t, err, ErrBadBuffer)
	idx, ok := p.Get()
	require.True(t, ok)
	require.EqualValues(t, 3, idx)
	_, err = NewPool(r, 0, 10)
	require.ErrorIs(t, err, ErrBadRange)
	_, err = NewPool(nil, 8, 2000)
	require.ErrorIs(t, err, ErrBadRange, "a nil region is an error, not a panic")
}

// TestPoolBeyond4GiB: in a pool larger than 4 GiB, Buf and Addr name the
// same buffer past the first 4 GiB. The pool's memory is reserved address
// space only (PROT_NONE, MAP_NORESERVE): Buf hands out slices without
// touching them.
func TestPoolBeyond4GiB(t *testing.T) {
	const size, count, iova = 1 << 16, 1 << 17, 1 << 32 // 8 GiB: 131072 buffers of 64 KiB
	n := uint64(size) * count
	if uint64(int(n)) != n {
		t.Skip("needs a 64-bit address space")
	}
	mem, err := unix.Mmap(-1, 0, int(n), unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		t.Skipf("cannot reserve 8 GiB of address space: %v", err)
	}
	defer unix.Munmap(mem)
	p := &Pool{mem: Slice{Bytes: mem, IOVA: iova}, size: size, count: count, iovaEnd: iova + n}
	for _, idx := range []uint32{0, 1, 1<<16 - 1, 1 << 16, 1<<16 + 1, count - 1} {
		b := p.Buf(idx)
		require.Len(t, b, size)
		off := uint64(uintptrOf(b) - uintptrOf(mem))
		require.Equal(t, p.Addr(idx)-iova, off, "buffer %d: Buf at offset %#x, the device's address at %#x", idx, off, p.Addr(idx)-iova)
		got, err := p.Index(p.Addr(idx) + size - 1)
		require.NoError(t, err)
		require.Equal(t, idx, got)
	}
	require.Equal(t, uintptrOf(mem)+uintptr(n), uintptrOf(p.Buf(count-1))+size, "the last buffer ends where the pool does")
}

func TestPoolNoAllocs(t *testing.T) {
	s := NewIdentitySpace()
	defer s.Close()
	r, err := s.Alloc(64<<10, small)
	require.NoError(t, err)
	p, err := NewPool(r, 16, 2048)
	require.NoError(t, err)
	allocs := testing.AllocsPerRun(1000, func() {
		i, _ := p.Get()
		_ = p.Put(i)
	})
	require.Zero(t, allocs)
}

func BenchmarkPoolGetPut(b *testing.B) {
	s := NewIdentitySpace()
	defer s.Close()
	r, _ := s.Alloc(1<<20, small)
	p, _ := NewPool(r, 256, 2048)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		idx, _ := p.Get()
		_ = p.Put(idx)
	}
}

func TestSpaceRanges(t *testing.T) {
	s, err := NewSpace(&fakeMapper{maps: map[uint64]int{}}, q35, 1<<32)
	require.NoError(t, err)
	require.Equal(t, q35, s.Ranges(), "the reported ranges, not what is left above the floor")
	require.Nil(t, NewIdentitySpace().Ranges())
}
