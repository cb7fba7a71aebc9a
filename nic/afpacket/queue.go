package afpacket

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/vfnic/vfnic/cq"
	cqring "github.com/vfnic/vfnic/cq/ring"
	"github.com/vfnic/vfnic/dma"
	"github.com/vfnic/vfnic/doorbell"
	"github.com/vfnic/vfnic/nic"
	qcore "github.com/vfnic/vfnic/nic/internal/queue"
	"github.com/vfnic/vfnic/nic/internal/rxbuf"
	"golang.org/x/sys/unix"
)

// Where the kernel puts things in a TPACKET_V2 slot.
const (
	// hdrLen is struct tpacket2_hdr's size: a frame starts no closer to
	// its slot's start.
	hdrLen = 32
	// frameOff is where the kernel puts an Ethernet frame in its slot on
	// a SOCK_RAW socket (tp_mac): TPACKET_ALIGN(tpacket2_hdr and
	// sockaddr_ll, 52 bytes, plus 16) less the 14-byte header. A frame
	// elsewhere is moved here, so that every lent frame starts at the
	// same place (the buffer pool's headroom).
	frameOff = 66
	// vlanLen is the length of the VLAN tag put back into a frame.
	vlanLen = 4
)

// RxLayout describes a TPACKET_V2 receive ring of n slots of size bytes
// as cq/ring reads it: the slot's position is its id; tp_status (the
// first word) carries TP_STATUS_USER when the kernel has written a frame,
// cleared and replaced by Held when the reader consumes it; Len is
// tp_snaplen and BufOff tp_mac (the frame's offset in the slot: the
// reader checks that the frame lies inside the slot); Meta[0] is tp_len
// (the frame's length on the wire) and Meta[1] tp_vlan_tci with
// tp_vlan_tpid above it (the tag the kernel took out of the frame).
func RxLayout(n, size int) cqring.Layout {
	return cqring.Layout{Name: "tpacket-v2", EntrySize: size, Entries: n,
		Convention: cqring.DescriptorDone, OwnerOff: 0, OwnerMask: unix.TP_STATUS_USER, Held: held, IDIsIndex: true,
		Fields: cqring.Fields{
			Len:    cqring.Field{Off: 8, Bits: 32},
			BufOff: cqring.Field{Off: 12, Bits: 16},
			Meta:   [2]cqring.Field{{Off: 4, Bits: 32}, {Off: 24, Bits: 32}},
		}}
}

// TxLayout describes the completion ring a transmit queue writes for
// itself as sendmmsg takes its frames: entries of the posting's id, the
// frame's length and the errno of a frame the kernel refused (Meta[0]; 0
// when sent), behind a free-running producer index.
func TxLayout(n int) cqring.Layout {
	return cqring.Layout{Name: "afpacket-sent", EntrySize: 8, Entries: n,
		Convention: cqring.UsedIndex, IndexBits: 32,
		Fields: cqring.Fields{ID: cqring.Field{Off: 0, Bits: 32}, Len: cqring.Field{Off: 4, Bits: 16},
			Meta: [2]cqring.Field{{Off: 6, Bits: 16}}}}
}

// queue is what receive and transmit queues share: the core's queue
// (lock, closed state, the CQ fed, counters, Poll, the CQ's reader, what
// a close owes) over a ring read by cq/ring, and the socket.
type queue struct {
	qcore.Queue
	s *sock
	// sr reads the queue's ring; sr.Out counts the postings not
	// completed.
	sr qcore.SourceRing
}

// init makes the reader over mem with layout l and a table of n slots,
// and gives the core the queue's ring.
func (q *queue) init(rd qcore.Ring, mem []byte, regs cqring.RingRegs, l cqring.Layout, n int, bufs *rxbuf.Pool) error {
	var err error
	if q.sr, err = qcore.NewSourceRing(cqring.RingConfig{Mem: mem, Layout: l, Regs: regs}, n); err != nil {
		return err
	}
	q.Queue.Init(rd, n, bufs)
	return nil
}

// reader is a queue's qcore.Ring: the parts receive and transmit share.
// The core calls it locked.
type reader struct {
	*qcore.SourceRing
	q *queue
}

// Broken implements qcore.Ring: neither ring can lose step (the kernel
// writes a slot only when it is posted; the transmit ring is the
// queue's own).
func (r reader) Broken() bool { return false }

// Arm implements qcore.Ring.
func (r reader) Arm(threshold int) (late, ok bool) { return r.q.ArmReadiness() }

// RxQueue is a receive queue: a TPACKET_V2 ring (nic.RxQueue). Buffer b
// is slot b, and the slot of its posting in the table.
type RxQueue struct {
	queue
	qcore.Rx
	bufs rxbuf.Pool
	size int // slot size
}

var _ nic.RxQueue = (*RxQueue)(nil)

func newRxQueue(s *sock, pair int, name string, n, size int) (*RxQueue, error) {
	p, err := dma.NewPoolOver(s.ring, n, size)
	if err != nil {
		return nil, fmt.Errorf("%w: afpacket: %v", nic.ErrInvalid, err)
	}
	q := &RxQueue{bufs: rxbuf.New(p, frameOff), size: size}
	q.s = s
	q.Name, q.Pair, q.Vector, q.EFD, q.QNum, q.Driver = "rx-"+name, pair, -1, s.irq, uint32(2*pair), "afpacket"
	q.Lasting = true // readable while the caller holds the last frame (packet_poll)
	if err := q.init(rxReader{reader{&q.sr, &q.queue}, q}, s.ring, cqring.RingRegs{}, RxLayout(n, size), n, &q.bufs); err != nil {
		return nil, err
	}
	q.Rx = qcore.NewRx(&q.Queue, rxPoster{q}, size-frameOff)
	return q, nil
}

// status is slot i's tp_status word.
func (q *RxQueue) status(i uint32) *uint32 {
	return (*uint32)(unsafe.Pointer(&q.s.ring[int(i)*q.size]))
}

// rxPoster is a receive queue's qcore.RxPoster.
type rxPoster struct{ q *RxQueue }

// Room implements qcore.RxPoster.
func (p rxPoster) Room(held int) bool { return p.q.sr.Out+held < len(p.q.s.ring)/p.q.size }

// PostBuf implements qcore.RxPoster: slot b becomes the kernel's (zero in
// its status word) once the table holds the posting.
func (p rxPoster) PostBuf(b uint32, ctx any) error {
	q := p.q
	op := cqring.Op{Context: ctx, Buf: q.bufs.Start(b), Len: q.size, Flags: cq.FlagRecv | cq.FlagMsg, Word: q.Word(0)}
	if _, err := q.sr.Tab.PostSlot(b, op); err != nil {
		return qcore.ErrNoDesc // not reachable: a buffer not posted has its slot free
	}
	q.sr.Out++
	atomic.StoreUint32(q.status(b), 0) // release: the kernel's from now on
	return nil
}

// rxReader is a receive queue's qcore.Ring.
type rxReader struct {
	reader
	rx *RxQueue
}

// Read implements qcore.Ring: the ring reader takes each slot (its
// status, loaded first, then one copy of its header, and checks that the
// frame lies inside the slot), then its fields are checked from that
// copy: the frame starts after the kernel's header, is whole (tp_len is
// the snap length) and holds an Ethernet header. A VLAN tag the kernel
// took out of the frame (tp_vlan_tpid not zero: the kernel sets it with
// TP_STATUS_VLAN_VALID and TP_STATUS_VLAN_TPID_VALID) is put back after
// the MAC addresses, the rest of the frame moved 4 bytes on inside the
// slot, so that the caller gets the frame as it was on the wire. A good
// frame's Buf is its first byte, frameOff into the slot.
func (r rxReader) Read(cs []cqring.Completion) int {
	q := r.rx
	n := r.Take(cs)
	for i := range cs[:n] {
		c := &cs[i]
		start := q.bufs.Start(c.ID)
		if c.Err != 0 {
			if c.Done {
				c.Buf = start // recycled by the core
			}
			continue
		}
		mac, wire, tag := int(c.Buf-start), c.Meta[0], c.Meta[1]
		tpid, tci := uint16(tag>>16), uint16(tag)
		extra := 0
		if tpid != 0 {
			extra = vlanLen
		}
		switch {
		case mac < hdrLen:
			c.Err, c.Prov = cq.EIO, cq.ProvBadLen
		case wire != uint64(c.Len):
			c.Err, c.Prov = cq.ETRUNC, cq.ProvMultiBuffer // longer than the slot holds
		case c.Len < nic.MinFrame:
			c.Err, c.Prov = cq.EIO, cq.ProvBadLen
		case frameOff+c.Len+extra > q.size:
			c.Err, c.Prov = cq.ETRUNC, cq.ProvMultiBuffer // no room to put the tag back
		default:
			slot := q.bufs.Buf(c.ID)
			if mac != frameOff {
				copy(slot[frameOff:], slot[mac:mac+c.Len])
			}
			if tpid != 0 {
				f := slot[frameOff : frameOff+c.Len+vlanLen]
				copy(f[12+vlanLen:], f[12:c.Len])
				binary.BigEndian.PutUint16(f[12:], tpid)
				binary.BigEndian.PutUint16(f[14:], tci)
				c.Len += vlanLen
			}
			c.Buf = start + frameOff
			continue
		}
		c.Buf = start
	}
	return n
}

// Notify implements qcore.Ring: posting hands a slot over at once.
func (r rxReader) Notify() (rang, suppressed bool) { return false, false }

// TxQueue is a transmit queue (nic.TxQueue): frames wait in the queue's
// own buffers until Flush sends them with one sendmmsg(2); the queue then
// writes a completion for each frame the kernel took into its own ring,
// read by cq/ring as the kernel's rings are.
type TxQueue struct {
	queue
	maxFrame int
	bufs     [][]byte // the frame of each table slot
	// free holds the slots not posted: a send takes the one sent last,
	// whose buffer the kernel's copy just read (a cache-warm buffer).
	free  qcore.FreeSlots
	lens  []int
	order []uint32 // table slots in posting order, a ring
	msgs  []unix.Mmsghdr
	iovs  []unix.Iovec
	comp  []byte // the completion ring: entries, then the producer index
	prod  *uint32
	// sent and tail count postings (free-running): those before sent
	// went out, those from sent to tail wait for sendmmsg.
	sent, tail uint32
}

var _ nic.TxQueue = (*TxQueue)(nil)

func newTxQueue(s *sock, pair int, name string, n, maxFrame int) (*TxQueue, error) {
	q := &TxQueue{maxFrame: maxFrame, bufs: make([][]byte, n), free: qcore.NewFreeSlots(n), lens: make([]int, n), order: make([]uint32, n),
		msgs: make([]unix.Mmsghdr, n), iovs: make([]unix.Iovec, n), comp: make([]byte, 8*n+64)}
	q.s = s
	q.Name, q.Pair, q.Vector, q.EFD, q.QNum, q.Driver = "tx-"+name, pair, -1, s.irq, uint32(2*pair+1), "afpacket"
	q.Lasting = true // the socket's readiness is its receive ring's
	mem := make([]byte, n*maxFrame)
	for i := range q.bufs {
		q.bufs[i] = mem[i*maxFrame : (i+1)*maxFrame : (i+1)*maxFrame]
	}
	win := doorbell.NewWindow(q.comp)
	prod, err := win.Reg32(uintptr(8 * n))
	if err != nil {
		return nil, err
	}
	q.prod = (*uint32)(unsafe.Pointer(&q.comp[8*n]))
	if err := q.init(txReader{reader{&q.sr, &q.queue}, q}, q.comp[:8*n], cqring.RingRegs{Producer: prod}, TxLayout(n), n, nil); err != nil {
		return nil, err
	}
	return q, nil
}

// MaxFrame implements nic.TxQueue.
func (q *TxQueue) MaxFrame() int { return q.maxFrame }

// Send implements nic.TxQueue.
func (q *TxQueue) Send(frame []byte, ctx any) error { return q.enqueue(len(frame), ctx, frame, nil) }

// SendFunc implements nic.TxQueue: fill writes into the frame buffer of
// the posting's slot, which sendmmsg(2) hands to the kernel at Flush.
func (q *TxQueue) SendFunc(n int, ctx any, fill func([]byte)) error {
	return qcore.SendFunc(q.enqueue, n, ctx, fill)
}

// SendBurst implements nic.TxQueue: one lock for the burst, whose
// frames Flush hands to the kernel as Send's.
func (q *TxQueue) SendBurst(frames [][]byte, ctxs []any) (int, error) {
	return q.BurstVia(frames, ctxs, q.maxFrame, q.post)
}

// enqueue posts an n-byte frame, copied from frame or written by fill.
func (q *TxQueue) enqueue(n int, ctx any, frame []byte, fill func([]byte)) error {
	if err := q.LockSend(n, q.maxFrame); err != nil {
		return err
	}
	defer q.Mu.Unlock()
	return q.post(n, ctx, frame, fill)
}

// post is enqueue's qcore.Post: the frame into the buffer of a free slot,
// the slot into the order the next Flush sends in.
func (q *TxQueue) post(n int, ctx any, frame []byte, fill func([]byte)) error {
	id, err := q.free.Post(q.sr.Tab, cqring.Op{Context: ctx, Len: n, Flags: cq.FlagSend | cq.FlagMsg, Word: q.Word(0)})
	if err != nil {
		return err
	}
	qcore.Write(q.bufs[id][:n:n], frame, fill)
	q.lens[id] = n
	q.order[q.tail%uint32(len(q.order))] = id
	q.tail++
	q.sr.Out++
	return nil
}

// WaitInterrupt implements nic.Queue: at once while sends are owed (they
// complete at the next Flush or Poll, with no event), else the socket's
// readiness.
func (q *TxQueue) WaitInterrupt(ctx context.Context, deadline time.Time) error {
	q.Mu.Lock()
	owed := q.sr.Out > 0 && !q.Closed
	q.Mu.Unlock()
	if owed {
		return nil
	}
	return q.Queue.WaitInterrupt(ctx, deadline)
}

// SRead implements nic.Queue, sleeping in the transmit queue's own
// WaitInterrupt.
func (q *TxQueue) SRead(ctx context.Context, out []nic.Completion, threshold int, timeout time.Duration) (int, error) {
	if q.Bound() {
		return 0, q.ErrBound()
	}
	return nic.SRead(ctx, q, out, threshold, timeout)
}

// send hands the frames waiting to the kernel: one sendmmsg (two when
// they wrap around the order ring), then a completion for each frame it
// took. A busy socket (EAGAIN, ENOBUFS) keeps them for the next Flush or
// Poll. Called locked.
func (q *TxQueue) send() {
	n := uint32(len(q.order))
	for q.sent != q.tail {
		first := q.sent % n
		k := min(q.tail-q.sent, n-first)
		for j := range k {
			id := q.order[first+j]
			q.iovs[first+j] = unix.Iovec{Base: &q.bufs[id][0]}
			q.iovs[first+j].SetLen(q.lens[id])
			q.msgs[first+j] = unix.Mmsghdr{}
			q.msgs[first+j].Hdr.Iov = &q.iovs[first+j]
			q.msgs[first+j].Hdr.SetIovlen(1)
		}
		// A raw system call: it never blocks (MSG_DONTWAIT), and one
		// that takes tens of microseconds as an ordinary system call lets
		// the runtime's sysmon take the polling core's P each time.
		r, _, e := unix.RawSyscall6(unix.SYS_SENDMMSG, uintptr(q.s.fd), uintptr(unsafe.Pointer(&q.msgs[first])), uintptr(k), unix.MSG_DONTWAIT, 0, 0)
		q.Notifies.Add(1)
		if e != 0 {
			if e == unix.EAGAIN || e == unix.ENOBUFS || e == unix.EINTR {
				return
			}
			// The kernel refused the first frame (too long for the
			// interface, the interface gone): it completes with that
			// error and the frames behind it go on.
			q.complete(1, uint16(e))
			continue
		}
		q.complete(uint32(r), 0)
		if uint32(r) < k {
			return // the socket took what it could: the rest at the next flush
		}
	}
}

// complete writes the completions of the next k frames sent, then
// publishes them (release: the entries first), and signals a CQ the
// queue feeds if it is armed.
func (q *TxQueue) complete(k uint32, errno uint16) {
	n := uint32(len(q.order))
	p := atomic.LoadUint32(q.prod)
	for range k {
		id := q.order[q.sent%n]
		e := q.comp[8*(p%n):]
		binary.LittleEndian.PutUint32(e, id)
		binary.LittleEndian.PutUint16(e[4:], uint16(q.lens[id]))
		binary.LittleEndian.PutUint16(e[6:], errno)
		p++
		q.sent++
	}
	atomic.StoreUint32(q.prod, p)
	if q.FW != nil && k > 0 {
		q.FW.Signal()
	}
}

// txReader is a transmit queue's qcore.Ring.
type txReader struct {
	reader
	tx *TxQueue
}

// Read implements qcore.Ring: frames still waiting are sent first. A
// frame the kernel refused completes with its errno (Meta[0]).
func (r txReader) Read(cs []cqring.Completion) int {
	if q := r.tx; q.sent != q.tail {
		q.send()
	}
	n := r.Take(cs)
	r.tx.free.Release(cs[:n])
	for i := range cs[:n] {
		if c := &cs[i]; c.Err == 0 && c.Meta[0] != 0 {
			c.Err = cq.Errno(c.Meta[0])
		}
	}
	return n
}

// Err implements qcore.Ring: a refused frame's error names the kernel's
// errno (errors.Is with unix.EMSGSIZE and the like).
func (r txReader) Err(c *cqring.Completion) error {
	if c.Prov == 0 && c.Meta[0] != 0 {
		// Allocates, as errors are rare: the errno says what went wrong.
		return fmt.Errorf("%w: afpacket: the kernel refused the frame: %w", nic.ErrDeviceStatus, unix.Errno(c.Meta[0]))
	}
	return r.reader.Err(c)
}

// Notify implements qcore.Ring: sendmmsg for the frames waiting.
func (r txReader) Notify() (rang, suppressed bool) {
	q := r.tx
	if q.sent == q.tail {
		return false, false
	}
	q.send()
	return true, false
}
