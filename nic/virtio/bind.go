package virtio

import (
	"fmt"

	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/nic"
	qcore "github.com/vfnic/vfnic/nic/internal/queue"
)

// BindCQ implements nic.Device. Entry.Queue is the virtqueue index: 2i
// for the receive queue of pair i, 2i+1 for its transmit queue.
func (d *Device) BindCQ(c *cq.CQ, i int, dir nic.Direction) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := qcore.CheckBind(d.name, d.closed, c, i, len(d.rx), dir); err != nil {
		return err
	}
	var srcs []*cqSource
	if dir&nic.Recv != 0 {
		srcs = append(srcs, &cqSource{dev: d, rx: d.rx[i], q: &d.rx[i].queue})
	}
	if dir&nic.Send != 0 {
		srcs = append(srcs, &cqSource{dev: d, tx: d.tx[i], q: &d.tx[i].queue})
	}
	for _, s := range srcs {
		s.qnum = uint32(s.q.vq.qidx)
		s.q.Mu.Lock()
		bound := s.q.Src != nil
		s.q.Mu.Unlock()
		if bound {
			return fmt.Errorf("%w: %s: queue %s already feeds a CQ", nic.ErrInvalid, d.name, s.q.vq.name)
		}
	}
	for _, s := range srcs {
		if err := c.Driver().Bind(); err != nil {
			return err
		}
		if err := c.Driver().AddSource(s.source()); err != nil {
			c.Driver().Unbind()
			return err
		}
		d.bound = append(d.bound, c)
		s.q.Mu.Lock()
		s.q.Src = s
		s.q.vq.disarm()
		s.q.Mu.Unlock()
		s.irq = c.Driver().Interrupt()
		if efd := s.irq; efd != nil && s.q.Vector >= 0 {
			if err := d.wire(s.q.Vector, efd.Fd()); err != nil {
				return err
			}
		}
	}
	return nil
}

// unbind gives a queue its own completions and interrupt back.
func (d *Device) unbind(s *cqSource) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	s.q.Mu.Lock()
	if s.q.Src == s {
		s.q.Src = nil
		// Flushed completions the CQ did not read go with it (a closed
		// CQ loses what it held); Poll must not report them instead.
		s.q.canceled.Drop()
	}
	s.q.Mu.Unlock()
	if d.closed || s.q.Vector < 0 || s.q.EFD == nil {
		return nil
	}
	return d.wire(s.q.Vector, s.q.EFD.Fd())
}

// wire points MSI-X vector v at fd, rewiring all vectors in one SET_IRQS
// call with the same count (MSI-X cannot be resized while enabled).
// Called with d.mu held.
func (d *Device) wire(v, fd int) error {
	if v < 0 || v >= len(d.vectorFDs) {
		return fmt.Errorf("%w: %s: MSI-X vector %d of %d", nic.ErrInvalid, d.name, v, len(d.vectorFDs))
	}
	d.vectorFDs[v] = fd
	return d.vdev.EnableMSIX(d.vectorFDs)
}
