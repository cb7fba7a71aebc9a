package afpacket

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"net"
	"strings"
	"sync"
	"unsafe"

	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/eventfd"
	"github.com/vfnic/vfnic/nic"
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

// Device is a network interface driven through an AF_PACKET socket
// (nic.Device).
type Device struct {
	mu       sync.Mutex
	name     string
	ifname   string
	ifindex  int
	fd       int
	ctl      int
	ring     []byte
	irq      *eventfd.FD
	mac      net.HardwareAddr
	rx       *RxQueue
	tx       *TxQueue
	info     nic.Info
	closed   bool
	closeErr error
}

var _ nic.Device = (*Device)(nil)

// Open opens the interface named ifname in the network namespace of the
// calling thread: one queue pair, a receive ring of cfg.QueueSize slots
// (a power of two, default 256) of cfg.BufferSize bytes (2048 or 4096).
func Open(ctx context.Context, ifname string, cfg nic.Config) (*Device, error) {
	if ctx == nil {
		return nil, fmt.Errorf("%w: nil context", nic.ErrInvalid)
	}
	if ifname == "" || len(ifname) >= unix.IFNAMSIZ || strings.ContainsAny(ifname, "/:@ \t") {
		return nil, fmt.Errorf("%w: afpacket: interface name %q (want afpacket:IFNAME)", nic.ErrInvalid, ifname)
	}
	size, chunk := cfg.QueueSize, cfg.BufferSize
	if size == 0 {
		size = defaultSize
	}
	if chunk == 0 {
		chunk = defaultChunk
	}
	switch {
	case cfg.QueuePairs > 1:
		return nil, fmt.Errorf("%w: afpacket: %d queue pairs (one for now: PACKET_FANOUT is not done)", nic.ErrNotSupported, cfg.QueuePairs)
	case size < 2 || size > maxSize:
		return nil, fmt.Errorf("%w: afpacket: queue size %d outside [2, %d]", nic.ErrInvalid, size, maxSize)
	case chunk != 2048 && chunk != 4096:
		return nil, fmt.Errorf("%w: afpacket: buffer size %d (slots of 2048 or 4096 bytes)", nic.ErrInvalid, chunk)
	}
	size = 1 << (bits.Len(uint(size)) - 1)
	d := &Device{name: "afpacket:" + ifname, ifname: ifname, fd: -1, ctl: -1}
	if err := d.open(size, chunk); err != nil {
		_ = d.teardown()
		return nil, err
	}
	return d, nil
}

// tpacketReq is struct tpacket_req.
type tpacketReq struct {
	BlockSize, BlockNr, FrameSize, FrameNr uint32
}

func (d *Device) open(size, chunk int) error {
	ifc, err := net.InterfaceByName(d.ifname)
	if err != nil {
		if strings.Contains(err.Error(), "no such network interface") {
			return fmt.Errorf("%w: %q", ErrNoInterface, d.ifname)
		}
		return fmt.Errorf("afpacket: %s: %w", d.ifname, err)
	}
	d.ifindex, d.mac = ifc.Index, ifc.HardwareAddr
	if d.ctl, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0); err != nil {
		return fmt.Errorf("afpacket: control socket: %w", err)
	}
	proto := int(htons(unix.ETH_P_ALL))
	d.fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, proto)
	if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
		return fmt.Errorf("%w: packet socket: %w", ErrPermission, err)
	} else if err != nil {
		d.fd = -1
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
		if err := unix.SetsockoptInt(d.fd, unix.SOL_PACKET, o.opt, o.val); err != nil {
			return fmt.Errorf("afpacket: %s: %w", o.name, err)
		}
	}
	block := max(chunk, 4096)
	req := tpacketReq{BlockSize: uint32(block), FrameSize: uint32(chunk), FrameNr: uint32(size)}
	req.BlockNr = uint32(size * chunk / block)
	if _, _, e := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(d.fd), unix.SOL_PACKET, unix.PACKET_RX_RING,
		uintptr(unsafe.Pointer(&req)), unsafe.Sizeof(req), 0); e != 0 {
		return fmt.Errorf("afpacket: PACKET_RX_RING of %d slots: %w", size, e)
	}
	if d.ring, err = unix.Mmap(d.fd, 0, size*chunk, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		return fmt.Errorf("afpacket: mmap the receive ring: %w", err)
	}
	// Every slot is the driver's until posted: the kernel writes only
	// slots whose status is zero.
	for i := range size {
		*(*uint32)(unsafe.Pointer(&d.ring[i*chunk])) = held
	}
	if err := unix.Bind(d.fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: d.ifindex}); err != nil {
		return fmt.Errorf("afpacket: bind to %s: %w", d.ifname, err)
	}
	if d.irq, err = eventfd.Readable(d.fd); err != nil {
		return err
	}
	if d.rx, err = newRxQueue(d, size, chunk); err != nil {
		return err
	}
	d.tx = newTxQueue(d, size, min(ifc.MTU+nic.FrameOverhead, 65535))
	model := "AF_PACKET"
	if di, err := unix.IoctlGetEthtoolDrvinfo(d.ctl, d.ifname); err == nil {
		model += " on " + unix.ByteSliceToString(di.Driver[:])
	}
	d.info = nic.Info{Driver: "afpacket", Address: d.name, Model: model, MAC: d.mac, MTU: ifc.MTU,
		QueuePairs: 1, MaxQueuePairs: 1, QueueSize: size, RxBuffers: size, BufferSize: chunk,
		Features: []string{"tpacket-v2", "qdisc-bypass"}}
	return nil
}

// Info implements nic.Device.
func (d *Device) Info() nic.Info {
	i := d.info
	i.MAC = append(net.HardwareAddr(nil), d.mac...)
	i.Features = append([]string(nil), i.Features...)
	return i
}

// MAC implements nic.Device.
func (d *Device) MAC() net.HardwareAddr { return append(net.HardwareAddr(nil), d.mac...) }

// QueuePairs implements nic.Device.
func (d *Device) QueuePairs() int { return 1 }

// Rx implements nic.Device.
func (d *Device) Rx(i int) (nic.RxQueue, error) {
	if i != 0 {
		return nil, fmt.Errorf("%w: %s: receive queue %d of 1", nic.ErrInvalid, d.name, i)
	}
	return d.rx, nil
}

// Tx implements nic.Device.
func (d *Device) Tx(i int) (nic.TxQueue, error) {
	if i != 0 {
		return nil, fmt.Errorf("%w: %s: transmit queue %d of 1", nic.ErrInvalid, d.name, i)
	}
	return d.tx, nil
}

// Link implements nic.Device: the interface's flags (up and running).
func (d *Device) Link() (nic.Link, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nic.Link{}, nic.ErrClosed
	}
	ifr, err := unix.NewIfreq(d.ifname)
	if err != nil {
		return nic.Link{}, err
	}
	if err := unix.IoctlIfreq(d.ctl, unix.SIOCGIFFLAGS, ifr); err != nil {
		return nic.Link{}, fmt.Errorf("afpacket: %s flags: %w", d.ifname, err)
	}
	fl := ifr.Uint16()
	return nic.Link{Up: fl&unix.IFF_UP != 0 && fl&unix.IFF_RUNNING != 0, Reported: true}, nil
}

// Stats implements nic.Device.
func (d *Device) Stats() nic.Stats {
	rs, ts := d.rx.Stats(), d.tx.Stats()
	return nic.Stats{Rx: rs, Tx: ts, RxQueues: []nic.QueueStats{rs}, TxQueues: []nic.QueueStats{ts}}
}

// BindCQ implements nic.Device: not supported (see the package
// documentation: sends complete at Flush, from no ring).
func (d *Device) BindCQ(c *cq.CQ, i int, dir nic.Direction) error {
	return fmt.Errorf("%w: afpacket: BindCQ (sends complete in sendmmsg, from no ring a CQ could read)", nic.ErrNotSupported)
}

// Close implements nic.Device.
func (d *Device) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return d.closeErr
	}
	d.closed = true
	d.closeErr = d.teardown()
	return d.closeErr
}

// teardown closes the queues first: nothing reads the ring once it is
// unmapped.
func (d *Device) teardown() error {
	if d.rx != nil {
		d.rx.close()
	}
	if d.tx != nil {
		d.tx.close()
	}
	var errs []error
	if d.irq != nil {
		errs = append(errs, d.irq.Close())
	}
	if d.ring != nil {
		errs = append(errs, unix.Munmap(d.ring))
		d.ring = nil
	}
	for _, fd := range []*int{&d.fd, &d.ctl} {
		if *fd >= 0 {
			errs = append(errs, unix.Close(*fd))
			*fd = -1
		}
	}
	return errors.Join(errs...)
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
