package ring_test

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/cq/ring"
)

// A driver's read of its completion ring, the page the author of a new
// driver starts from: a ring Layout (where the ownership bit and the
// fields lie), a Table of the operations posted, and a batch read
// (NextBatch), then one pass of the driver's own over the batch and one
// Publish. The "device" here is the example itself, writing 16-byte
// entries as an NVMe-style device does: the length at byte 0, the id in
// the low half of the word at byte 12 and the phase bit (16) of that word
// last.
func Example_driverRead() {
	const n = 8
	l := ring.Layout{
		Name: "example", EntrySize: 16, Entries: n,
		Convention: ring.PhaseBit, OwnerOff: 12, OwnerMask: 1 << 16, InitPhase: 1,
		Fields: ring.Fields{ID: ring.Field{Off: 12, Bits: 16}, Len: ring.Field{Off: 0, Bits: 32}},
	}
	mem := make([]byte, n*16) // DMA memory in a driver (package dma)
	src, err := ring.NewRingSource(ring.RingConfig{Mem: mem, Layout: l})
	if err != nil {
		panic(err)
	}
	src.Ring().Reset() // no entry is the driver's before the device writes one
	// One goroutine posts and reads (or a lock serialises them): the
	// single-threaded table takes no lock of its own.
	tab, err := ring.NewSingleThreadedTable(n, 16)
	if err != nil {
		panic(err)
	}
	if err := src.BindTable(0, tab); err != nil {
		panic(err)
	}

	// Post three receives; the ids go into the device's descriptors.
	var ids []uint32
	for i := range 3 {
		id, err := tab.Post(ring.Op{Context: fmt.Sprint("buffer ", i), Len: 1500, Flags: cq.FlagRecv | cq.FlagMsg, Word: uint64(i)})
		if err != nil {
			panic(err)
		}
		ids = append(ids, id)
	}

	// The device completes them, the last one with a length beyond the
	// buffer it was given.
	for pos, c := range []struct{ id, ln uint32 }{{ids[0], 64}, {ids[1], 128}, {ids[2], 9000}} {
		e := mem[pos*16:]
		binary.LittleEndian.PutUint32(e, c.ln)
		atomic.StoreUint32((*uint32)(unsafe.Pointer(&e[12])), c.id|1<<16) // ownership last
	}

	// The driver: one batch read, one pass over it, one Publish.
	cs := make([]ring.Completion, 32)
	k := src.NextBatch(cs)
	for _, c := range cs[:k] {
		if c.Err != 0 {
			fmt.Printf("%v: refused (%v), driver word %d\n", c.Context, c.Err, c.Word)
			continue
		}
		fmt.Printf("%v: %d bytes, driver word %d\n", c.Context, c.Len, c.Word)
	}
	src.Publish() // the consumer doorbell once, the ids back to posters
	fmt.Println("outstanding:", tab.Outstanding(), "batch loop:", src.Batched())
	// Output:
	// buffer 0: 64 bytes, driver word 0
	// buffer 1: 128 bytes, driver word 1
	// buffer 2: refused (input/output error), driver word 2
	// outstanding: 0 batch loop: true
}
