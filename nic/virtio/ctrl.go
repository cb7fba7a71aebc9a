package virtio

import (
	"context"
	"fmt"
	"time"

	"github.com/vfnic/vfnic/cq"
	cqring "github.com/vfnic/vfnic/cq/ring"
	"github.com/vfnic/vfnic/dma"
	"github.com/vfnic/vfnic/nic"
)

// Layout of the control command buffer: the class/command header, the
// command data and the device-written ack, each in its own element.
const (
	ctrlHdrOff  = 0
	ctrlDataOff = 16
	ctrlDataMax = 32
	ctrlAckOff  = 48
	ctrlBufLen  = 64
	// ctrlChain is the descriptors of a command: header, data and ack.
	ctrlChain = 3
)

// ctrlQueue is the control virtqueue: one synchronous command at a time,
// a three-element chain (header, data, ack) posted under buffer id 0 and
// polled to completion, since commands are rare and only made at Open.
type ctrlQueue struct {
	vq     *vq
	buf    dma.Slice
	broken bool
}

// command runs one control command and checks the device's ack.
func (c *ctrlQueue) command(ctx context.Context, class, cmd uint8, data []byte, timeout time.Duration) error {
	name := fmt.Sprintf("control command class %d command %d", class, cmd)
	switch {
	case c.broken:
		return fmt.Errorf("%w: %s: an earlier command never completed", nic.ErrDeviceFailed, name)
	case len(data) == 0 || len(data) > ctrlDataMax:
		return fmt.Errorf("%w: %s with %d data bytes", nic.ErrInvalid, name, len(data))
	}
	b := c.buf.Bytes
	b[ctrlHdrOff], b[ctrlHdrOff+1] = class, cmd
	copy(b[ctrlDataOff:], data)
	b[ctrlAckOff] = 0xff
	segs := []seg{
		{addr: c.buf.IOVA + ctrlHdrOff, len: 2},
		{addr: c.buf.IOVA + ctrlDataOff, len: uint32(len(data))},
		{addr: c.buf.IOVA + ctrlAckOff, len: 1, flags: descWrite},
	}
	id, ok := c.vq.reserve(&cqring.Op{Len: 1, Flags: cq.FlagRecv | cq.FlagMsg}, len(segs))
	if !ok || c.vq.room() < 0 {
		c.broken = true
		return fmt.Errorf("%w: %s: no free descriptor", nic.ErrDeviceFailed, name)
	}
	c.vq.addChain(id, segs)
	c.vq.flush()
	deadline := time.Now().Add(timeout)
	var done cqring.Completion
	for {
		got := c.vq.next(&done)
		c.vq.publishUsed()
		if got && done.Err == 0 {
			break
		}
		if got {
			c.broken = true
			return fmt.Errorf("%w: %s: %v", nic.ErrDeviceFailed, name, completionError(&done))
		}
		if !time.Now().Before(deadline) || ctx.Err() != nil {
			c.broken = true
			return fmt.Errorf("%w: %s: no completion in %v (%v)", nic.ErrDeviceFailed, name, timeout, ctx.Err())
		}
		time.Sleep(20 * time.Microsecond)
	}
	if ack := b[ctrlAckOff]; ack != ctrlAckOK {
		return fmt.Errorf("%w: %s refused by the device (ack %d)", nic.ErrNotSupported, name, ack)
	}
	return nil
}
