package queue

import (
	"errors"
	"fmt"
	"net"
	"sync"

	"github.com/vfnic/vfnic/cq"
	cqring "github.com/vfnic/vfnic/cq/ring"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/nic/internal/owner"
)

// Device is the part of a NIC device every driver has: its lock and
// closed state, its queues as the core sees them, its MSI-X wiring and
// the CQs its queues feed; with them BindCQ, a CQ letting go of a queue,
// Stats and the order of a close. A driver keeps one in an unexported
// field and adds its registers.
type Device struct {
	// Mu guards Closed and the wiring, and serialises BindCQ, Close and
	// the driver's own register reads (link, configuration).
	Mu     sync.Mutex
	Closed bool
	// Name is the device's, for errors.
	Name string
	// Rx and Tx are the queues of each pair, in pair order.
	Rx, Tx []*Queue
	// FDs is what each MSI-X vector signals now (BindCQ rewires).
	FDs []int
	// Enable wires every vector to FDs in one call (MSI-X cannot be
	// resized while enabled); nil without VFIO.
	Enable func(fds []int) error

	bound    []*cq.CQ // one entry per queue bound
	closeErr error
}

// Wire points MSI-X vector vec at fd. Called locked.
func (d *Device) Wire(vec, fd int) error {
	if vec < 0 || vec >= len(d.FDs) {
		return fmt.Errorf("%w: %s: MSI-X vector %d of %d", nic.ErrInvalid, d.Name, vec, len(d.FDs))
	}
	d.FDs[vec] = fd
	if d.Enable == nil {
		return nil
	}
	return d.Enable(d.FDs)
}

// BindCQ implements nic.Device.BindCQ: CheckBind's checks, then rule (nil,
// or the driver's own on the queues picked), then Bind.
func (d *Device) BindCQ(c *cq.CQ, i int, dir nic.Direction, rule func(qs []*Queue) error, unbind func(*Source) error) error {
	d.Mu.Lock()
	defer d.Mu.Unlock()
	if err := CheckBind(d.Name, d.Closed, c, i, len(d.Rx), dir); err != nil {
		return err
	}
	var qs []*Queue
	if dir&nic.Recv != 0 {
		qs = append(qs, d.Rx[i])
	}
	if dir&nic.Send != 0 {
		qs = append(qs, d.Tx[i])
	}
	if rule != nil {
		if err := rule(qs); err != nil {
			return err
		}
	}
	return d.Bind(c, qs, unbind)
}

// Bind makes each of qs feed c: a queue that already feeds one is
// refused before anything changes; each then gets a Source in c, its
// interrupt off and its vector wired to c's eventfd. unbind is the
// device's way back (Source.Unbind), which calls Unbind. Called locked.
func (d *Device) Bind(c *cq.CQ, qs []*Queue, unbind func(*Source) error) error {
	for _, q := range qs {
		if q.Bound() {
			return fmt.Errorf("%w: %s: queue %s already feeds a CQ", nic.ErrInvalid, d.Name, q.Name)
		}
	}
	drv := c.Driver()
	for _, q := range qs {
		s := &Source{q: q, unbind: unbind}
		if err := drv.Bind(); err != nil {
			return err
		}
		if err := drv.AddSource(cqring.NewQueueSource(s, q.Name, q.QNum)); err != nil {
			drv.Unbind()
			return err
		}
		d.bound = append(d.bound, c)
		s.irq = drv.Interrupt()
		q.Mu.Lock()
		q.Src = s
		q.ring.Disarm()
		q.Mu.Unlock()
		if s.irq != nil && q.Vector >= 0 {
			if err := d.Wire(q.Vector, s.irq.Fd()); err != nil {
				return err
			}
		}
	}
	return nil
}

// Unbind gives s's queue its own completions back and, unless the device
// is closed or keep (the vector still serves another queue bound to the
// CQ), its own interrupt. Flushed completions the CQ did not read go with
// it (a closed CQ loses what it held); Poll must not report them instead.
// Called locked.
func (d *Device) Unbind(s *Source, keep bool) error {
	q := s.q
	q.Mu.Lock()
	if q.Src == s {
		q.Src = nil
		q.canceled.Drop()
	}
	q.Mu.Unlock()
	if d.Closed || keep || q.Vector < 0 || q.EFD == nil {
		return nil
	}
	return d.Wire(q.Vector, q.EFD.Fd())
}

// Close tears the device down once: the queues close (CloseQueue, why),
// then the driver's hw (reset, interrupts, DMA memory, VFIO), then the
// CQs the queues fed are let go, and own gives the PCI function back. A
// later call returns the first one's error.
func (d *Device) Close(why error, own *owner.Owner, hw func() error) error {
	d.Mu.Lock()
	defer d.Mu.Unlock()
	if d.Closed {
		return d.closeErr
	}
	d.Closed = true
	d.closeErr = errors.Join(d.Teardown(why, hw), own.GiveBack(why))
	return d.closeErr
}

// Teardown closes the queues with why, runs hw and lets the CQs go: what
// Close does besides giving the function back, for a failed Open.
func (d *Device) Teardown(why error, hw func() error) error {
	for _, q := range d.Rx {
		q.CloseQueue(why)
	}
	for _, q := range d.Tx {
		q.CloseQueue(why)
	}
	for _, q := range append(d.Rx[:len(d.Rx):len(d.Rx)], d.Tx...) {
		q.unforward() // before hw closes what it waits on
	}
	err := hw()
	d.UnbindAll()
	return err
}

// UnbindAll lets every CQ the queues fed go: the CQ may close now; its
// sources read nothing more.
func (d *Device) UnbindAll() {
	for _, c := range d.bound {
		c.Driver().Unbind()
	}
	d.bound = nil
}

// Stats adds up the queues' counters (nic.Device.Stats), with
// configuration interrupts cfg.
func (d *Device) Stats(cfg uint64) nic.Stats {
	s := nic.Stats{ConfigInterrupts: cfg}
	for _, q := range d.Rx {
		qs := q.Stats()
		s.RxQueues = append(s.RxQueues, qs)
		s.Rx.Add(qs)
	}
	for _, q := range d.Tx {
		qs := q.Stats()
		s.TxQueues = append(s.TxQueues, qs)
		s.Tx.Add(qs)
	}
	return s
}

// Info returns a copy of info the caller may change (nic.Device.Info).
func Info(info nic.Info, mac net.HardwareAddr) nic.Info {
	info.MAC = append(net.HardwareAddr(nil), mac...)
	info.Features = append([]string(nil), info.Features...)
	return info
}

// RxAt returns qs[i] as a nic.RxQueue (nic.Device.Rx), or QueueAt's error.
func RxAt[Q nic.RxQueue](qs []Q, i int, dev string) (nic.RxQueue, error) {
	q, err := QueueAt(qs, i, dev, "receive")
	if err != nil {
		return nil, err
	}
	return q, nil
}

// TxAt returns qs[i] as a nic.TxQueue (nic.Device.Tx), or QueueAt's error.
func TxAt[Q nic.TxQueue](qs []Q, i int, dev string) (nic.TxQueue, error) {
	q, err := QueueAt(qs, i, dev, "transmit")
	if err != nil {
		return nil, err
	}
	return q, nil
}
