//go:build !amd64

package doorbell

import (
	"sync/atomic"
	"unsafe"
)

// Without assembly, sync/atomic gives single, ordered accesses. 8- and
// 16-bit registers go through the aligned 32-bit word that holds them,
// which is correct for memory but not for registers with read side effects.

func load32(p unsafe.Pointer) uint32     { return atomic.LoadUint32((*uint32)(p)) }
func store32(p unsafe.Pointer, v uint32) { atomic.StoreUint32((*uint32)(p), v) }
func load64(p unsafe.Pointer) uint64     { return atomic.LoadUint64((*uint64)(p)) }
func store64(p unsafe.Pointer, v uint64) { atomic.StoreUint64((*uint64)(p), v) }

// wmbStore32 is Wmb then store32 (Doorbell.Ring).
func wmbStore32(p unsafe.Pointer, v uint32) { Wmb(); store32(p, v) }

func word(p unsafe.Pointer) (*uint32, uint) {
	lo := uintptr(p) & 3
	return (*uint32)(unsafe.Add(p, -int(lo))), uint(lo) * 8
}

func load8(p unsafe.Pointer) uint8 {
	w, s := word(p)
	return uint8(atomic.LoadUint32(w) >> s)
}

func load16(p unsafe.Pointer) uint16 {
	w, s := word(p)
	return uint16(atomic.LoadUint32(w) >> s)
}

func storeMasked(p unsafe.Pointer, v, mask uint32) {
	w, s := word(p)
	for {
		old := atomic.LoadUint32(w)
		if atomic.CompareAndSwapUint32(w, old, old&^(mask<<s)|(v&mask)<<s) {
			return
		}
	}
}

func store8(p unsafe.Pointer, v uint8)   { storeMasked(p, uint32(v), 0xff) }
func store16(p unsafe.Pointer, v uint16) { storeMasked(p, uint32(v), 0xffff) }

var fence uint32

// Wmb orders earlier stores before later ones.
func Wmb() { atomic.AddUint32(&fence, 1) }

// Rmb orders earlier loads before later ones.
func Rmb() { atomic.AddUint32(&fence, 1) }

// Mb orders all earlier memory accesses before later ones.
func Mb() { atomic.AddUint32(&fence, 1) }
