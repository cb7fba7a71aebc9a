package afxdp

import (
	"errors"
	"fmt"
	"math/bits"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/vfnic/vfnic/dma"
	"github.com/vfnic/vfnic/doorbell"
	"github.com/vfnic/vfnic/eventfd"
	"github.com/vfnic/vfnic/hugepage"
	"github.com/vfnic/vfnic/nic"
	"golang.org/x/sys/unix"
)

// BindRetry is how long Open retries binding a queue that the kernel says
// is busy: it releases the socket of a previous user asynchronously, a
// moment after that socket's close.
var BindRetry = 2 * time.Second

// ring is one of a socket's four rings as mapped: its producer, consumer
// and flags words and its entries.
type ring struct {
	m     []byte // the mapping
	prod  *uint32
	cons  *uint32
	flags *uint32
	desc  []byte
	n     uint32
	mask  uint32
	// Driver-produced rings (fill, transmit): the next producer index,
	// published by publish.
	next uint32
}

// mapRing maps the ring of n entries of esz bytes at page offset pgoff of
// socket fd, laid out at off.
func mapRing(fd int, off unix.XDPRingOffset, pgoff int64, n, esz int, name string) (ring, error) {
	size := int(off.Desc) + n*esz
	m, err := unix.Mmap(fd, pgoff, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return ring{}, fmt.Errorf("afxdp: mmap %s ring: %w", name, err)
	}
	for _, o := range []uint64{off.Producer, off.Consumer, off.Flags} {
		if o%4 != 0 || o+4 > uint64(len(m)) {
			_ = unix.Munmap(m)
			return ring{}, fmt.Errorf("afxdp: %s ring: kernel offset %d outside the %d-byte mapping", name, o, len(m))
		}
	}
	p := unsafe.Pointer(&m[0])
	return ring{m: m, prod: (*uint32)(unsafe.Add(p, off.Producer)), cons: (*uint32)(unsafe.Add(p, off.Consumer)),
		flags: (*uint32)(unsafe.Add(p, off.Flags)), desc: m[off.Desc : off.Desc+uint64(n*esz)],
		n: uint32(n), mask: uint32(n - 1)}, nil
}

// word returns the ring's word at off inside the mapping as a register,
// for the ring reader (producer index, consumer doorbell).
func (r *ring) word(p *uint32) doorbell.Reg32 {
	off := uintptr(unsafe.Pointer(p)) - uintptr(unsafe.Pointer(&r.m[0]))
	reg, _ := doorbell.NewWindow(r.m).Reg32(off) // mapRing checked off
	return reg
}

// publish makes the entries produced so far visible to the kernel (a
// release store: the entries were written before).
func (r *ring) publish() { atomic.StoreUint32(r.prod, r.next) }

// needWakeup reports whether the kernel asked for a system call to go on
// with this ring (XDP_RING_NEED_WAKEUP).
func (r *ring) needWakeup() bool { return atomic.LoadUint32(r.flags)&unix.XDP_RING_NEED_WAKEUP != 0 }

// putAddr produces a fill ring entry.
func (r *ring) putAddr(addr uint64) {
	*(*uint64)(unsafe.Pointer(&r.desc[(r.next&r.mask)*addrSize])) = addr
	r.next++
}

// putDesc produces a transmit ring entry.
func (r *ring) putDesc(addr uint64, length uint32) {
	d := (*unix.XDPDesc)(unsafe.Pointer(&r.desc[(r.next&r.mask)*descSize]))
	*d = unix.XDPDesc{Addr: addr, Len: length}
	r.next++
}

func (r *ring) unmap() error {
	if r.m == nil {
		return nil
	}
	err := unix.Munmap(r.m)
	r.m = nil
	return err
}

// xsk is one AF_XDP socket with its UMEM and rings: a queue pair's.
type xsk struct {
	fd    int
	space *dma.Space
	umem  *dma.Region
	// mem is umem's bytes, kept so that Send does not take the region's
	// lock per frame; the queue lock and its closed check keep it valid.
	mem   []byte
	chunk int // chunk size, a power of two
	shift int // log2(chunk)
	fill  ring
	comp  ring
	rx    ring
	tx    ring
	zc    bool
	irq   *eventfd.FD // the socket's read readiness
	// wirq is the socket's write readiness, the transmit queue's
	// interrupt in copy mode (nil in zero-copy mode): the kernel raises
	// it as it frees each sent skb, after writing the send's completion
	// (xsk_destruct_skb, then sock_wfree's write-space wake-up).
	wirq    *eventfd.FD
	ifindex int
	queue   int
}

// xskConfig is what a socket is made with.
type xskConfig struct {
	ifname         string
	ifindex, queue int
	size           int // entries of each ring, a power of two
	txBufs         int // chunks for sends (the transmit ring's size)
	rxBufs         int // chunks for receives
	chunk          int
}

// newXSK makes the socket of one queue pair, its UMEM and rings, bound to
// the interface's queue. On error everything made is released.
func newXSK(c xskConfig) (x *xsk, err error) {
	fd, err := unix.Socket(unix.AF_XDP, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	switch {
	case errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES):
		return nil, fmt.Errorf("%w: AF_XDP socket: %w", ErrPermission, err)
	case errors.Is(err, unix.EAFNOSUPPORT):
		return nil, fmt.Errorf("%w: this kernel has no AF_XDP sockets (CONFIG_XDP_SOCKETS): %w", nic.ErrNotSupported, err)
	case err != nil:
		return nil, fmt.Errorf("afxdp: AF_XDP socket: %w", err)
	}
	x = &xsk{fd: fd, chunk: c.chunk, shift: bits.TrailingZeros(uint(c.chunk)), ifindex: c.ifindex, queue: c.queue}
	defer func() {
		if err != nil {
			_ = x.close()
			x = nil
		}
	}()
	// The UMEM: memory of ours, locked, outside the Go heap.
	x.space = dma.NewIdentitySpace()
	chunks := c.txBufs + c.rxBufs
	if x.umem, err = x.space.Alloc(chunks*c.chunk, hugepage.Options{PageSize: hugepage.Size4K}); err != nil {
		return x, fmt.Errorf("afxdp: UMEM of %d chunks: %w", chunks, err)
	}
	b := x.umem.Bytes()
	x.mem = b
	reg := unix.XDPUmemReg{Addr: uint64(uintptr(unsafe.Pointer(&b[0]))), Len: uint64(len(b)), Size: uint32(c.chunk)}
	if err := setsockopt(fd, unix.XDP_UMEM_REG, unsafe.Pointer(&reg), unsafe.Sizeof(reg)); err != nil {
		return x, fmt.Errorf("afxdp: register UMEM: %w", err)
	}
	for _, o := range []struct {
		opt  int
		name string
	}{{unix.XDP_UMEM_FILL_RING, "fill"}, {unix.XDP_UMEM_COMPLETION_RING, "completion"}, {unix.XDP_RX_RING, "receive"}, {unix.XDP_TX_RING, "transmit"}} {
		if err := unix.SetsockoptInt(fd, unix.SOL_XDP, o.opt, c.size); err != nil {
			return x, fmt.Errorf("afxdp: %s ring of %d entries: %w", o.name, c.size, err)
		}
	}
	var off unix.XDPMmapOffsets
	if err := getsockopt(fd, unix.XDP_MMAP_OFFSETS, unsafe.Pointer(&off), unsafe.Sizeof(off)); err != nil {
		return x, fmt.Errorf("afxdp: ring offsets: %w", err)
	}
	if x.fill, err = mapRing(fd, off.Fr, unix.XDP_UMEM_PGOFF_FILL_RING, c.size, addrSize, "fill"); err != nil {
		return x, err
	}
	if x.comp, err = mapRing(fd, off.Cr, unix.XDP_UMEM_PGOFF_COMPLETION_RING, c.size, addrSize, "completion"); err != nil {
		return x, err
	}
	if x.rx, err = mapRing(fd, off.Rx, unix.XDP_PGOFF_RX_RING, c.size, descSize, "receive"); err != nil {
		return x, err
	}
	if x.tx, err = mapRing(fd, off.Tx, unix.XDP_PGOFF_TX_RING, c.size, descSize, "transmit"); err != nil {
		return x, err
	}
	if err := x.bind(c.ifname); err != nil {
		return x, err
	}
	if x.irq, err = eventfd.Readable(fd); err != nil {
		return x, err
	}
	if !x.zc {
		if x.wirq, err = eventfd.Writable(fd); err != nil {
			return x, err
		}
	}
	return x, nil
}

// bind binds the socket to its queue: zero-copy when the driver offers
// it, else copy mode; a busy queue is retried for BindRetry.
func (x *xsk) bind(ifname string) error {
	flags := uint16(unix.XDP_USE_NEED_WAKEUP | unix.XDP_ZEROCOPY)
	deadline := time.Now().Add(BindRetry)
	for {
		err := unix.Bind(x.fd, &unix.SockaddrXDP{Flags: flags, Ifindex: uint32(x.ifindex), QueueID: uint32(x.queue)})
		switch {
		case err == nil:
			x.zc = flags&unix.XDP_ZEROCOPY != 0
			return nil
		case flags&unix.XDP_ZEROCOPY != 0 && (errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EPROTONOSUPPORT)):
			flags = unix.XDP_USE_NEED_WAKEUP | unix.XDP_COPY // the driver refused zero-copy
			continue
		case errors.Is(err, unix.EBUSY) && time.Now().Before(deadline):
			time.Sleep(10 * time.Millisecond)
			continue
		case errors.Is(err, unix.EBUSY):
			return fmt.Errorf("%w: %s queue %d: still bound after %v (another AF_XDP socket, or one closed just before that the kernel has not released): %w",
				ErrBusy, ifname, x.queue, BindRetry, err)
		case errors.Is(err, unix.EINVAL):
			return fmt.Errorf("afxdp: bind to %s queue %d: %w (no such queue?)", ifname, x.queue, err)
		}
		return fmt.Errorf("afxdp: bind to %s queue %d: %w", ifname, x.queue, err)
	}
}

// kick asks the kernel to go on with the rings: send what the transmit
// ring holds, take fill ring entries. Transient refusals (the kernel busy
// or out of buffers, the link down) are not errors: the next kick retries.
//
// A raw system call: it never blocks (MSG_DONTWAIT), and in copy mode it
// sends up to a budget of frames, which takes tens of microseconds; as an
// ordinary system call that is long enough for the runtime's sysmon to
// take the caller's P each time (handoff, a thread woken, the P won back
// on return), which cost a polling core a large share of its CPU.
func (x *xsk) kick() error {
	var err error
	if _, _, e := unix.RawSyscall6(unix.SYS_SENDTO, uintptr(x.fd), 0, 0, unix.MSG_DONTWAIT, 0, 0); e != 0 {
		err = e
	}
	switch {
	case err == nil, errors.Is(err, unix.EAGAIN), errors.Is(err, unix.EBUSY), errors.Is(err, unix.ENOBUFS), errors.Is(err, unix.ENETDOWN):
		return nil
	}
	return fmt.Errorf("afxdp: kick queue %d: %w", x.queue, err)
}

// kickFill wakes the kernel for the fill ring (zero-copy drivers ask).
func (x *xsk) kickFill() error {
	_, _, err := unix.Recvfrom(x.fd, nil, unix.MSG_DONTWAIT)
	switch {
	case err == nil, errors.Is(err, unix.EAGAIN), errors.Is(err, unix.EBUSY), errors.Is(err, unix.ENOBUFS), errors.Is(err, unix.ENETDOWN):
		return nil
	}
	return fmt.Errorf("afxdp: wake queue %d for its fill ring: %w", x.queue, err)
}

// close releases the socket, its rings and UMEM, in that order: the
// kernel stops using the UMEM when the socket goes.
func (x *xsk) close() error {
	var errs []error
	for _, e := range []*eventfd.FD{x.irq, x.wirq} {
		if e != nil {
			errs = append(errs, e.Close())
		}
	}
	for _, r := range []*ring{&x.fill, &x.comp, &x.rx, &x.tx} {
		errs = append(errs, r.unmap())
	}
	if x.fd >= 0 {
		errs = append(errs, unix.Close(x.fd))
		x.fd = -1
	}
	if x.space != nil {
		x.mem = nil
		errs = append(errs, x.space.Close())
	}
	return errors.Join(errs...)
}

func setsockopt(fd, opt int, p unsafe.Pointer, n uintptr) error {
	_, _, e := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), unix.SOL_XDP, uintptr(opt), uintptr(p), n, 0)
	if e != 0 {
		return e
	}
	return nil
}

func getsockopt(fd, opt int, p unsafe.Pointer, n uintptr) error {
	l := uint32(n)
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_XDP, uintptr(opt), uintptr(p), uintptr(unsafe.Pointer(&l)), 0)
	if e != 0 {
		return e
	}
	if uintptr(l) != n {
		return fmt.Errorf("kernel answered %d bytes, want %d", l, n)
	}
	return nil
}

// uintptrOf is the address of b's first byte.
func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }
