package nic

import (
	"context"
	"io"
	"net"
	"time"

	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/eventfd"
	"github.com/vfnic/vfnic/hugepage"
)

// Frame size limits without the frame check sequence, which the devices
// add and strip themselves.
const (
	// MinFrame is the shortest frame a queue sends: an Ethernet header.
	MinFrame = 14
	// MaxFrame is the longest untagged frame for the standard 1500-byte
	// MTU. A device's own limits are its queues' MaxFrame methods.
	MaxFrame = 1514
	// FrameOverhead is the most a frame adds to an MTU-sized payload: the
	// Ethernet header and two VLAN tags (802.1Q, or 802.1ad QinQ), so
	// that tagged full-size frames (1518 and 1522 bytes at MTU 1500) go
	// out as they do through Linux's VLAN devices.
	FrameOverhead = 14 + 2*4
)

// Completion is one finished operation, read in batches into records the
// caller owns (Poll, SRead). Which fields are set depends on the queue:
//
//	receive: Context, Buf, Data, Len, Queue (Err on a bad entry)
//	send:    Context, Len, Queue (Err on a bad entry)
//
// A receive completion lends its buffer to the caller: Data stays valid
// until the buffer goes back with Release or Repost, and never past the
// device's Close (the memory is unmapped). An error completion lends
// nothing: the driver has already recycled its buffer.
type Completion struct {
	// Context is the value given when the operation was posted.
	Context any
	// Buf identifies a received frame's buffer: the address of the frame's
	// first byte, to pass to Release or Repost. Zero for sends and errors.
	Buf uintptr
	// Data is the received frame (Ethernet header first, no FCS), a view
	// of the driver's DMA buffer. Nil for sends and errors.
	Data []byte
	// Len is the frame length in bytes.
	Len int
	// Queue is the index of the queue the completion came from.
	Queue int
	// Err is nil, or why the device's entry was refused (cq.ProvBadID,
	// cq.ProvBadLen, cq.ProvBadPhase, cq.ProvBadIndex, cq.ProvMultiBuffer).
	Err error
}

// Queue is what receive and transmit queues have in common: completions,
// doorbells and interrupts.
type Queue interface {
	// Index is the queue's number (0 to QueuePairs-1).
	Index() int
	// Size is the number of descriptors in the queue's ring.
	Size() int
	// Outstanding is the number of operations posted and not completed.
	Outstanding() int
	// Flush makes the operations posted since the last Flush visible to
	// the device and notifies it unless it suppressed notifications.
	Flush() error
	// Poll moves up to len(out) completions into out without blocking and
	// returns how many. An error completion is always the last one. A
	// queue bound to a CQ (BindCQ) returns one error completion whose Err
	// is ErrBound, and SRead and WaitInterrupt return ErrBound.
	Poll(out []Completion) int
	// SRead is the blocking Poll: it returns once threshold completions
	// (at least 1, at most len(out)) are read, an error completion is
	// read, or the timeout passes with at least one read. With nothing
	// read it returns ErrTimeout; a negative timeout waits forever, zero
	// polls once. It arms the interrupt, polls once more, then sleeps
	// (see SRead in this package); ctx cancellation and Close end it.
	SRead(ctx context.Context, out []Completion, threshold int, timeout time.Duration) (int, error)
	// Arm asks the device for one interrupt once threshold completions
	// (counted from the next one Poll would return) are ready, or once
	// every outstanding operation completed when fewer are outstanding.
	// Poll turns interrupts off again when it returns completions. Callers
	// poll once more after Arm: entries written before it raise no
	// interrupt. Threshold 0 asks for the completion after those ready
	// now, where the device can count (virtio with EVENT_IDX); elsewhere
	// it means 1. It first takes the count a WaitInterrupt on a pinned
	// thread left on the eventfd (counted in Stats), so that the next
	// WaitInterrupt sleeps until a new interrupt.
	Arm(threshold int) error
	// Interrupt is the eventfd the queue's MSI-X vector signals, for event
	// loops that poll(2) it themselves; the queue keeps ownership. For a
	// device without MSI-X it stands for the descriptor whose readiness
	// says completions are ready (eventfd.Readable: an AF_XDP socket;
	// eventfd.Writable: the same socket for its transmit queue in copy
	// mode, made writable as sends complete): poll it for POLLIN, or
	// POLLOUT when FD.WriteReadiness says so, edge-triggered (FD.Readiness:
	// it can last with nothing new).
	Interrupt() *eventfd.FD
	// WaitInterrupt sleeps until the queue's interrupt fires (nil), the
	// deadline passes (ErrTimeout; a zero deadline waits forever), ctx
	// ends (its error) or the queue closes (ErrClosed). On a thread pinned
	// to one CPU it leaves the eventfd's count for the next Arm to take
	// (eventfd.FD.Await): the wake-up then costs one system call, not two.
	WaitInterrupt(ctx context.Context, deadline time.Time) error
	// Stats returns the queue's counters.
	Stats() QueueStats
}

// InterruptSteerer is a Queue whose interrupt can be directed to one CPU
// (its MSI-X vector's IRQ affinity), as a kernel driver's affinity hint
// does: a thread pinned to that CPU that sleeps on the queue's interrupt
// is then woken on its own CPU, with no inter-processor interrupt on the
// way. A polling core steers its queues to its CPU (package lcore).
type InterruptSteerer interface {
	// SteerInterrupt directs the queue's interrupt to cpu; an error
	// matching ErrNotSupported when the queue has no interrupt or the
	// platform cannot steer it (a software device), the system's error
	// otherwise (not root, a CPU the kernel refuses).
	SteerInterrupt(cpu int) error
}

// RxQueue is a receive queue. Its buffers come from a pool the driver
// allocated in DMA memory at Open; each PostRecv lends one to the device.
type RxQueue interface {
	Queue
	// PostRecv posts a free buffer for one frame with the caller's context
	// (call Flush to hand it to the device). ErrFull: no free descriptor,
	// or every buffer is lent out.
	PostRecv(ctx any) error
	// Repost posts the buffer of a received frame again, with a new
	// context, without a round trip through the pool.
	Repost(buf uintptr, ctx any) error
	// RepostBurst is Repost for several buffers at once, as a DPDK driver
	// refills its ring in bulk: it posts bufs in order, with the contexts
	// in ctxs (nil: none; else as long as bufs), and returns how many it
	// posted, with Repost's error for the first it refused (the rest are
	// not posted, and stay lent). One lock and one check of the queue's
	// state serve the whole burst.
	RepostBurst(bufs []uintptr, ctxs []any) (int, error)
	// Release returns the buffer of a received frame to the pool.
	Release(buf uintptr) error
	// MaxFrame is the longest frame a buffer holds.
	MaxFrame() int
	// Frame returns the bytes of a received frame from the Buf and Len of
	// its completion, for completions read through a cq.CQ (whose entries
	// carry an address, not a slice). The bytes stay valid until Release
	// or Repost.
	Frame(buf uintptr, length int) ([]byte, error)
}

// TxQueue is a transmit queue.
type TxQueue interface {
	Queue
	// Send copies frame into one of the queue's DMA buffers and posts it
	// with the caller's context (call Flush to hand it to the device).
	// ErrFull: read completions first. ErrFrameSize: the frame is shorter
	// than MinFrame or longer than MaxFrame().
	Send(frame []byte, ctx any) error
	// SendFunc is the zero-copy Send: fill writes an n-byte frame in
	// place into the queue's next free DMA buffer, which is then posted
	// with the caller's context, as a DPDK program writes an mbuf it took
	// from its pool. The buffer holds what the last frame sent from it
	// left there (zeros in one never used), so a sender whose frames
	// differ only in their first bytes writes only those. fill runs with
	// the queue locked: it must not call the queue or keep the slice. It
	// is not called when the send is refused (Send's errors, and
	// ErrInvalid for a nil fill).
	SendFunc(n int, ctx any, fill func(buf []byte)) error
	// SendBurst is Send for a batch, as DPDK's rte_eth_tx_burst: it posts
	// frames in order, frames[i] with ctxs[i] (ctxs nil: no contexts;
	// else one per frame, or an error matching ErrInvalid and nothing
	// posted), under one lock, until one is refused. It returns how many
	// were posted and, when fewer than len(frames), why the next was not:
	// ErrFull (read completions first), ErrFrameSize (that frame's size;
	// those before it are posted), the queue closed. Like Send it does
	// not Flush, and it keeps neither slice.
	SendBurst(frames [][]byte, ctxs []any) (int, error)
	// MaxFrame is the longest frame Send, SendFunc and SendBurst take.
	MaxFrame() int
}

// Device is an open NIC driven from user space.
type Device interface {
	io.Closer
	// Info describes the device and what was negotiated.
	Info() Info
	// MAC is the device's Ethernet address.
	MAC() net.HardwareAddr
	// Link reads the link state from the device.
	Link() (Link, error)
	// Stats sums the queues' counters.
	Stats() Stats
	// QueuePairs is the number of receive/transmit queue pairs in use.
	QueuePairs() int
	// Rx returns receive queue i.
	Rx(i int) (RxQueue, error)
	// Tx returns transmit queue i.
	Tx(i int) (TxQueue, error)
	// BindCQ makes the receive and/or transmit queue of pair i feed c: the
	// queue's completions are then read with c.Read, c.SRead, ... (the
	// queue's own Poll returns nothing and its SRead fails), and the
	// queue's interrupt signals c's wait object. Each queue feeds at most
	// one CQ; several queues may feed one. The binding lasts until the
	// device is closed, which must happen before c is closed (c.Close
	// fails with cq.ErrBusy while queues are bound).
	//
	// Entries carry the posted Context, Len, Flags (cq.FlagRecv or
	// cq.FlagSend, with cq.FlagMsg) and, for receives, Buf: the frame's
	// address, for RxQueue.Frame, Release and Repost. Queue is the
	// device's number for the queue (see the driver). Bad device entries
	// become error completions (cq.ProvBadID, cq.ProvBadLen, ...).
	//
	// When the device closes (Close, or the kernel taking it back), each
	// operation still outstanding on a bound queue completes in c as a
	// flushed error completion (verbs' WR_FLUSH_ERR): Err cq.ECANCELED,
	// its Context, Flags and Queue as above, Len 0, ProvErrno 0, one per
	// ReadErr, after what c read before; then the queue reports nothing.
	// The drivers do not read the ring at close, so an operation the
	// device finished but c had not read yet is flushed too. Closing c
	// drops those it did not read.
	BindCQ(c *cq.CQ, i int, dir Direction) error
}

// Direction selects the queues of a pair.
type Direction uint8

// Directions.
const (
	Recv Direction = 1 << iota // the receive queue
	Send                       // the transmit queue
)

// Config says how to open a device. The zero Config asks for the driver's
// defaults: one queue pair of 256 descriptors, 2 KiB buffers, twice as many
// receive buffers as descriptors, DMA memory in 2 MiB hugepages at IOVAs
// from 4 GiB up.
type Config struct {
	// QueuePairs is the number of receive/transmit queue pairs; 0 means 1.
	// More than the device offers is an error.
	QueuePairs int
	// QueueSize is the number of descriptors per ring; 0 means the
	// driver's default, capped at what the device allows. Rings that must
	// be a power of two are rounded down.
	QueueSize int
	// RxBuffers is the number of buffers per receive queue; 0 means twice
	// QueueSize (so a full ring can be refilled while frames are held).
	RxBuffers int
	// BufferSize is the size of a receive buffer, driver headers included;
	// 0 means 2048, or enough for a tagged MTU-sized frame when the device
	// offers an MTU above 1500. It must hold a MaxFrame frame; longer frames
	// than a buffer holds complete with cq.ProvMultiBuffer.
	BufferSize int
	// Promiscuous asks for every frame on the wire rather than those for
	// the device's MAC, broadcast and multicast (where the device lets the
	// driver choose).
	Promiscuous bool
	// Force takes a device even though a kernel network interface on it is
	// up or carries addresses (see pci.CheckInUse).
	Force bool
	// KeepBound leaves the device bound to vfio-pci after Close and after
	// a failed Open. By default a device that Open bound to vfio-pci goes
	// back to the driver it had (Info.PreviousDriver); one that was on
	// vfio-pci already stays there either way.
	KeepBound bool
	// IOVAFloor is the lowest device address used for DMA; 0 means 4 GiB,
	// above the RAM of small machines, so that a stray physical address
	// written by a device never lands in a buffer.
	IOVAFloor uint64
	// Memory says which pages back DMA memory (hugepage.Options); the zero
	// value asks for 2 MiB hugepages without fallback.
	Memory hugepage.Options
	// NoRxChecksumOffload and NoTxChecksumOffload turn off the device's
	// receive and transmit checksum offloads, which drivers otherwise use
	// where the device has them. virtio then does not negotiate
	// GUEST_CSUM and CSUM (the backend completes every checksum, as on a
	// wire without offloads); igb's ChecksumVerified reports no frame
	// checked and its SendL4Checksum declines with ErrNotSupported.
	NoRxChecksumOffload, NoTxChecksumOffload bool
}

// Info describes an open device.
type Info struct {
	// Driver is the driver's name ("virtio").
	Driver string
	// Address is the PCI address ("0000:00:04.0").
	Address string
	// PreviousDriver is the kernel driver the device had before Open
	// ("virtio-pci"; "" for none), and Rebound is true when Open bound it
	// to vfio-pci (false when it was bound already). Close gives a
	// rebound device back to PreviousDriver unless Config.KeepBound.
	PreviousDriver string
	Rebound        bool
	// Model names the device ("virtio-net (packed ring)").
	Model string
	// MAC is the Ethernet address.
	MAC net.HardwareAddr
	// MTU is the largest payload the device carries (1500 unless it says,
	// as virtio's MTU feature does). Transmit queues take frames of up to
	// MTU+FrameOverhead bytes.
	MTU int
	// QueuePairs is the number of queue pairs in use; MaxQueuePairs what
	// the device offers.
	QueuePairs    int
	MaxQueuePairs int
	// QueueSize is the number of descriptors per ring.
	QueueSize int
	// RxBuffers is the number of buffers per receive queue; BufferSize
	// their size, driver headers included.
	RxBuffers  int
	BufferSize int
	// Vectors is the number of MSI-X vectors wired to eventfds.
	Vectors int
	// Features lists the negotiated device features by name.
	Features []string
}

// Link is a link state.
type Link struct {
	// Up is true when the link is up. Devices that do not report their
	// link are always up, with Reported false.
	Up bool
	// Reported is true when the device reports its link state.
	Reported bool
	// SpeedMbps is the speed in Mbit/s, 0 when unknown.
	SpeedMbps int
	// FullDuplex is true for a full-duplex link (when known).
	FullDuplex bool
}

// QueueStats are one queue's counters since Open.
type QueueStats struct {
	// Packets and Bytes count completed frames (without driver headers).
	Packets, Bytes uint64
	// Errors counts error completions.
	Errors uint64
	// Notifies counts doorbell writes; Suppressed the flushes whose
	// doorbell the device's event suppression made unnecessary.
	Notifies, Suppressed uint64
	// Interrupts counts interrupts the queue's eventfd delivered.
	Interrupts uint64
}

// Add adds o's counters to s.
func (s *QueueStats) Add(o QueueStats) {
	s.Packets += o.Packets
	s.Bytes += o.Bytes
	s.Errors += o.Errors
	s.Notifies += o.Notifies
	s.Suppressed += o.Suppressed
	s.Interrupts += o.Interrupts
}

// Stats are a device's counters: totals and per queue.
type Stats struct {
	// Rx and Tx are the sums over the queues.
	Rx, Tx QueueStats
	// RxQueues and TxQueues are per queue.
	RxQueues, TxQueues []QueueStats
	// ConfigInterrupts counts configuration-change interrupts (link changes).
	ConfigInterrupts uint64
}
