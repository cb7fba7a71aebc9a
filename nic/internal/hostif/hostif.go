// Package hostif is what the host device drivers (nic/afxdp,
// nic/afpacket) share besides the queue core: the Linux network interface
// they open through sockets in the calling thread's namespace (its
// lookup, link state and driver name through a control socket) and the
// nic.Device accessors over their queues.
package hostif

import (
	"fmt"
	"net"
	"strings"

	"github.com/vfnic/vfnic/nic"
	qcore "github.com/vfnic/vfnic/nic/internal/queue"
	"golang.org/x/sys/unix"
)

// Iface is a network interface as a host device opened it.
type Iface struct {
	Name  string
	Index int
	MAC   net.HardwareAddr
	MTU   int
	// Ctl is a UDP socket in the interface's namespace, for ioctls.
	Ctl int
}

// Open looks up interface name for driver drv ("afxdp"): noIface (wrapped,
// with the name) when it does not exist.
func Open(drv, name string, noIface error) (*Iface, error) {
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		if strings.Contains(err.Error(), "no such network interface") {
			return nil, fmt.Errorf("%w: %q", noIface, name)
		}
		return nil, fmt.Errorf("%s: %s: %w", drv, name, err)
	}
	ctl, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%s: control socket: %w", drv, err)
	}
	return &Iface{Name: name, Index: ifc.Index, MAC: ifc.HardwareAddr, MTU: ifc.MTU, Ctl: ctl}, nil
}

// Model is kind followed by the interface's kernel driver ("AF_XDP on
// veth"), or kind alone when the kernel does not say.
func (f *Iface) Model(kind string) string {
	if di, err := unix.IoctlGetEthtoolDrvinfo(f.Ctl, f.Name); err == nil {
		return kind + " on " + unix.ByteSliceToString(di.Driver[:])
	}
	return kind
}

// Link reads the interface's flags: up and running.
func (f *Iface) Link() (nic.Link, error) {
	ifr, err := unix.NewIfreq(f.Name)
	if err != nil {
		return nic.Link{}, err
	}
	if err := unix.IoctlIfreq(f.Ctl, unix.SIOCGIFFLAGS, ifr); err != nil {
		return nic.Link{}, fmt.Errorf("%s flags: %w", f.Name, err)
	}
	fl := ifr.Uint16()
	return nic.Link{Up: fl&unix.IFF_UP != 0 && fl&unix.IFF_RUNNING != 0, Reported: true}, nil
}

// Close closes the control socket.
func (f *Iface) Close() error {
	if f == nil || f.Ctl < 0 {
		return nil
	}
	err := unix.Close(f.Ctl)
	f.Ctl = -1
	return err
}

// Device is the nic.Device part of a host device: the queue core's
// device, the interface, the queues and the Info, with the accessors of
// nic.Device. A driver embeds it through an unexported alias; its state
// is reached with this package's functions (Core, Iface, Setup, Add),
// which are not promoted to the driver's exported type.
type Device[R nic.RxQueue, T nic.TxQueue] struct {
	core  qcore.Device
	iface *Iface
	desc  nic.Info
	rx    []R
	tx    []T
}

// Core is d's queue core device: the lock (Close, BindCQ, Link), the
// closed state, the queues as the core sees them and the CQs they feed.
func Core[R nic.RxQueue, T nic.TxQueue](d *Device[R, T]) *qcore.Device { return &d.core }

// IfaceOf is d's interface, nil before Setup.
func IfaceOf[R nic.RxQueue, T nic.TxQueue](d *Device[R, T]) *Iface { return d.iface }

// Setup records d's interface and, once open, what Info returns.
func Setup[R nic.RxQueue, T nic.TxQueue](d *Device[R, T], ifc *Iface, info nic.Info) {
	d.iface, d.desc = ifc, info
}

// Add adds a queue pair: its queues and the core's queues in them.
func Add[R nic.RxQueue, T nic.TxQueue](d *Device[R, T], rx R, rxq *qcore.Queue, tx T, txq *qcore.Queue) {
	d.rx, d.tx = append(d.rx, rx), append(d.tx, tx)
	d.core.Rx, d.core.Tx = append(d.core.Rx, rxq), append(d.core.Tx, txq)
}

// Info implements nic.Device.
func (d *Device[R, T]) Info() nic.Info { return qcore.Info(d.desc, d.desc.MAC) }

// MAC implements nic.Device.
func (d *Device[R, T]) MAC() net.HardwareAddr { return append(net.HardwareAddr(nil), d.desc.MAC...) }

// QueuePairs implements nic.Device.
func (d *Device[R, T]) QueuePairs() int { return len(d.rx) }

// Rx implements nic.Device.
func (d *Device[R, T]) Rx(i int) (nic.RxQueue, error) { return qcore.RxAt(d.rx, i, d.core.Name) }

// Tx implements nic.Device.
func (d *Device[R, T]) Tx(i int) (nic.TxQueue, error) { return qcore.TxAt(d.tx, i, d.core.Name) }

// Stats implements nic.Device.
func (d *Device[R, T]) Stats() nic.Stats { return d.core.Stats(0) }

// Link implements nic.Device: the interface's flags (up and running).
func (d *Device[R, T]) Link() (nic.Link, error) {
	d.core.Mu.Lock()
	defer d.core.Mu.Unlock()
	if d.core.Closed {
		return nic.Link{}, nic.ErrClosed
	}
	l, err := d.iface.Link()
	if err != nil {
		return l, fmt.Errorf("%s: %w", d.core.Name, err)
	}
	return l, nil
}
