package doorbell

import "unsafe"

// Implemented in mmio_amd64.s: one MOV each, and fences, never inlined.

func load8(p unsafe.Pointer) uint8
func load16(p unsafe.Pointer) uint16
func load32(p unsafe.Pointer) uint32
func load64(p unsafe.Pointer) uint64
func store8(p unsafe.Pointer, v uint8)
func store16(p unsafe.Pointer, v uint16)
func store32(p unsafe.Pointer, v uint32)
func store64(p unsafe.Pointer, v uint64)

// wmbStore32 is Wmb then store32 in one call (Doorbell.Ring).
func wmbStore32(p unsafe.Pointer, v uint32)

// Wmb orders earlier stores before later ones, including stores to
// write-combining mappings (SFENCE). Ordinary and uncached stores are
// already ordered on amd64; the fence makes WC BARs safe too.
func Wmb()

// Rmb orders earlier loads before later ones (LFENCE).
func Rmb()

// Mb orders all earlier memory accesses before later ones (MFENCE).
func Mb()
