package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"os"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/vfnic/vfnic/cq/qpsim"
)

// The shared-memory file, as bench/c/ring.h lays it out: a control page,
// then the ring of 64-byte cq/qpsim entries.
const (
	ctrlSize  = 4096
	entrySize = qpsim.CQESize

	// Line 0 is cq/qpsim's CQ status page: the consumer doorbell and the
	// overrun word sit where the software device has them.
	offConsumer = qpsim.OffCQConsumer // u32, reader -> producer, once per batch
	offOverrun  = qpsim.OffCQOverrun  // u32, bit 0: the producer overran the ring

	// Line 1: the header the producer writes before the file appears.
	offMagic     = 64 // u32 vbMagic
	offVersion   = 68 // u32 vbVersion
	offEntries   = 72 // u32 ring entries
	offEntrySize = 76 // u32 entry size
	offMode      = 80 // u32 modeFilled or modeStream
	offSlack     = 84 // u32 entries the producer leaves free
	offTotal     = 88 // u64 completions the producer writes
	offLayout    = 96 // u32 layoutSim, layoutPacked or layoutSplit

	// Lines 2 to 5: the handshake words, one line each.
	offReaderReady = 128 // u32, reader -> producer: ops posted, go
	offProduced    = 192 // u64, producer -> reader: completions written
	offLapsDone    = 256 // u32, reader -> producer (filled): laps read
	offAbort       = 320 // u32, either side gave up

	vbMagic   = 0x51434656 // "VFCQ"
	vbVersion = 2

	// Ring layouts (ring.h VB_LAYOUT_*): cq/qpsim's CQE, the virtio packed
	// ring's descriptors, the virtio split used ring.
	layoutSim    = 0
	layoutPacked = 1
	layoutSplit  = 2
	// The split used ring's header (flags u16, idx u16) before its
	// elements.
	splitHeader = 4
	// The packed ring's AVAIL and USED flag bits.
	packedAvail = 1 << 7
	packedUsed  = 1 << 15

	modeFilled = 1
	modeStream = 2
	modeLocal  = 3 // no producer: the reader fills each lap itself

	slack = 256 // ring.h VB_SLACK

	// The completions the producer writes (ring.h VB_POST_LEN, VB_BUF_BASE,
	// VB_LEN): sequence s completes id s % N with data s.
	postLen = 2048
	bufBase = 0x10000000
)

// compile-time check that sim's status page matches ring.h's offsets.
var _ = [1]struct{}{}[offConsumer] // offConsumer must be 0
var _ = [1]struct{}{}[offOverrun-16]

// layoutNames are the layouts' names, as ring.h and run.sh spell them.
var layoutNames = []string{"sim", "packed", "split"}

// entrySizeOf is the size of one entry of layout.
func entrySizeOf(layout uint32) int {
	switch layout {
	case layoutSim:
		return entrySize
	case layoutPacked:
		return 16
	case layoutSplit:
		return 8
	}
	return 0
}

// ringSize is the size of the ring after the control page.
func ringSize(layout uint32, n int) int {
	if layout == layoutSplit {
		return splitHeader + n*8
	}
	return n * entrySizeOf(layout)
}

// shm is the mapped benchmark file.
type shm struct {
	mem     []byte
	layout  uint32
	entries int
	mode    uint32
	slack   int
	total   uint64
}

// openShm waits up to timeout for the producer to rename the file into
// place, maps it and checks its header.
func openShm(path string, timeout time.Duration) (*shm, error) {
	deadline := time.Now().Add(timeout)
	var f *os.File
	for {
		var err error
		f, err = os.OpenFile(path, os.O_RDWR, 0)
		if err == nil {
			break
		}
		if !errors.Is(err, os.ErrNotExist) || time.Now().After(deadline) {
			return nil, err
		}
		time.Sleep(200 * time.Microsecond)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() < ctrlSize || st.Size() > 1<<31 {
		return nil, fmt.Errorf("%s: size %d is not a benchmark ring", path, st.Size())
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap %s: %w", path, err)
	}
	s := &shm{mem: mem}
	n := int(s.u32(offEntries))
	s.layout = s.u32(offLayout)
	esz := entrySizeOf(s.layout)
	if s.u32(offMagic) != vbMagic || s.u32(offVersion) != vbVersion || esz == 0 || s.u32(offEntrySize) != uint32(esz) ||
		n == 0 || n&(n-1) != 0 || n > 1<<24 || int64(ctrlSize+ringSize(s.layout, n)) > st.Size() {
		_ = unix.Munmap(mem)
		return nil, fmt.Errorf("%s: bad header (magic, version, entry size or entries)", path)
	}
	s.entries, s.mode, s.slack = n, s.u32(offMode), int(s.u32(offSlack))
	s.total = atomic.LoadUint64(s.p64(offTotal))
	return s, nil
}

func (s *shm) p32(off int) *uint32 { return (*uint32)(unsafe.Pointer(&s.mem[off])) }
func (s *shm) p64(off int) *uint64 { return (*uint64)(unsafe.Pointer(&s.mem[off])) }
func (s *shm) u32(off int) uint32  { return atomic.LoadUint32(s.p32(off)) }

// newLocal makes a private ring for local mode, with the header a
// producer would write.
func newLocal(n int, count uint64, layout uint32) (*shm, error) {
	if n < 2*slack || n > 1<<24 || n&(n-1) != 0 || (layout != layoutSim && n > 1<<15) {
		return nil, fmt.Errorf("%d entries: need a power of two in [%d, 2^24] (2^15 for virtio)", n, 2*slack)
	}
	size := ctrlSize + ringSize(layout, n)
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("mmap %d bytes: %w", size, err)
	}
	total := (count + uint64(n) - 1) / uint64(n) * uint64(n)
	return &shm{mem: mem, layout: layout, entries: n, mode: modeLocal, slack: slack, total: total}, nil
}

// fill writes the completions for sequences [from, to) as producer.c
// does: every field, then, for all of them in order, the owner word with
// the lap's phase, last, with an atomic store.
func (s *shm) fill(from, to uint64) {
	switch s.layout {
	case layoutPacked:
		s.fillPacked(from, to)
		return
	case layoutSplit:
		s.fillSplit(from, to)
		return
	}
	n := uint64(s.entries)
	shift := uint(bits.TrailingZeros64(n))
	ring := s.ring()
	for q := from; q < to; q++ {
		e := ring[int(q&(n-1))*entrySize:][:entrySize]
		le := binary.LittleEndian
		le.PutUint32(e[qpsim.OffID:], uint32(q&(n-1)))
		le.PutUint16(e[qpsim.OffQueue:], 0)
		e[qpsim.OffOpcode] = byte(qpsim.OpRecv)
		e[qpsim.OffStatus] = byte(qpsim.StatusOK)
		le.PutUint32(e[qpsim.OffByteLen:], byteLen(q))
		le.PutUint32(e[qpsim.OffDevFlags:], qpsim.DevHasData)
		le.PutUint64(e[qpsim.OffData:], q)
		le.PutUint64(e[qpsim.OffTag:], 0)
		le.PutUint64(e[qpsim.OffSrc:], 0)
		le.PutUint32(e[qpsim.OffSyndrome:], 0)
		le.PutUint32(e[qpsim.OffBufOff:], 0)
		clear(e[48:qpsim.OffOwner])
	}
	for q := from; q < to; q++ {
		phase := uint32(1) ^ uint32(q>>shift)&1
		atomic.StoreUint32((*uint32)(unsafe.Pointer(&ring[int(q&(n-1))*entrySize+qpsim.OffOwner])), phase<<31)
	}
}

// fillPacked is fill for the packed layout (ring.h vb_put_packed): id and
// len of each descriptor, then the flags words in order, AVAIL and USED
// equal to the lap's wrap counter, with an atomic store of the aligned
// 32-bit word that holds id and flags (this thread writes both).
func (s *shm) fillPacked(from, to uint64) {
	n := uint64(s.entries)
	shift := uint(bits.TrailingZeros64(n))
	ring := s.ring()
	le := binary.LittleEndian
	for q := from; q < to; q++ {
		e := ring[int(q&(n-1))*16:][:16]
		le.PutUint64(e[0:], 0)
		le.PutUint32(e[8:], byteLen(q))
	}
	for q := from; q < to; q++ {
		var fl uint32
		if uint32(q>>shift)&1 == 0 { // wrap counter 1 on the first lap
			fl = packedAvail | packedUsed
		}
		atomic.StoreUint32((*uint32)(unsafe.Pointer(&ring[int(q&(n-1))*16+12])), uint32(q&(n-1))|fl<<16)
	}
}

// fillSplit is fill for the split used ring (ring.h vb_put_split): the
// elements, then the used index once, with an atomic store of the header
// word (flags 0, idx in the upper half).
func (s *shm) fillSplit(from, to uint64) {
	n := uint64(s.entries)
	ring := s.ring()
	le := binary.LittleEndian
	for q := from; q < to; q++ {
		e := ring[splitHeader+int(q&(n-1))*8:][:8]
		le.PutUint32(e[0:], uint32(q&(n-1)))
		le.PutUint32(e[4:], byteLen(q))
	}
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&ring[0])), uint32(uint16(to))<<16)
}

// byteLen is the length the producer reports for sequence q (VB_LEN).
func byteLen(q uint64) uint32 { return 64 + uint32(q&1023) }

// ring returns the memory after the control page: the entries, after the
// split used ring's header.
func (s *shm) ring() []byte { return s.mem[ctrlSize : ctrlSize+ringSize(s.layout, s.entries)] }

// close unmaps the file.
func (s *shm) close() error {
	if s.mem == nil {
		return nil
	}
	err := unix.Munmap(s.mem)
	s.mem = nil
	return err
}
