package afxdp

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/nic/internal/hostif"
	qcore "github.com/vfnic/vfnic/nic/internal/queue"
	"golang.org/x/sys/unix"
)

// Errors of Open besides nic's.
var (
	// ErrNoInterface means the named network interface does not exist
	// (in the network namespace of the calling thread).
	ErrNoInterface = errors.New("afxdp: no such network interface")
	// ErrPermission means the kernel refused an AF_XDP socket or a BPF
	// object: run as root, or with CAP_NET_RAW, CAP_BPF and CAP_NET_ADMIN.
	ErrPermission = errors.New("afxdp: not permitted (needs root, or CAP_NET_RAW, CAP_BPF and CAP_NET_ADMIN)")
	// ErrBusy means a queue is taken: bound by another AF_XDP socket, or
	// the interface is open already in this process.
	ErrBusy = errors.New("afxdp: queue busy")
	// ErrXDPInUse means the interface has an XDP program that this
	// package did not attach.
	ErrXDPInUse = errors.New("afxdp: another XDP program is attached to the interface")
)

// Defaults and limits.
const (
	defaultSize  = 256
	maxSize      = 1 << 15
	defaultChunk = 2048
)

func init() {
	// The name and scheme are unique to this package: registration cannot fail.
	_ = nic.Register(nic.Driver{Name: "afxdp", Scheme: "afxdp",
		OpenName: func(ctx context.Context, name string, cfg nic.Config) (nic.Device, error) {
			return Open(ctx, name, cfg)
		}})
}

// Device is a network interface's queues driven through AF_XDP sockets
// (nic.Device).
type Device struct {
	// host is the queue core's device, the interface, the queues and
	// the accessors of nic.Device.
	host
	key  ifKey
	red  *redirect
	xsks []*xsk
	rx   []*RxQueue
	tx   []*TxQueue
}

// host is the part of Device every host device has.
type host = hostif.Device[*RxQueue, *TxQueue]

// core is the queue core's device.
func (d *Device) core() *qcore.Device { return hostif.Core(&d.host) }

var _ nic.Device = (*Device)(nil)

// ifKey names an interface across network namespaces.
type ifKey struct {
	netns   uint64
	ifindex int
}

// open are the interfaces open in this process: one Device each, since
// the XDP program and its map belong to the device.
var (
	openMu sync.Mutex
	open   = map[ifKey]string{}
)

// ParseName splits a device name "eth1" or "eth1@2" into the interface
// and the first queue.
func ParseName(name string) (ifname string, queue int, err error) {
	ifname, q, hasQ := strings.Cut(name, "@")
	if ifname == "" || len(ifname) >= unix.IFNAMSIZ || strings.ContainsAny(ifname, "/: \t") {
		return "", 0, fmt.Errorf("%w: afxdp: interface name %q (want afxdp:IFNAME or afxdp:IFNAME@QUEUE)", nic.ErrInvalid, name)
	}
	if hasQ {
		n, err := strconv.Atoi(q)
		if err != nil || n < 0 {
			return "", 0, fmt.Errorf("%w: afxdp: queue %q in %q", nic.ErrInvalid, q, name)
		}
		queue = n
	}
	return ifname, queue, nil
}

// Open opens the interface named "IFNAME" or "IFNAME@QUEUE" (see the
// package documentation) in the network namespace of the calling thread.
// cfg.QueuePairs sockets are bound to queues QUEUE, QUEUE+1, ...;
// cfg.QueueSize is each ring's size (a power of two, default 256),
// cfg.RxBuffers the receive buffers per queue (at least QueueSize,
// default twice), cfg.BufferSize the UMEM chunk (2048 or 4096).
// cfg.Force detaches an XDP program attached through netlink by someone
// else; without it such a program is an ErrXDPInUse.
func Open(ctx context.Context, name string, cfg nic.Config) (*Device, error) {
	if ctx == nil {
		return nil, fmt.Errorf("%w: nil context", nic.ErrInvalid)
	}
	ifname, first, err := ParseName(name)
	if err != nil {
		return nil, err
	}
	pairs, size, rxBufs, chunk, err := normalize(cfg)
	if err != nil {
		return nil, err
	}
	d := &Device{}
	d.core().Name = "afxdp:" + name
	if err := d.open(ctx, ifname, first, pairs, size, rxBufs, chunk, cfg.Force); err != nil {
		_ = d.core().Teardown(nic.ErrClosed, d.hw)
		return nil, err
	}
	return d, nil
}

// normalize applies the defaults and checks cfg.
func normalize(cfg nic.Config) (pairs, size, rxBufs, chunk int, err error) {
	pairs, size, rxBufs, chunk = max(cfg.QueuePairs, 1), cfg.QueueSize, cfg.RxBuffers, cfg.BufferSize
	if size == 0 {
		size = defaultSize
	}
	if size < 2 || size > maxSize {
		return 0, 0, 0, 0, fmt.Errorf("%w: afxdp: queue size %d outside [2, %d]", nic.ErrInvalid, size, maxSize)
	}
	for size&(size-1) != 0 {
		size &= size - 1 // rounded down to a power of two
	}
	if rxBufs == 0 {
		rxBufs = 2 * size
	}
	if rxBufs < size || rxBufs > 1<<20 {
		return 0, 0, 0, 0, fmt.Errorf("%w: afxdp: %d receive buffers for %d-entry rings (need at least as many)", nic.ErrInvalid, rxBufs, size)
	}
	if chunk == 0 {
		chunk = defaultChunk
	}
	if chunk != 2048 && chunk != 4096 {
		return 0, 0, 0, 0, fmt.Errorf("%w: afxdp: buffer size %d (AF_XDP chunks of 2048 or 4096 bytes)", nic.ErrInvalid, chunk)
	}
	if cfg.QueuePairs < 0 || pairs > 256 {
		return 0, 0, 0, 0, fmt.Errorf("%w: afxdp: %d queue pairs", nic.ErrInvalid, cfg.QueuePairs)
	}
	return pairs, size, rxBufs, chunk, nil
}

func (d *Device) open(ctx context.Context, ifname string, first, pairs, size, rxBufs, chunk int, force bool) error {
	ifc, err := hostif.Open("afxdp", ifname, ErrNoInterface)
	if err != nil {
		return err
	}
	hostif.Setup(&d.host, ifc, nic.Info{})
	if d.key, err = thisNetns(ifc.Index); err != nil {
		return err
	}
	openMu.Lock()
	other, busy := open[d.key]
	if !busy {
		open[d.key] = d.core().Name
	}
	openMu.Unlock()
	if busy {
		d.key = ifKey{} // not ours to forget at teardown
		return fmt.Errorf("%w: %s is open already in this process (%s): open its queues as one device (Config.QueuePairs)", ErrBusy, ifname, other)
	}
	nq, maxq := d.queues()
	if first+pairs > nq {
		return fmt.Errorf("%w: afxdp: queues %d to %d of %s, which has %d", nic.ErrInvalid, first, first+pairs-1, ifname, nq)
	}
	if d.red, err = newRedirect(maxq); err != nil {
		return err
	}
	for i := range pairs {
		if err := ctx.Err(); err != nil {
			return err
		}
		x, err := newXSK(xskConfig{ifname: ifname, ifindex: ifc.Index, queue: first + i, size: size, txBufs: size, rxBufs: rxBufs, chunk: chunk})
		if err != nil {
			return err
		}
		d.xsks = append(d.xsks, x)
		if err := d.red.set(first+i, x.fd); err != nil {
			return err
		}
		name := fmt.Sprintf("%s@%d", ifname, first+i)
		rx, err := newRxQueue(x, i, name, rxBufs)
		if err != nil {
			return err
		}
		tx, err := newTxQueue(x, i, name, min(ifc.MTU+nic.FrameOverhead, chunk))
		if err != nil {
			return err
		}
		d.rx, d.tx = append(d.rx, rx), append(d.tx, tx)
		hostif.Add(&d.host, rx, &rx.Queue, tx, &tx.Queue)
	}
	if err := d.red.attach(ifname, ifc.Index, force); err != nil {
		return err
	}
	feats := []string{"copy", "xdp-generic", "need-wakeup"}
	if d.xsks[0].zc {
		feats[0] = "zero-copy"
	}
	if d.red.native {
		feats[1] = "xdp-native"
	}
	hostif.Setup(&d.host, ifc, nic.Info{Driver: "afxdp", Address: d.core().Name, Model: ifc.Model("AF_XDP"), MAC: ifc.MAC, MTU: ifc.MTU,
		QueuePairs: pairs, MaxQueuePairs: nq, QueueSize: size, RxBuffers: rxBufs, BufferSize: chunk, Features: feats})
	return nil
}

// thisNetns returns the key of interface ifindex in the calling thread's
// network namespace.
func thisNetns(ifindex int) (ifKey, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
		return ifKey{}, fmt.Errorf("afxdp: network namespace: %w", err)
	}
	return ifKey{netns: st.Ino, ifindex: ifindex}, nil
}

// ethtoolChannels is struct ethtool_channels.
type ethtoolChannels struct {
	Cmd                                         uint32
	MaxRx, MaxTx, MaxOther, MaxCombined         uint32
	RxCount, TxCount, OtherCount, CombinedCount uint32
}

// queues returns the interface's receive queues in use and the most it
// can have (ETHTOOL_GCHANNELS); 1 and 1 for a driver that does not say.
func (d *Device) queues() (inUse, most int) {
	ch := ethtoolChannels{Cmd: unix.ETHTOOL_GCHANNELS}
	var ifr struct {
		name [unix.IFNAMSIZ]byte
		data uintptr
		_    [16]byte
	}
	copy(ifr.name[:], hostif.IfaceOf(&d.host).Name)
	ifr.data = uintptr(unsafe.Pointer(&ch))
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(hostif.IfaceOf(&d.host).Ctl), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr))); e != 0 {
		return 1, 1
	}
	inUse = max(int(ch.RxCount), int(ch.CombinedCount), 1)
	most = max(int(ch.MaxRx), int(ch.MaxCombined), inUse)
	return inUse, most
}

// Close implements nic.Device: the queues close (their operations then
// fail with nic.ErrClosed; operations outstanding on a queue bound to a
// CQ complete there as flushed), the XDP program is detached, the
// sockets closed and the rings and UMEM unmapped.
func (d *Device) Close() error { return d.core().Close(nic.ErrClosed, nil, d.hw) }

// hw releases what open made once the queues are closed: no ring or UMEM
// is unmapped while a queue operation may use it.
func (d *Device) hw() error {
	var errs []error
	if d.red != nil {
		errs = append(errs, d.red.close())
	}
	for _, x := range d.xsks {
		errs = append(errs, x.close())
	}
	errs = append(errs, hostif.IfaceOf(&d.host).Close())
	if d.key != (ifKey{}) {
		openMu.Lock()
		delete(open, d.key)
		openMu.Unlock()
	}
	return errors.Join(errs...)
}
