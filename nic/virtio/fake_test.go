package virtio

import (
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/dma"
	"github.com/vfnic/vfnic/doorbell"
	"github.com/vfnic/vfnic/eventfd"
	"github.com/vfnic/vfnic/hugepage"
	"github.com/vfnic/vfnic/nic"
	"golang.org/x/sys/unix"
)

// rig is a queue's ring in locked 4 KiB pages of an identity DMA space
// (IOVA = virtual address), with a notify register in an anonymous page,
// and a software device that plays the other side of the ring the way
// the specification says a device does.
type rig struct {
	region *dma.Region
	mem    ringMem
	notify []byte
	v      *vq
	dev    *fakeDev
}

func newRig(t testing.TB, size int, packed, eventIdx bool, extra int) *rig {
	t.Helper()
	space := dma.NewIdentitySpace()
	t.Cleanup(func() { _ = space.Close() })
	a, b, c, al := ringSizes(size, packed)
	region, err := space.Alloc(a+b+c+3*al+extra, hugepage.Options{PageSize: hugepage.Size4K})
	require.NoError(t, err)
	mem, err := carveRing(region, size, packed)
	require.NoError(t, err)
	nm, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	require.NoError(t, err)
	t.Cleanup(func() { _ = unix.Munmap(nm) })
	reg, err := doorbell.NewWindow(nm).Reg16(0)
	require.NoError(t, err)
	v, err := newVQ("test", 3, size, packed, eventIdx, mem, reg)
	require.NoError(t, err)
	r := &rig{region: region, mem: mem, notify: nm, v: v}
	r.dev = &fakeDev{t: t, packed: packed, size: uint16(size), mem: mem, availWrap: true, usedWrap: true}
	return r
}

// notified returns the value last written to the notify register.
func (r *rig) notified() uint16 { return *(*uint16)(unsafe.Pointer(&r.notify[0])) }

func (r *rig) rxQueue(t testing.TB, nbuf, bufSize int, mrg bool) *RxQueue {
	t.Helper()
	pool, err := dma.NewPool(r.region, nbuf, bufSize)
	require.NoError(t, err)
	efd, err := eventfd.New()
	require.NoError(t, err)
	t.Cleanup(func() { _ = efd.Close() })
	q, err := newRxQueue(r.v, 0, efd, pool, mrg)
	require.NoError(t, err)
	return q
}

func (r *rig) txQueue(t testing.TB, mtu int) *TxQueue {
	t.Helper()
	pool, err := dma.NewPool(r.region, int(r.v.size), align(netHdrLen+1514, 64))
	require.NoError(t, err)
	efd, err := eventfd.New()
	require.NoError(t, err)
	t.Cleanup(func() { _ = efd.Close() })
	q, err := newTxQueue(r.v, 0, efd, pool, mtu)
	require.NoError(t, err)
	return q
}

// fakeDev is the device side of a ring: it takes available buffers in ring
// order and writes used entries, in any order the test asks for.
type fakeDev struct {
	t      testing.TB
	packed bool
	size   uint16
	mem    ringMem

	// packed
	availPos, usedPos   uint16
	availWrap, usedWrap bool
	// split
	lastAvail, usedIdx uint16
	usedFlags          uint16

	// segs backs the segment lists take returns, reused round robin so
	// the device allocates nothing (tests hold fewer than 256 at a time).
	segs [256][4]seg
	nseg int
}

// segList returns an empty segment list backed by the device's arrays.
func (f *fakeDev) segList() []seg {
	f.nseg++
	return f.segs[f.nseg%len(f.segs)][:0]
}

// taken is one available buffer as the device read it.
type taken struct {
	id    uint16
	segs  []seg
	ndesc int
}

// data returns the bytes of segment i (identity IOVA).
func (tk taken) data(i int) []byte {
	addr := uintptr(tk.segs[i].addr)
	// The identity space's IOVA is the address of mapped (non-Go) memory.
	return unsafe.Slice(*(**byte)(unsafe.Pointer(&addr)), tk.segs[i].len)
}

func (f *fakeDev) desc(i uint16) unsafe.Pointer {
	return unsafe.Add(unsafe.Pointer(&f.mem.desc[0]), uintptr(i)*descSize)
}

// take reads the next available buffer; ok is false when there is none.
func (f *fakeDev) take() (taken, bool) {
	if f.packed {
		p := f.desc(f.availPos)
		w := atomic.LoadUint32((*uint32)(unsafe.Add(p, 12)))
		fl := uint16(w >> 16)
		if (fl&descAvail != 0) != f.availWrap || (fl&descUsed != 0) == f.availWrap {
			return taken{}, false
		}
		tk := taken{segs: f.segList()}
		for {
			p := f.desc(f.availPos)
			w := atomic.LoadUint32((*uint32)(unsafe.Add(p, 12)))
			fl := uint16(w >> 16)
			tk.segs = append(tk.segs, seg{addr: *(*uint64)(p), len: *(*uint32)(unsafe.Add(p, 8)), flags: fl & descWrite})
			tk.id = uint16(w)
			tk.ndesc++
			if f.availPos++; f.availPos == f.size {
				f.availPos = 0
				f.availWrap = !f.availWrap
			}
			if fl&descNext == 0 {
				return tk, true
			}
		}
	}
	idx := uint16(atomic.LoadUint32((*uint32)(unsafe.Pointer(&f.mem.driver[0]))) >> 16)
	if idx == f.lastAvail {
		return taken{}, false
	}
	id := *(*uint16)(unsafe.Pointer(&f.mem.driver[4+2*int(f.lastAvail&(f.size-1))]))
	f.lastAvail++
	tk := taken{id: id, segs: f.segList()}
	d := id
	for {
		p := f.desc(d)
		fl := *(*uint16)(unsafe.Add(p, 12))
		tk.segs = append(tk.segs, seg{addr: *(*uint64)(p), len: *(*uint32)(unsafe.Add(p, 8)), flags: fl & descWrite})
		tk.ndesc++
		if fl&descNext == 0 {
			return tk, true
		}
		d = *(*uint16)(unsafe.Add(p, 14))
	}
}

// takeN takes the next n available buffers; fewer fails the test.
func (f *fakeDev) takeN(n int) []taken {
	f.t.Helper()
	tk := make([]taken, n)
	for i := range tk {
		var ok bool
		tk[i], ok = f.take()
		require.True(f.t, ok, "available buffer %d of %d", i+1, n)
	}
	return tk
}

// sendAll has the device send every buffer a transmit queue made
// available (taken and completed) and reads the queue's completions into
// comps. It allocates nothing, for the no-allocation tests.
func (f *fakeDev) sendAll(tx nic.Queue, comps []nic.Completion) {
	for {
		tk, ok := f.take()
		if !ok {
			break
		}
		f.complete(tk.id, 0, tk.ndesc)
	}
	for tx.Poll(comps) > 0 {
	}
}

// complete writes a used entry for buffer id with written bytes; ndesc is
// how far a packed ring's used position skips.
func (f *fakeDev) complete(id uint16, written uint32, ndesc int) {
	if f.packed {
		f.writeUsed(f.usedPos, id, written, f.usedWrap, f.usedWrap)
		f.usedPos += uint16(ndesc)
		if f.usedPos >= f.size {
			f.usedPos -= f.size
			f.usedWrap = !f.usedWrap
		}
		return
	}
	e := unsafe.Pointer(&f.mem.device[4+8*int(f.usedIdx&(f.size-1))])
	*(*uint32)(e) = uint32(id)
	*(*uint32)(unsafe.Add(e, 4)) = written
	f.usedIdx++
	f.publishUsed()
}

// writeUsed writes a packed descriptor at pos with the given ownership bits.
func (f *fakeDev) writeUsed(pos, id uint16, length uint32, avail, used bool) {
	p := f.desc(pos)
	*(*uint32)(unsafe.Add(p, 8)) = length
	fl := uint16(descWrite)
	if avail {
		fl |= descAvail
	}
	if used {
		fl |= descUsed
	}
	atomic.StoreUint32((*uint32)(unsafe.Add(p, 12)), uint32(id)|uint32(fl)<<16)
}

// publishUsed stores the split ring's used flags and index.
func (f *fakeDev) publishUsed() {
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&f.mem.device[0])), uint32(f.usedFlags)|uint32(f.usedIdx)<<16)
}

// setDeviceEvent sets the packed ring's device event suppression.
func (f *fakeDev) setDeviceEvent(flags uint16, off uint16, wrap bool) {
	v := uint32(off) | uint32(flags)<<16
	if wrap {
		v |= 1 << 15
	}
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&f.mem.device[0])), v)
}

// setAvailEvent sets the split ring's avail_event.
func (f *fakeDev) setAvailEvent(v uint16) {
	n := len(f.mem.device)
	*(*uint16)(unsafe.Pointer(&f.mem.device[n-4])) = v
}

// driverEvent reads the packed ring's driver event suppression word.
func (f *fakeDev) driverEvent() (flags, off uint16, wrap bool) {
	w := atomic.LoadUint32((*uint32)(unsafe.Pointer(&f.mem.driver[0])))
	return uint16(w >> 16), uint16(w) & 0x7fff, uint16(w)>>15 != 0
}

// usedEvent reads the split ring's used_event.
func (f *fakeDev) usedEvent() uint16 {
	n := len(f.mem.driver)
	return *(*uint16)(unsafe.Pointer(&f.mem.driver[n-4]))
}

// availFlags reads the split ring's avail flags.
func (f *fakeDev) availFlags() uint16 {
	return uint16(atomic.LoadUint32((*uint32)(unsafe.Pointer(&f.mem.driver[0]))))
}
