package qpsim_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/cq/qpsim"
)

// Send a frame from one queue pair to another on the software device and
// read both completions through a completion queue, as a server reads a
// NIC's: the device thread writes 64-byte owner-bit entries into the CQ's
// ring and SRead sleeps on the CQ's eventfd until they arrive. The device
// delivers the frame before it completes the send.
func Example() {
	dev, err := qpsim.New(qpsim.Config{})
	if err != nil {
		fmt.Println("sim:", err)
		return
	}
	defer dev.Close()
	c, err := dev.OpenCQ(cq.Attr{Size: 64, Format: cq.FormatMsg, WaitObj: cq.WaitFD})
	if err != nil {
		fmt.Println("open CQ:", err)
		return
	}
	defer c.Close()
	a, err := dev.NewQP(qpsim.QPConfig{SendCQ: c, RecvCQ: c})
	if err != nil {
		fmt.Println("QP:", err)
		return
	}
	defer a.Close()
	b, err := dev.NewQP(qpsim.QPConfig{SendCQ: c, RecvCQ: c})
	if err != nil {
		fmt.Println("QP:", err)
		return
	}
	defer b.Close()

	mem, err := dev.Alloc(4096) // receive buffers live in device memory
	if err != nil {
		fmt.Println("alloc:", err)
		return
	}
	defer mem.Close()
	if err := b.PostRecv("rx-0", mem.Bytes()[:2048], qpsim.RecvOpts{}); err != nil {
		fmt.Println("post:", err)
		return
	}
	if err := a.Send(b.Addr(), "tx-0", []byte("hello, wire"), qpsim.SendOpts{}); err != nil {
		fmt.Println("send:", err)
		return
	}

	ctx := context.Background()
	ents := make([]cq.Entry, 8)
	for got := 0; got < 2; {
		n, err := c.SRead(ctx, ents, 1, time.Second)
		if err != nil {
			fmt.Println("read:", err)
			return
		}
		for _, e := range ents[:n] {
			fmt.Printf("%v: %d bytes, recv=%v\n", e.Context, e.Len, e.Flags&cq.FlagRecv != 0)
		}
		got += n
	}
	fmt.Printf("%q\n", mem.Bytes()[:11])
	// Output:
	// rx-0: 11 bytes, recv=true
	// tx-0: 11 bytes, recv=false
	// "hello, wire"
}

// A frame longer than the posted buffer completes in error. The error stays
// in completion order: Read returns cq.ErrAvail when the error entry is at
// the head of the queue, and ReadErr returns it.
func Example_errorCompletion() {
	dev, err := qpsim.New(qpsim.Config{})
	if err != nil {
		fmt.Println("sim:", err)
		return
	}
	defer dev.Close()
	c, err := dev.OpenCQ(cq.Attr{Size: 64, WaitObj: cq.WaitFD})
	if err != nil {
		fmt.Println("open CQ:", err)
		return
	}
	defer c.Close()
	tx, err := dev.OpenCQ(cq.Attr{Size: 64})
	if err != nil {
		fmt.Println("open CQ:", err)
		return
	}
	defer tx.Close()
	qp, err := dev.NewQP(qpsim.QPConfig{SendCQ: tx, RecvCQ: c})
	if err != nil {
		fmt.Println("QP:", err)
		return
	}
	defer qp.Close()
	mem, err := dev.Alloc(4096)
	if err != nil {
		fmt.Println("alloc:", err)
		return
	}
	defer mem.Close()
	if err := qp.PostRecv("small", mem.Bytes()[:16], qpsim.RecvOpts{}); err != nil {
		fmt.Println("post:", err)
		return
	}
	if err := qp.Send(qp.Addr(), nil, make([]byte, 100), qpsim.SendOpts{}); err != nil {
		fmt.Println("send:", err)
		return
	}

	ents := make([]cq.Entry, 8)
	_, err = c.SRead(context.Background(), ents, 1, time.Second)
	fmt.Println("SRead:", err, errors.Is(err, cq.ErrAvail))
	var e cq.ErrEntry
	if err := c.ReadErr(&e); err != nil {
		fmt.Println("ReadErr:", err)
		return
	}
	fmt.Printf("%v: %v (truncated: %v), %d bytes kept, %d lost\n", e.Context, e.Err, errors.Is(e.Err, cq.ETRUNC), e.Len, e.OLen)
	// Output:
	// SRead: cq: error completion available true
	// small: truncation error (truncated: true), 16 bytes kept, 84 lost
}
