package cq_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/vfnic/vfnic/cq"
)

// The waiting rules of SRead, on a CQ that nothing feeds: a timeout is
// ErrAgain, like fi_cq_sread's -FI_EAGAIN; a Signal wakes the reader (or,
// sent first, the next one) with ErrAgain too; a read on a closed CQ is
// cq.ErrClosed. For a CQ fed by a device, see the nic and cq/qpsim examples.
func ExampleCQ_SRead() {
	c, err := cq.New(cq.Attr{Size: 16, WaitObj: cq.WaitFD}, cq.Limits{})
	if err != nil {
		fmt.Println("cq.New:", err)
		return
	}
	ctx := context.Background()
	ents := make([]cq.Entry, 4)

	n, err := c.Read(ents)
	fmt.Println("Read:", n, errors.Is(err, cq.ErrAgain))

	start := time.Now()
	n, err = c.SRead(ctx, ents, 1, 20*time.Millisecond)
	fmt.Println("SRead, timeout:", n, errors.Is(err, cq.ErrAgain), time.Since(start) >= 20*time.Millisecond)

	if err := c.Signal(); err != nil {
		fmt.Println("Signal:", err)
		return
	}
	start = time.Now()
	n, err = c.SRead(ctx, ents, 1, -1) // forever, but for the Signal
	fmt.Println("SRead, signaled:", n, errors.Is(err, cq.ErrAgain), time.Since(start) < time.Second)

	if err := c.Close(); err != nil {
		fmt.Println("Close:", err)
		return
	}
	_, err = c.Read(ents)
	fmt.Println("after Close:", errors.Is(err, cq.ErrClosed))
	// Output:
	// Read: 0 true
	// SRead, timeout: 0 true true
	// SRead, signaled: 0 true true
	// after Close: true
}

// An Attr asks for what the application needs; cq.New rounds it to what
// the provider gives, and a CQ without a wait object refuses blocking reads.
func ExampleNew() {
	c, err := cq.New(cq.Attr{Size: 100}, cq.Limits{})
	if err != nil {
		fmt.Println("cq.New:", err)
		return
	}
	defer c.Close()
	_, err = c.SRead(context.Background(), make([]cq.Entry, 1), 1, 0)
	fmt.Println(err, errors.Is(err, cq.ErrNoWait))
	_, err = cq.New(cq.Attr{Size: -1}, cq.Limits{})
	fmt.Println(errors.Is(err, cq.ErrInvalid))
	// Output:
	// cq: sread on a CQ without a wait object true
	// true
}
