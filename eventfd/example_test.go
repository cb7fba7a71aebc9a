package eventfd_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/vfnic/vfnic/eventfd"
)

// An eventfd counts events: writes add up until a reader takes them all at
// once, which is why a driver woken by an interrupt drains its whole ring.
// Wait parks the goroutine on Go's runtime poller, not an OS thread (a
// thread pinned to one CPU sleeps in the kernel instead).
func Example() {
	fd, err := eventfd.New()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer fd.Close()
	for range 3 {
		if err := fd.Add(1); err != nil { // three "interrupts"
			fmt.Println(err)
			return
		}
	}
	n, err := fd.Wait(context.Background(), time.Time{})
	fmt.Println("woken with", n, err)

	_, err = fd.Wait(context.Background(), time.Now().Add(10*time.Millisecond))
	fmt.Println("nothing pending:", errors.Is(err, eventfd.ErrTimeout))

	go func() { time.Sleep(10 * time.Millisecond); fd.Close() }()
	_, err = fd.Wait(context.Background(), time.Time{})
	fmt.Println("closed while waiting:", errors.Is(err, eventfd.ErrClosed))
	// Output:
	// woken with 3 <nil>
	// nothing pending: true
	// closed while waiting: true
}
