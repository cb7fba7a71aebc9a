package igb

import (
	"context"
	"encoding/binary"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/dma"
	"github.com/vfnic/vfnic/doorbell"
	"github.com/vfnic/vfnic/hugepage"
	"github.com/vfnic/vfnic/nic"
	"golang.org/x/sys/unix"
)

// fakeRegs is BAR0 in an anonymous mapping with the few side effects the
// bring-up depends on: CTRL.RST clears itself (as on QEMU's model, unless
// rstStuck), EIMS/EIMC set and clear the mask kept at EIMS. Data-path
// registers (tails) are read and written through the same memory.
type fakeRegs struct {
	w        doorbell.Window
	writes   map[uint32]int // how often each register was written
	reads    map[uint32]int // how often each was read through the control path
	rstStuck bool
	phy      [32]uint16
	resets   int            // CTRL writes with RST
	master   []masterChange // bus mastering turned on or off, in order
}

// masterChange is a change of the bus master bit and what the device
// held then.
type masterChange struct {
	on         bool
	resets     int    // resets the device had been through
	rctl, tctl uint32 // receive and transmit control
	eims       uint32 // extended interrupt mask
	rings      int    // ring base registers written
	queues     int    // queues (and their DMA memory) the driver had made
}

var testMAC = [6]byte{0x52, 0x54, 0x00, 0x12, 0x34, 0x56}

func newFakeRegs(t testing.TB) *fakeRegs {
	t.Helper()
	mem, err := unix.Mmap(-1, 0, bar0Size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	require.NoError(t, err)
	t.Cleanup(func() { _ = unix.Munmap(mem) })
	f := &fakeRegs{w: doorbell.NewWindow(mem), writes: map[uint32]int{}, reads: map[uint32]int{}}
	f.set(regRAL0, binary.LittleEndian.Uint32(testMAC[:4]))
	f.set(regRAH0, uint32(binary.LittleEndian.Uint16(testMAC[4:]))|rahAV)
	f.set(regSTATUS, statusLU|statusFD|statusSpeed1000)
	return f
}

func (f *fakeRegs) set(off, v uint32) { _ = f.w.Write32(uintptr(off), v) }
func (f *fakeRegs) get(off uint32) uint32 {
	v, _ := f.w.Read32(uintptr(off))
	return v
}

func (f *fakeRegs) read(off uint32) uint32 {
	f.reads[off]++
	return f.get(off)
}

func (f *fakeRegs) write(off, v uint32) {
	f.writes[off]++
	switch off {
	case regCTRL:
		if v&ctrlRST != 0 {
			f.resets++
		}
		if !f.rstStuck {
			v &^= ctrlRST
		}
	case regMDIC:
		reg := uint16(v >> mdicRegShift & 0x1f)
		switch {
		case v>>mdicPhyShift&0x1f != phyAddr:
			v |= mdicError
		case v&mdicOpRead != 0:
			v = v&^0xffff | uint32(f.phy[reg]) | mdicReady
		default:
			f.phy[reg] = uint16(v)
			v |= mdicReady
		}
	case regEIMS:
		v |= f.get(regEIMS)
	case regEIMC:
		f.set(regEIMS, f.get(regEIMS)&^v)
	}
	f.set(off, v)
}

// newFakeDevice brings a Device up on a fake register file, with DMA
// memory in an identity space (IOVA = address) of locked 4 KiB pages.
func newFakeDevice(t testing.TB, cfg Config) (*Device, *fakeRegs) {
	t.Helper()
	f := newFakeRegs(t)
	d, err := startFake(f, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	return d, f
}

func startFake(f *fakeRegs, cfg Config) (*Device, error) {
	cfg.Memory = hugepage.Options{PageSize: hugepage.Size4K}
	if err := normalize(&cfg); err != nil {
		return nil, err
	}
	d := &Device{name: "fake", mac: &macs[0], regs: f, win: f.w, space: dma.NewIdentitySpace(), nVectors: 10}
	d.busMaster = func(on bool) error {
		rings := 0
		for i := range 16 {
			rings += f.writes[rxReg(regRDBAL0, i)] + f.writes[txReg(regTDBAL0, i)]
		}
		f.master = append(f.master, masterChange{on: on, resets: f.resets, rctl: f.get(regRCTL), tctl: f.get(regTCTL),
			eims: f.get(regEIMS), rings: rings, queues: len(d.rx) + len(d.tx)})
		return nil
	}
	if err := d.start(context.Background(), cfg); err != nil {
		_ = d.core.Teardown(nic.ErrClosed, d.hw)
		return nil, err
	}
	return d, nil
}

// fakeNIC plays the device side of queue pair 0: it takes posted receive
// descriptors from head to the tail register and writes them back, and
// transmits posted frames, the way the 82576 does (DD written last).
type fakeNIC struct {
	t        testing.TB
	f        *fakeRegs
	rx, tx   *queue
	rdh, tdh uint32
	ctx      [2][2]uint32 // transmit contexts: vlan_macip_lens, type_tucmd_mlhl
}

func newFakeNIC(t testing.TB, d *Device, f *fakeRegs) *fakeNIC {
	return &fakeNIC{t: t, f: f, rx: &d.rx[0].queue, tx: &d.tx[0].queue}
}

func desc(q *queue, pos uint32) unsafe.Pointer {
	return unsafe.Pointer(&q.desc[uintptr(pos)*descSize])
}

// rxPosted is how many receive descriptors the driver handed over.
func (n *fakeNIC) rxPosted() uint32 {
	return (n.f.get(rxReg(regRDT0, 0)) + n.rx.n - n.rdh) % n.rx.n
}

// writeBack writes a receive write-back at position pos with the given
// status bits and length, DD (in status) last.
func (n *fakeNIC) writeBack(pos uint32, status uint32, length uint16) {
	p := desc(n.rx, pos)
	atomic.StoreUint32((*uint32)(p), 0)
	atomic.StoreUint32((*uint32)(unsafe.Add(p, 4)), 0)
	atomic.StoreUint32((*uint32)(unsafe.Add(p, 12)), uint32(length))
	atomic.StoreUint32((*uint32)(unsafe.Add(p, 8)), status)
}

// buf is the buffer at a device address, found through the queue's pool
// (the device would DMA there).
func (n *fakeNIC) buf(q *queue, iova uint64) []byte {
	p := q.pool // transmit
	if q.rx {
		p = q.bufs.Pool
	}
	i, err := p.Index(iova)
	require.NoError(n.t, err, "descriptor address %#x is not a buffer of %s", iova, q.Name)
	return p.Buf(i)
}

// receive delivers frame into the next posted buffer.
func (n *fakeNIC) receive(frame []byte) {
	require.NotZero(n.t, n.rxPosted(), "no receive descriptor posted")
	p := desc(n.rx, n.rdh)
	addr := atomic.LoadUint64((*uint64)(p))
	require.Zero(n.t, atomic.LoadUint64((*uint64)(unsafe.Add(p, 8))), "read format: hdr_addr 0")
	copy(n.buf(n.rx, addr), frame)
	n.writeBack(n.rdh, rxdStatusDD|rxdStatusEOP, uint16(len(frame)))
	n.rdh = (n.rdh + 1) % n.rx.n
}

// transmit sends every frame posted up to the tail register and returns
// them.
func (n *fakeNIC) transmit() [][]byte {
	var out [][]byte
	tdt := n.f.get(txReg(regTDT0, 0))
	for n.tdh != tdt {
		p := desc(n.tx, n.tdh)
		addr := atomic.LoadUint64((*uint64)(p))
		cmd := atomic.LoadUint32((*uint32)(unsafe.Add(p, 8)))
		require.Equal(n.t, uint32(txdDTypData|txdCmdDEXT|txdCmdIFCS|txdCmdEOP|txdCmdRS), cmd&^0xffff)
		l := cmd & 0xffff
		require.Equal(n.t, l<<txdPaylenSh, atomic.LoadUint32((*uint32)(unsafe.Add(p, 12))), "PAYLEN")
		out = append(out, append([]byte(nil), n.buf(n.tx, addr)[:l]...))
		atomic.StoreUint32((*uint32)(unsafe.Add(p, 12)), txdStatusDD)
		n.tdh = (n.tdh + 1) % n.tx.n
	}
	return out
}

// fill posts receive buffers until the ring is full, and flushes.
func fill(t testing.TB, q nic.RxQueue) int {
	n := 0
	for q.PostRecv(n) == nil {
		n++
	}
	require.NoError(t, q.Flush())
	return n
}

func ptrAdd(p unsafe.Pointer, off uintptr) unsafe.Pointer { return unsafe.Add(p, off) }
