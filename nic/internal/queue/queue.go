// Package queue is the part of a NIC driver's queue that does not depend
// on the device: its identity (name, pair index, interrupt vector), its
// counters and the nic.Queue methods built on them alone. A driver embeds
// a Core in its queue type and supplies how to post, read, publish and
// arm.
package queue

import (
	"sync/atomic"

	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/nic/internal/irq"
	"github.com/vfnic/vfnic/vfio"
)

// Core is what every driver's queue holds besides its ring: set once when
// the queue is made, then read without a lock, except the counters, which
// are atomic so that Stats needs none.
type Core struct {
	// Name is the driver's name for the queue ("rx0"), shown in errors.
	Name string
	// Pair is the queue pair's index (nic.Queue.Index, Completion.Queue).
	Pair int
	// Vector is the queue's MSI-X vector, -1 for none.
	Vector int
	// VDev is the device, to steer the vector; nil without VFIO.
	VDev *vfio.Device

	// Counters of nic.QueueStats. Packets, Bytes and Errs count
	// completions read (Count), Interrupts the eventfd's counts taken,
	// Notifies the doorbells written and Suppressed those the device said
	// it did not need.
	Packets, Bytes, Errs, Interrupts, Notifies, Suppressed atomic.Uint64
}

// Index implements nic.Queue.
func (c *Core) Index() int { return c.Pair }

// SteerInterrupt implements nic.InterruptSteerer.
func (c *Core) SteerInterrupt(cpu int) error {
	return irq.Steer(c.VDev, c.Vector, cpu, c.Name)
}

// Stats implements nic.Queue.
func (c *Core) Stats() nic.QueueStats {
	return nic.QueueStats{
		Packets: c.Packets.Load(), Bytes: c.Bytes.Load(), Errors: c.Errs.Load(),
		Notifies: c.Notifies.Load(), Suppressed: c.Suppressed.Load(), Interrupts: c.Interrupts.Load(),
	}
}

// Count adds a batch of n completions read, errs of them errors, carrying
// bytes bytes, to the counters: one atomic add each, per batch.
func (c *Core) Count(n, errs int, bytes uint64) {
	if n == 0 {
		return
	}
	c.Packets.Add(uint64(n - errs))
	c.Bytes.Add(bytes)
	if errs > 0 {
		c.Errs.Add(uint64(errs))
	}
}
