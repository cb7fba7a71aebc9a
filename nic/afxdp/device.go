package afxdp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"github.com/vfnic/vfnic/nic"
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
	// core is the lock (Close, BindCQ, Link), the closed state, the
	// queues as the core sees them and the CQs they feed.
	core    qcore.Device
	name    string // "afxdp:eth1@2"
	ifname  string
	ifindex int
	key     ifKey
	ctl     int // a UDP socket in the interface's namespace, for ioctls
	mac     net.HardwareAddr
	red     *redirect
	xsks    []*xsk
	rx      []*RxQueue
	tx      []*TxQueue
	info    nic.Info
}

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
	d := &Device{name: "afxdp:" + name, ifname: ifname, ctl: -1}
	d.core.Name = d.name
	if err := d.open(ctx, ifname, first, pairs, size, rxBufs, chunk, cfg.Force); err != nil {
		_ = d.core.Teardown(nic.ErrClosed, d.hw)
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
	ifc, err := net.InterfaceByName(ifname)
	if err != nil {
		if strings.Contains(err.Error(), "no such network interface") {
			return fmt.Errorf("%w: %q", ErrNoInterface, ifname)
		}
		return fmt.Errorf("afxdp: %s: %w", ifname, err)
	}
	d.ifindex, d.mac = ifc.Index, ifc.HardwareAddr
	if d.ctl, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0); err != nil {
		return fmt.Errorf("afxdp: control socket: %w", err)
	}
	if d.key, err = thisNetns(d.ifindex); err != nil {
		return err
	}
	openMu.Lock()
	other, busy := open[d.key]
	if !busy {
		open[d.key] = d.name
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
		x, err := newXSK(xskConfig{ifname: ifname, ifindex: d.ifindex, queue: first + i, size: size, txBufs: size, rxBufs: rxBufs, chunk: chunk})
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
		d.core.Rx, d.core.Tx = append(d.core.Rx, &rx.Queue), append(d.core.Tx, &tx.Queue)
	}
	if err := d.red.attach(ifname, d.ifindex, force); err != nil {
		return err
	}
	model := "AF_XDP"
	if di, err := unix.IoctlGetEthtoolDrvinfo(d.ctl, ifname); err == nil {
		model += " on " + unix.ByteSliceToString(di.Driver[:])
	}
	feats := []string{"copy", "xdp-generic", "need-wakeup"}
	if d.xsks[0].zc {
		feats[0] = "zero-copy"
	}
	if d.red.native {
		feats[1] = "xdp-native"
	}
	d.info = nic.Info{Driver: "afxdp", Address: d.name, Model: model, MAC: d.mac, MTU: ifc.MTU,
		QueuePairs: pairs, MaxQueuePairs: nq, QueueSize: size, RxBuffers: rxBufs, BufferSize: chunk, Features: feats}
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
	copy(ifr.name[:], d.ifname)
	ifr.data = uintptr(unsafe.Pointer(&ch))
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(d.ctl), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr))); e != 0 {
		return 1, 1
	}
	inUse = max(int(ch.RxCount), int(ch.CombinedCount), 1)
	most = max(int(ch.MaxRx), int(ch.MaxCombined), inUse)
	return inUse, most
}

// Info implements nic.Device.
func (d *Device) Info() nic.Info { return qcore.Info(d.info, d.mac) }

// MAC implements nic.Device.
func (d *Device) MAC() net.HardwareAddr { return append(net.HardwareAddr(nil), d.mac...) }

// QueuePairs implements nic.Device.
func (d *Device) QueuePairs() int { return len(d.rx) }

// Rx implements nic.Device.
func (d *Device) Rx(i int) (nic.RxQueue, error) { return qcore.RxAt(d.rx, i, d.name) }

// Tx implements nic.Device.
func (d *Device) Tx(i int) (nic.TxQueue, error) { return qcore.TxAt(d.tx, i, d.name) }

// Link implements nic.Device: the interface's flags (up and running).
func (d *Device) Link() (nic.Link, error) {
	d.core.Mu.Lock()
	defer d.core.Mu.Unlock()
	if d.core.Closed {
		return nic.Link{}, nic.ErrClosed
	}
	ifr, err := unix.NewIfreq(d.ifname)
	if err != nil {
		return nic.Link{}, err
	}
	if err := unix.IoctlIfreq(d.ctl, unix.SIOCGIFFLAGS, ifr); err != nil {
		return nic.Link{}, fmt.Errorf("afxdp: %s flags: %w", d.ifname, err)
	}
	fl := ifr.Uint16()
	return nic.Link{Up: fl&unix.IFF_UP != 0 && fl&unix.IFF_RUNNING != 0, Reported: true}, nil
}

// Stats implements nic.Device.
func (d *Device) Stats() nic.Stats { return d.core.Stats(0) }

// Close implements nic.Device: the queues close (their operations then
// fail with nic.ErrClosed; operations outstanding on a queue bound to a
// CQ complete there as flushed), the XDP program is detached, the
// sockets closed and the rings and UMEM unmapped.
func (d *Device) Close() error { return d.core.Close(nic.ErrClosed, nil, d.hw) }

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
	if d.ctl >= 0 {
		errs = append(errs, unix.Close(d.ctl))
		d.ctl = -1
	}
	if d.key != (ifKey{}) {
		openMu.Lock()
		delete(open, d.key)
		openMu.Unlock()
	}
	return errors.Join(errs...)
}
