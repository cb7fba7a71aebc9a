package nic_test

import (
	"context"
	"time"

	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/nic"
	_ "github.com/vfnic/vfnic/nic/virtio" // registers the driver
)

func handle([]byte) {}

// Receive frames from a NIC: lend the device every buffer, sleep until
// frames arrive (the queue arms its MSI-X vector, polls once more, then
// parks on the eventfd), hand each buffer back without a copy.
func Example() {
	ctx := context.Background()
	dev, err := nic.Open(ctx, "0000:00:04.0", nic.Config{}) // binds it to vfio-pci
	if err != nil {
		return
	}
	defer dev.Close()
	rx, _ := dev.Rx(0)
	for rx.PostRecv(nil) == nil {
	}
	_ = rx.Flush()
	comps := make([]nic.Completion, 64)
	n, _ := rx.SRead(ctx, comps, 1, time.Second)
	for _, c := range comps[:n] {
		if c.Err == nil {
			handle(c.Data)            // the frame, in DMA memory
			_ = rx.Repost(c.Buf, nil) // the buffer goes back to the device
		}
	}
	_ = rx.Flush()
}

// Read a NIC's completions libfabric style, through a completion queue
// bound to queue pair 0.
func Example_completionQueue() {
	ctx := context.Background()
	dev, err := nic.Open(ctx, "0000:00:04.0", nic.Config{})
	if err != nil {
		return
	}
	c, err := cq.New(cq.Attr{Size: 1024, WaitObj: cq.WaitFD}, cq.Limits{})
	if err != nil {
		return
	}
	defer c.Close()
	defer dev.Close() // before the CQ: a CQ with bound queues is busy
	if err := dev.BindCQ(c, 0, nic.Recv|nic.Send); err != nil {
		return
	}
	ents := make([]cq.Entry, 32)
	n, err := c.SRead(ctx, ents, 1, time.Second)
	_, _ = n, err
}
