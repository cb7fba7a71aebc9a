package nic_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"time"

	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/nic"
	_ "github.com/vfnic/vfnic/nic/virtio" // registers the driver
)

func handle([]byte) {}

// serve receives frames from the NIC at addr until ctx ends: it lends the
// device every buffer, sleeps until frames arrive (the queue arms its
// MSI-X vector, polls once more, then parks on the eventfd) and hands each
// buffer back without a copy. Every error is returned with what failed, as
// the vfnic command does.
func serve(ctx context.Context, addr string) error {
	dev, err := nic.Open(ctx, addr, nic.Config{}) // binds it to vfio-pci
	if err != nil {
		return fmt.Errorf("open %s: %w", addr, err)
	}
	defer dev.Close()
	rx, err := dev.Rx(0)
	if err != nil {
		return err
	}
	for { // lend every buffer to the device
		if err := rx.PostRecv(nil); errors.Is(err, nic.ErrFull) {
			break
		} else if err != nil {
			return fmt.Errorf("post receive buffers: %w", err)
		}
	}
	if err := rx.Flush(); err != nil {
		return err
	}
	comps := make([]nic.Completion, 64)
	for {
		n, err := rx.SRead(ctx, comps, 1, time.Second)
		switch {
		case ctx.Err() != nil:
			return nil // asked to stop
		case errors.Is(err, nic.ErrTimeout):
			continue // nothing arrived within a second
		case err != nil:
			return fmt.Errorf("receive: %w", err)
		}
		for _, c := range comps[:n] {
			if c.Err != nil {
				// An entry the device should not have written; the
				// driver consumed it and recycled its buffer.
				log.Printf("bad completion: %v", c.Err)
				continue
			}
			handle(c.Data)                                // the frame, in DMA memory
			if err := rx.Repost(c.Buf, nil); err != nil { // the buffer goes back to the device
				return err
			}
		}
		if err := rx.Flush(); err != nil {
			return err
		}
	}
}

// Receive frames from a NIC, stopping on Ctrl-C; errors end the program
// with a message and status 1, as vfnic's own commands do.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := serve(ctx, "0000:00:04.0"); err != nil {
		fmt.Fprintf(os.Stderr, "myserver: %v\n", err)
		os.Exit(1)
	}
}

// Read a NIC's completions libfabric style, through a completion queue
// bound to queue pair 0.
func Example_completionQueue() {
	if err := readCQ(context.Background(), "0000:00:04.0"); err != nil {
		fmt.Fprintf(os.Stderr, "myserver: %v\n", err)
		os.Exit(1)
	}
}

func readCQ(ctx context.Context, addr string) error {
	c, err := cq.New(cq.Attr{Size: 1024, WaitObj: cq.WaitFD}, cq.Limits{})
	if err != nil {
		return err
	}
	defer c.Close()
	dev, err := nic.Open(ctx, addr, nic.Config{})
	if err != nil {
		return fmt.Errorf("open %s: %w", addr, err)
	}
	defer dev.Close() // runs before c.Close: a CQ with bound queues is busy
	if err := dev.BindCQ(c, 0, nic.Recv|nic.Send); err != nil {
		return err
	}
	ents := make([]cq.Entry, 32)
	n, err := c.SRead(ctx, ents, 1, time.Second)
	if err != nil && !errors.Is(err, cq.ErrAgain) { // ErrAgain: nothing within a second
		return fmt.Errorf("read CQ: %w", err)
	}
	for _, e := range ents[:n] {
		fmt.Println(e.Context, e.Len, e.Flags)
	}
	return nil
}
