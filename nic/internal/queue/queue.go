// Package queue is the part of a NIC driver's queue that does not depend
// on the device: its lock, closed state and the CQ it may feed, its
// identity (name, pair index, interrupt vector and eventfd), its counters
// and the nic.Queue methods built on them alone (Index, SteerInterrupt,
// Stats, Interrupt, WaitInterrupt). A driver embeds a Core in its queue
// type and supplies how to post, read, publish and arm.
package queue

import (
	"cmp"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vfnic/vfnic/eventfd"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/nic/internal/irq"
	"github.com/vfnic/vfnic/vfio"
)

// Core is what every driver's queue holds besides its ring. S is the
// driver's type of the cq.Source side of a queue (BindCQ). The identity
// fields are set once when the queue is made and then read without a
// lock; the counters are atomic so that Stats needs none.
type Core[S any] struct {
	// Mu guards the queue: Closed, CloseErr, Src and the driver's ring and
	// bookkeeping, whichever way the queue is read (Poll, or the CQ it
	// feeds).
	Mu sync.Mutex
	// Closed is set once by the driver's close; CloseErr is then what
	// operations return (nic.ErrClosed, or an error that also wraps
	// nic.ErrRemoved when the kernel took the device back).
	Closed   bool
	CloseErr error
	// Src is set while the queue feeds a cq.CQ.
	Src *S

	// EFD is the queue's interrupt eventfd, nil when it has none.
	EFD *eventfd.FD
	// NoIRQHint ends the error of a wait on a queue without an interrupt
	// (how to read it instead).
	NoIRQHint string
	// OnTook, when set, is told of each count of interrupts taken from
	// EFD (igb passes it on to the other queue of a pair sharing the
	// vector).
	OnTook func(n uint64)

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
func (c *Core[S]) Index() int { return c.Pair }

// SteerInterrupt implements nic.InterruptSteerer.
func (c *Core[S]) SteerInterrupt(cpu int) error {
	return irq.Steer(c.VDev, c.Vector, cpu, c.Name)
}

// Stats implements nic.Queue.
func (c *Core[S]) Stats() nic.QueueStats {
	return nic.QueueStats{
		Packets: c.Packets.Load(), Bytes: c.Bytes.Load(), Errors: c.Errs.Load(),
		Notifies: c.Notifies.Load(), Suppressed: c.Suppressed.Load(), Interrupts: c.Interrupts.Load(),
	}
}

// Count adds a batch of n completions read, errs of them errors, carrying
// bytes bytes, to the counters: one atomic add each, per batch.
func (c *Core[S]) Count(n, errs int, bytes uint64) {
	if n == 0 {
		return
	}
	c.Packets.Add(uint64(n - errs))
	c.Bytes.Add(bytes)
	if errs > 0 {
		c.Errs.Add(uint64(errs))
	}
}

// Bound reports whether the queue feeds a CQ (BindCQ).
func (c *Core[S]) Bound() bool {
	c.Mu.Lock()
	defer c.Mu.Unlock()
	return c.Src != nil
}

// ErrBound is nic.ErrBound with the queue's name: the error of reading
// directly a queue that feeds a CQ.
func (c *Core[S]) ErrBound() error { return fmt.Errorf("%w (queue %s)", nic.ErrBound, c.Name) }

// NoInterrupt is the error of a wait on a queue without an interrupt.
func (c *Core[S]) NoInterrupt() error {
	return fmt.Errorf("%w: queue %s has no interrupt%s", nic.ErrNotSupported, c.Name, c.NoIRQHint)
}

// Interrupt implements nic.Queue.
func (c *Core[S]) Interrupt() *eventfd.FD { return c.EFD }

// Took counts n interrupts taken from EFD.
func (c *Core[S]) Took(n uint64) {
	c.Interrupts.Add(n)
	if c.OnTook != nil && n > 0 {
		c.OnTook(n)
	}
}

// TakeLeft takes the interrupts left on EFD before an arm, so that a
// wait after it sleeps until a new one. Called unlocked: it may make a
// system call.
func (c *Core[S]) TakeLeft() {
	if c.EFD == nil {
		return
	}
	var left atomic.Uint64
	irq.TakeLeft(c.EFD, &left)
	c.Took(left.Load())
}

// WaitInterrupt implements nic.Queue: ErrNotSupported without an
// interrupt, nic.ErrBound for a queue that feeds a CQ, and once the queue
// closed, why.
func (c *Core[S]) WaitInterrupt(ctx context.Context, deadline time.Time) error {
	return c.WaitInterruptFor(ctx, deadline, nil)
}

// WaitInterruptFor is WaitInterrupt that returns, when ready is not nil,
// only once ready says so, looked at after each event of the interrupt
// (eventfd.FD.WaitFor): for a readiness that can last with nothing to
// read.
func (c *Core[S]) WaitInterruptFor(ctx context.Context, deadline time.Time, ready func() bool) error {
	if c.EFD == nil {
		return c.NoInterrupt()
	}
	if c.Bound() {
		return c.ErrBound()
	}
	var took atomic.Uint64
	var err error
	if ready != nil {
		err = irq.WaitFor(ctx, c.EFD, deadline, ready, &took)
	} else {
		err = irq.Wait(ctx, c.EFD, deadline, &took)
	}
	c.Took(took.Load())
	if err == nic.ErrClosed {
		c.Mu.Lock()
		defer c.Mu.Unlock()
		return cmp.Or(c.CloseErr, err)
	}
	return err
}
