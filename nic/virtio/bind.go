package virtio

import (
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
	var qs []*qcore.Queue
	if dir&nic.Recv != 0 {
		qs = append(qs, &d.rx[i].Queue)
	}
	if dir&nic.Send != 0 {
		qs = append(qs, &d.tx[i].Queue)
	}
	return d.vec.Bind(c, qs, d.unbind)
}

// unbind gives a queue its own completions and interrupt back.
func (d *Device) unbind(s *qcore.Source) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.vec.Unbind(s, d.closed, false)
}
