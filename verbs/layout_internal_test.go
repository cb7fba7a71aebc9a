package verbs

import (
	"testing"
	"unsafe"

	"github.com/vfnic/vfnic/cq"
)

var keep []*CQ

// TestEntriesOnCacheLines checks what the CQ's field order relies on: the iterator's
// buffered entries start on a 64-byte line, so no entry spans two lines.
func TestEntriesOnCacheLines(t *testing.T) {
	for i := 0; i < 64; i++ {
		c := &CQ{single: i%2 == 0} // as CreateCQ allocates it
		keep = append(keep, c)
		if a := uintptr(unsafe.Pointer(&c.ents[0])); a%64 != 0 {
			t.Errorf("CQ (%d bytes) at %#x, entries at offset %d: they are %d bytes into a cache line", unsafe.Sizeof(*c), a, unsafe.Offsetof(c.ents), a%64)
		}
	}
	keep = nil
}

// TestOpcodeTable checks that the byte table Opcode reads gives what
// opcodeOf does for every combination of the flags it looks at.
func TestOpcodeTable(t *testing.T) {
	c := &CQ{opc: opcodes} // as CreateCQ sets it
	for i := range 64 {
		f := cq.Flags(i) << 8
		c.ents[0].Flags = f
		if got, want := c.Opcode(), opcodeOf(f); got != want {
			t.Errorf("flags %v: Opcode %v, want %v", f, got, want)
		}
	}
}

// TestWRIDTypes checks WRID's conversions: the integer contexts it takes
// as a work-request id, and 0 for any other.
func TestWRIDTypes(t *testing.T) {
	c := &CQ{}
	for _, tc := range []struct {
		ctx  any
		want uint64
	}{
		{uint64(1 << 40), 1 << 40}, {int(7), 7}, {uint32(9), 9}, {uintptr(11), 11},
		{int(-1), ^uint64(0)}, {"13", 0}, {uint16(5), 0}, {nil, 0},
	} {
		c.ents[0].Context = tc.ctx
		if got := c.WRID(); got != tc.want {
			t.Errorf("context %T(%v): WRID %d, want %d", tc.ctx, tc.ctx, got, tc.want)
		}
	}
}
