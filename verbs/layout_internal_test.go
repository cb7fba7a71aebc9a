package verbs

import (
	"testing"
	"unsafe"
)

var keep []*CQ

// TestEntriesOnCacheLines checks what CQ.linePad relies on: the iterator's
// buffered entries start on a 64-byte line, so no entry spans two lines.
func TestEntriesOnCacheLines(t *testing.T) {
	for i := 0; i < 64; i++ {
		c := &CQ{single: i%2 == 0} // as CreateCQ allocates it
		keep = append(keep, c)
		if a := uintptr(unsafe.Pointer(&c.ents[0])); a%64 != 0 {
			t.Errorf("CQ (%d bytes) at %#x: its entries are %d bytes into a cache line", unsafe.Sizeof(*c), a, a%64)
		}
	}
	keep = nil
}
