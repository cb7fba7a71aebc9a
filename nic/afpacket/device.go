package afpacket

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"strings"
	"unsafe"

	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/eventfd"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/nic/internal/hostif"
	qcore "github.com/vfnic/vfnic/nic/internal/queue"
	"golang.org/x/sys/unix"
)

// Errors of Open besides nic's.
var (
	// ErrNoInterface means the named network interface does not exist
	// (in the network namespace of the calling thread).
	ErrNoInterface = errors.New("afpacket: no such network interface")
	// ErrPermission means the kernel refused the packet socket: run as
	// root, or with CAP_NET_RAW.
	ErrPermission = errors.New("afpacket: not permitted (needs root, or CAP_NET_RAW)")
)

const (
	defaultSize  = 256
	maxSize      = 1 << 15
	defaultChunk = 2048
	// held marks a slot the driver holds (cq/ring Layout.Held): a bit of
	// tp_status the kernel does not use, so the kernel, which writes a
	// slot only while its status is zero, leaves it alone.
	held = 1 << 28
)

func init() {
	// The name and scheme are unique to this package: registration cannot fail.
	_ = nic.Register(nic.Driver{Name: "afpacket", Scheme: "afpacket",
		OpenName: func(ctx context.Context, name string, cfg nic.Config) (nic.Device, error) {
			return Open(ctx, name, cfg)
		}})
}

// Device is a network interface driven through AF_PACKET sockets
// (nic.Device), one per queue pair, joined in a PACKET_FANOUT group when
// there are several.
type Device struct {
	// host is the queue core's device, the interface, the queues and
	// the accessors of nic.Device.
	host
	socks []*sock
	rx    []*RxQueue
	tx    []*TxQueue
}

// host is the part of Device every host device has.
type host = hostif.Device[*RxQueue, *TxQueue]

// core is the queue core's device.
func (d *Device) core() *qcore.Device { return hostif.Core(&d.host) }

// sock is a queue pair's packet socket and its receive ring.
type sock struct {
	fd   int
	ring []byte
	irq  *eventfd.FD // the socket's readiness
}

var _ nic.Device = (*Device)(nil)

// maxPairs bounds Config.QueuePairs: sockets in one fanout group.
const maxPairs = 64

// Open opens the interface named ifname in the network namespace of the
// calling thread: cfg.QueuePairs queue pairs (default 1), each a socket
// with a receive ring of cfg.QueueSize slots (a power of two, default
// 256) of cfg.BufferSize bytes (2048 or 4096). Several pairs share the
// interface's frames by flow (PACKET_FANOUT_HASH).
func Open(ctx context.Context, ifname string, cfg nic.Config) (*Device, error) {
	if ctx == nil {
		return nil, fmt.Errorf("%w: nil context", nic.ErrInvalid)
	}
	if ifname == "" || len(ifname) >= unix.IFNAMSIZ || strings.ContainsAny(ifname, "/:@ \t") {
		return nil, fmt.Errorf("%w: afpacket: interface name %q (want afpacket:IFNAME)", nic.ErrInvalid, ifname)
	}
	pairs, size, chunk := max(cfg.QueuePairs, 1), cfg.QueueSize, cfg.BufferSize
	if size == 0 {
		size = defaultSize
	}
	if chunk == 0 {
		chunk = defaultChunk
	}
	switch {
	case cfg.QueuePairs < 0 || pairs > maxPairs:
		return nil, fmt.Errorf("%w: afpacket: %d queue pairs (1 to %d)", nic.ErrInvalid, cfg.QueuePairs, maxPairs)
	case size < 2 || size > maxSize:
		return nil, fmt.Errorf("%w: afpacket: queue size %d outside [2, %d]", nic.ErrInvalid, size, maxSize)
	case chunk != 2048 && chunk != 4096:
		return nil, fmt.Errorf("%w: afpacket: buffer size %d (slots of 2048 or 4096 bytes)", nic.ErrInvalid, chunk)
	}
	size = 1 << (bits.Len(uint(size)) - 1)
	d := &Device{}
	d.core().Name = "afpacket:" + ifname
	if err := d.open(ctx, ifname, pairs, size, chunk); err != nil {
		_ = d.core().Teardown(nic.ErrClosed, d.hw)
		return nil, err
	}
	return d, nil
}

// tpacketReq is struct tpacket_req.
type tpacketReq struct {
	BlockSize, BlockNr, FrameSize, FrameNr uint32
}

func (d *Device) open(ctx context.Context, ifname string, pairs, size, chunk int) error {
	ifc, err := hostif.Open("afpacket", ifname, ErrNoInterface)
	if err != nil {
		return err
	}
	hostif.Setup(&d.host, ifc, nic.Info{})
	group := -1
	for i := range pairs {
		if err := ctx.Err(); err != nil {
			return err
		}
		s := &sock{fd: -1}
		d.socks = append(d.socks, s)
		if err := s.open(ifname, ifc.Index, size, chunk); err != nil {
			return err
		}
		if pairs > 1 {
			if group, err = s.fanout(group); err != nil {
				return err
			}
		}
		name := fmt.Sprintf("%s@%d", ifname, i)
		if pairs == 1 {
			name = ifname
		}
		rx, err := newRxQueue(s, i, name, size, chunk)
		if err != nil {
			return err
		}
		tx, err := newTxQueue(s, i, name, size, min(ifc.MTU+nic.FrameOverhead, 65535))
		if err != nil {
			return err
		}
		d.rx, d.tx = append(d.rx, rx), append(d.tx, tx)
		hostif.Add(&d.host, rx, &rx.Queue, tx, &tx.Queue)
	}
	feats := []string{"tpacket-v2", "qdisc-bypass", "vlan-reinsert"}
	if pairs > 1 {
		feats = append(feats, "fanout-hash")
	}
	hostif.Setup(&d.host, ifc, nic.Info{Driver: "afpacket", Address: d.core().Name, Model: ifc.Model("AF_PACKET"), MAC: ifc.MAC, MTU: ifc.MTU,
		QueuePairs: pairs, MaxQueuePairs: maxPairs, QueueSize: size, RxBuffers: size, BufferSize: chunk, Features: feats})
	return nil
}

// open makes the socket, its receive ring of size slots of chunk bytes,
// and binds it to the interface.
func (s *sock) open(ifname string, ifindex, size, chunk int) error {
	var err error
	s.fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, int(htons(unix.ETH_P_ALL)))
	if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
		s.fd = -1
		return fmt.Errorf("%w: packet socket: %w", ErrPermission, err)
	} else if err != nil {
		s.fd = -1
		return fmt.Errorf("afpacket: packet socket: %w", err)
	}
	for _, o := range []struct {
		opt, val int
		name     string
	}{
		{unix.PACKET_VERSION, unix.TPACKET_V2, "TPACKET_V2"},
		{unix.PACKET_QDISC_BYPASS, 1, "PACKET_QDISC_BYPASS"},
		{unix.PACKET_IGNORE_OUTGOING, 1, "PACKET_IGNORE_OUTGOING"},
	} {
		if err := unix.SetsockoptInt(s.fd, unix.SOL_PACKET, o.opt, o.val); err != nil {
			return fmt.Errorf("afpacket: %s: %w", o.name, err)
		}
	}
	block := max(chunk, 4096)
	req := tpacketReq{BlockSize: uint32(block), FrameSize: uint32(chunk), FrameNr: uint32(size)}
	req.BlockNr = uint32(size * chunk / block)
	if _, _, e := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(s.fd), unix.SOL_PACKET, unix.PACKET_RX_RING,
		uintptr(unsafe.Pointer(&req)), unsafe.Sizeof(req), 0); e != 0 {
		return fmt.Errorf("afpacket: PACKET_RX_RING of %d slots: %w", size, e)
	}
	if s.ring, err = unix.Mmap(s.fd, 0, size*chunk, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		return fmt.Errorf("afpacket: mmap the receive ring: %w", err)
	}
	// Every slot is the driver's until posted: the kernel writes only
	// slots whose status is zero.
	for i := range size {
		*(*uint32)(unsafe.Pointer(&s.ring[i*chunk])) = held
	}
	if err := unix.Bind(s.fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifindex}); err != nil {
		return fmt.Errorf("afpacket: bind to %s: %w", ifname, err)
	}
	if s.irq, err = eventfd.Readable(s.fd); err != nil {
		return err
	}
	return nil
}

// fanoutMode is how a device's sockets share the interface's frames:
// by flow hash, so that a flow stays on one queue and in order (as RSS
// does, and as DPDK's net_af_packet does with its queue pairs), with IP
// fragments reassembled first so that they hash as their flow
// (PACKET_FANOUT_FLAG_DEFRAG). PACKET_FANOUT_QM would follow the NIC's
// own queues, which a veth or a single-queue NIC does not spread;
// PACKET_FANOUT_CPU the receiving CPU, which splits a flow whenever the
// kernel moves it.
const fanoutMode = unix.PACKET_FANOUT_HASH | unix.PACKET_FANOUT_FLAG_DEFRAG

// fanout joins the socket to fanout group id, or, for -1, to a new group
// with an id the kernel picks unique (PACKET_FANOUT_FLAG_UNIQUEID), and
// returns the group's id.
func (s *sock) fanout(id int) (int, error) {
	arg := id | fanoutMode<<16
	if id < 0 {
		arg = (fanoutMode | unix.PACKET_FANOUT_FLAG_UNIQUEID) << 16
	}
	if err := unix.SetsockoptInt(s.fd, unix.SOL_PACKET, unix.PACKET_FANOUT, arg); err != nil {
		return 0, fmt.Errorf("afpacket: PACKET_FANOUT: %w", err)
	}
	if id >= 0 {
		return id, nil
	}
	got, err := unix.GetsockoptInt(s.fd, unix.SOL_PACKET, unix.PACKET_FANOUT)
	if err != nil {
		return 0, fmt.Errorf("afpacket: PACKET_FANOUT group: %w", err)
	}
	return got & 0xffff, nil
}

// close releases the socket and its ring.
func (s *sock) close() error {
	var errs []error
	if s.irq != nil {
		errs = append(errs, s.irq.Close())
	}
	if s.ring != nil {
		errs = append(errs, unix.Munmap(s.ring))
		s.ring = nil
	}
	if s.fd >= 0 {
		errs = append(errs, unix.Close(s.fd))
		s.fd = -1
	}
	return errors.Join(errs...)
}

// BindCQ implements nic.Device. Entry.Queue is 2i for the receive queue of
// pair i and 2i+1 for its transmit queue. A receive entry's Buf is the
// frame (RxQueue.Frame, Repost, Release). The socket's readiness cannot
// signal the CQ's eventfd itself: an armed receive queue's forwarder
// waits on it and signals the CQ; a transmit queue signals it when its
// Flush has written completions, with no forwarder's wait.
func (d *Device) BindCQ(c *cq.CQ, i int, dir nic.Direction) error {
	return d.core().BindForwarded(c, i, dir, func(q *qcore.Queue) qcore.Forwarding {
		return qcore.Forwarding{Signalled: q == &d.tx[q.Pair].Queue}
	})
}

// Close implements nic.Device: the queues close (operations outstanding
// on a queue bound to a CQ complete there as flushed), then the sockets
// and rings go.
func (d *Device) Close() error { return d.core().Close(nic.ErrClosed, nil, d.hw) }

// hw releases the sockets and rings once the queues are closed: nothing
// reads a ring once it is unmapped.
func (d *Device) hw() error {
	var errs []error
	for _, s := range d.socks {
		errs = append(errs, s.close())
	}
	errs = append(errs, hostif.IfaceOf(&d.host).Close())
	return errors.Join(errs...)
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
