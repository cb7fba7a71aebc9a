package ring

import (
	"encoding/binary"
	"github.com/vfnic/vfnic/cq"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// mmap returns zeroed memory outside the Go heap, like DMA memory: the race
// detector does not track it, as it does not track a device's writes.
func mmap(t testing.TB, size int) []byte {
	size = (size + 4095) &^ 4095
	b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	require.NoError(t, err)
	t.Cleanup(func() { _ = unix.Munmap(b) })
	return b
}

// fakeDev writes entries into a ring following a layout's convention, the
// way a device does: body first, ownership word last with an atomic store.
type fakeDev struct {
	mem     []byte
	l       Layout
	prod    uint32 // free-running count of entries written
	scratch []byte
}

func setField(e []byte, f Field, v uint64) {
	if f.Bits == 0 {
		return
	}
	if f.Shift%8 == 0 && f.Bits%8 == 0 { // whole bytes
		for i := 0; i < f.Bits/8; i++ {
			e[f.Off+f.Shift/8+i] = byte(v >> (8 * i))
		}
		return
	}
	for i := 0; i < f.Bits; i++ {
		bit := f.Off*8 + f.Shift + i
		if v&(1<<uint(i)) != 0 {
			e[bit/8] |= 1 << uint(bit%8)
		} else {
			e[bit/8] &^= 1 << uint(bit%8)
		}
	}
}

// ownValue is the masked ownership value the device writes on lap.
func ownValue(l Layout, lap uint32) uint32 {
	switch l.Convention {
	case DescriptorDone:
		return l.OwnerMask
	case OwnerIndex:
		if lap&1 == 1 {
			return l.OwnerMask
		}
		return 0
	}
	if (l.InitPhase^lap)&1 == 1 {
		return l.OwnerMask
	}
	return 0
}

type rawEntry struct {
	id, queue, opcode, status, ln, flags, syndrome, bufOff uint32
	data, tag, src                                         uint64
	srcValid                                               bool
}

// write puts e at the next position; wrongPhase leaves the ownership bits
// as the previous lap had them.
func (d *fakeDev) write(r rawEntry, wrongPhase bool) {
	n := uint32(d.l.Entries)
	pos := d.prod % n
	lap := d.prod / n
	esz := d.l.EntrySize
	if len(d.scratch) != esz {
		d.scratch = make([]byte, esz)
	}
	scratch := d.scratch
	copy(scratch, d.mem[int(pos)*esz:int(pos+1)*esz])
	f := d.l.Fields
	setField(scratch, f.ID, uint64(r.id))
	setField(scratch, f.Queue, uint64(r.queue))
	setField(scratch, f.Opcode, uint64(r.opcode))
	setField(scratch, f.Status, uint64(r.status))
	setField(scratch, f.Len, uint64(r.ln))
	setField(scratch, f.Flags, uint64(r.flags))
	setField(scratch, f.Syndrome, uint64(r.syndrome))
	setField(scratch, f.BufOff, uint64(r.bufOff))
	setField(scratch, f.Data, r.data)
	setField(scratch, f.Tag, r.tag)
	setField(scratch, f.Src, r.src)
	if r.srcValid {
		setField(scratch, f.SrcValid, 1)
	}
	own := ownValue(d.l, lap)
	if wrongPhase {
		own = ownValue(d.l, lap+1) // the value of the lap before (and after)
		if d.l.Convention == DescriptorDone {
			own = 0
		}
	}
	base := int(pos) * esz
	for i := 0; i < esz; i++ {
		if i >= d.l.OwnerOff && i < d.l.OwnerOff+4 {
			continue
		}
		d.mem[base+i] = scratch[i]
	}
	w := binary.LittleEndian.Uint32(scratch[d.l.OwnerOff:])
	w = w&^d.l.OwnerMask | own
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&d.mem[base+d.l.OwnerOff])), w)
	d.prod++
}

// simLayout mirrors cq/qpsim's 64-byte entry (cq may not import nic).
func simLayout(entries int) Layout {
	return Layout{
		Name: "test64", EntrySize: 64, Entries: entries, Convention: PhaseBit,
		OwnerOff: 60, OwnerMask: 1 << 31, InitPhase: 1, DetectHoles: true, Doorbell: DoorbellCount,
		Fields: Fields{
			ID: Field{Off: 0, Bits: 32}, Queue: Field{Off: 4, Bits: 16}, Opcode: Field{Off: 6, Bits: 8},
			Status: Field{Off: 7, Bits: 8}, Len: Field{Off: 8, Bits: 32}, Flags: Field{Off: 12, Bits: 8},
			Data: Field{Off: 16, Bits: 64}, Tag: Field{Off: 24, Bits: 64}, Src: Field{Off: 32, Bits: 64},
			SrcValid: Field{Off: 12, Shift: 4, Bits: 1}, Syndrome: Field{Off: 40, Bits: 32}, BufOff: Field{Off: 44, Bits: 32},
		},
	}
}

func simCodes() Codes {
	return Codes{
		Statuses: []Status{{0, 0, "OK"}, {1, cq.ETRUNC, "LOCAL_LEN_ERR"}, {2, cq.EFAULT, "LOCAL_PROT_ERR"},
			{3, cq.ECANCELED, "WR_FLUSH_ERR"}, {4, cq.EACCES, "REMOTE_ACCESS_ERR"}, {5, cq.EIO, "GENERAL_ERR"}},
		Opcodes: []Opcode{{0, cq.FlagSend, "SEND"}, {1, cq.FlagRecv, "RECV"}, {2, cq.FlagRMA | cq.FlagWrite, "WRITE"},
			{3, cq.FlagRMA | cq.FlagRead, "READ"}, {4, cq.FlagRMA | cq.FlagRemoteWrite | cq.FlagRemoteCQData, "RECV_RDMA_WITH_IMM"}},
		FlagBits: [8]cq.Flags{cq.FlagRemoteCQData, cq.FlagTagged, cq.FlagMultiRecv, cq.FlagMore},
	}
}

// baseKind is the kind of loop fp runs, a shape counted as the kind it
// refines.
func baseKind(fp *fastPath) int {
	for _, s := range loopShapes {
		if s.kind == fp.kind {
			return s.refines
		}
	}
	return fp.kind
}
