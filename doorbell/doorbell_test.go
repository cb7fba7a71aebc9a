package doorbell

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func window(t *testing.T) ([]byte, Window) {
	mem, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	require.NoError(t, err)
	t.Cleanup(func() { _ = unix.Munmap(mem) })
	return mem, NewWindow(mem)
}

func TestAccessWidths(t *testing.T) {
	mem, w := window(t)
	require.NoError(t, w.Write8(1, 0xab))
	require.NoError(t, w.Write16(2, 0x1234))
	require.NoError(t, w.Write32(4, 0xdeadbeef))
	require.NoError(t, w.Write64(8, 0x0102030405060708))
	require.Equal(t, byte(0xab), mem[1])
	require.Equal(t, uint16(0x1234), binary.LittleEndian.Uint16(mem[2:]))
	require.Equal(t, uint32(0xdeadbeef), binary.LittleEndian.Uint32(mem[4:]))
	require.Equal(t, uint64(0x0102030405060708), binary.LittleEndian.Uint64(mem[8:]))
	v8, _ := w.Read8(1)
	v16, _ := w.Read16(2)
	v32, _ := w.Read32(4)
	v64, _ := w.Read64(8)
	require.Equal(t, uint8(0xab), v8)
	require.Equal(t, uint16(0x1234), v16)
	require.Equal(t, uint32(0xdeadbeef), v32)
	require.Equal(t, uint64(0x0102030405060708), v64)
	require.Zero(t, mem[0], "a narrow store leaves its neighbours alone")
}

func TestRange(t *testing.T) {
	_, w := window(t)
	for _, tc := range []struct {
		off   uintptr
		width int
	}{{4096, 4}, {4094, 4}, {2, 4}, {1, 2}, {4, 8}, {1 << 62, 4}} {
		var err error
		switch tc.width {
		case 2:
			_, err = w.Reg16(tc.off)
		case 4:
			_, err = w.Reg32(tc.off)
		case 8:
			_, err = w.Reg64(tc.off)
		}
		require.ErrorIs(t, err, ErrRange, "offset %#x width %d", tc.off, tc.width)
	}
	_, err := Window{}.Reg32(0)
	require.ErrorIs(t, err, ErrRange)
	_, err = w.Reg32(4092)
	require.NoError(t, err)
}

func TestDoorbellSkipsRepeats(t *testing.T) {
	mem, w := window(t)
	r, err := w.Reg32(64)
	require.NoError(t, err)
	d := NewDoorbell(r)
	d.Ring(5)
	d.Ring(5)
	d.Ring(6)
	require.EqualValues(t, 2, d.Rings())
	require.EqualValues(t, 6, binary.LittleEndian.Uint32(mem[64:]))
	d.Force(6)
	require.EqualValues(t, 3, d.Rings())
}

func TestNeedEvent(t *testing.T) {
	require.True(t, NeedEvent(0, 1, 0))
	require.False(t, NeedEvent(5, 3, 0))
	require.True(t, NeedEvent(5, 6, 3))
	require.False(t, NeedEvent(5, 5, 3), "event 5 is crossed only when new passes it")
	require.True(t, NeedEvent(0xffff, 2, 0xfffe), "wraps")
}

func BenchmarkDoorbellRing(b *testing.B) {
	mem, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	require.NoError(b, err)
	defer unix.Munmap(mem)
	r, _ := NewWindow(mem).Reg32(0)
	d := NewDoorbell(r)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		d.Ring(uint32(i))
	}
}
