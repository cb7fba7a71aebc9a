package virtio

import (
	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/nic"
	qcore "github.com/vfnic/vfnic/nic/internal/queue"
)

// BindCQ implements nic.Device. Entry.Queue is the virtqueue index: 2i
// for the receive queue of pair i, 2i+1 for its transmit queue.
func (d *Device) BindCQ(c *cq.CQ, i int, dir nic.Direction) error {
	return d.core.BindCQ(c, i, dir, nil, d.unbind)
}

// unbind gives a queue its own completions and interrupt back.
func (d *Device) unbind(s *qcore.Source) error {
	d.core.Mu.Lock()
	defer d.core.Mu.Unlock()
	return d.core.Unbind(s, false)
}
