package queue

import (
	"fmt"
	"net"

	"github.com/vfnic/vfnic/cq"
	cqring "github.com/vfnic/vfnic/cq/ring"
	"github.com/vfnic/vfnic/nic"
)

// Vectors is a device's MSI-X wiring and the CQs its queues feed: what
// BindCQ, a CQ letting go of a queue and the device's close share. The
// device's lock guards it.
type Vectors struct {
	// Name is the device's, for errors.
	Name string
	// FDs is what each MSI-X vector signals now (Bind rewires).
	FDs []int
	// Enable wires every vector to FDs in one call (MSI-X cannot be
	// resized while enabled); nil without VFIO.
	Enable func(fds []int) error

	bound []*cq.CQ // one entry per queue bound
}

// Wire points MSI-X vector v at fd.
func (v *Vectors) Wire(vec, fd int) error {
	if vec < 0 || vec >= len(v.FDs) {
		return fmt.Errorf("%w: %s: MSI-X vector %d of %d", nic.ErrInvalid, v.Name, vec, len(v.FDs))
	}
	v.FDs[vec] = fd
	if v.Enable == nil {
		return nil
	}
	return v.Enable(v.FDs)
}

// Bind makes each of qs feed c (nic.Device.BindCQ, after CheckBind): a
// queue that already feeds one is refused before anything changes; each
// then gets a Source in c, its interrupt off and its vector wired to c's
// eventfd. unbind is the device's way back (Source.Unbind), which takes
// the device's lock and calls Unbind.
func (v *Vectors) Bind(c *cq.CQ, qs []*Queue, unbind func(*Source) error) error {
	for _, q := range qs {
		if q.Bound() {
			return fmt.Errorf("%w: %s: queue %s already feeds a CQ", nic.ErrInvalid, v.Name, q.Name)
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
		v.bound = append(v.bound, c)
		s.irq = drv.Interrupt()
		q.Mu.Lock()
		q.Src = s
		q.ring.Disarm()
		q.Mu.Unlock()
		if s.irq != nil && q.Vector >= 0 {
			if err := v.Wire(q.Vector, s.irq.Fd()); err != nil {
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
func (v *Vectors) Unbind(s *Source, closed, keep bool) error {
	q := s.q
	q.Mu.Lock()
	if q.Src == s {
		q.Src = nil
		q.canceled.Drop()
	}
	q.Mu.Unlock()
	if closed || keep || q.Vector < 0 || q.EFD == nil {
		return nil
	}
	return v.Wire(q.Vector, q.EFD.Fd())
}

// UnbindAll lets every CQ bound go (the device's close, after its queues
// closed): the CQ may close now; its sources read nothing more.
func (v *Vectors) UnbindAll() {
	for _, c := range v.bound {
		c.Driver().Unbind()
	}
	v.bound = nil
}

// Stats adds up the queues' counters (nic.Device.Stats), with
// configuration interrupts cfg.
func Stats[R, T interface{ Stats() nic.QueueStats }](cfg uint64, rx []R, tx []T) nic.Stats {
	s := nic.Stats{ConfigInterrupts: cfg}
	for _, q := range rx {
		qs := q.Stats()
		s.RxQueues = append(s.RxQueues, qs)
		s.Rx.Add(qs)
	}
	for _, q := range tx {
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
