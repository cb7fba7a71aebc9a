package lcore_test

import (
	"context"
	"fmt"
	"time"

	"github.com/vfnic/vfnic/lcore"
	"github.com/vfnic/vfnic/lcore/lcoretest"
	"github.com/vfnic/vfnic/nic"
)

// A receive loop on a polling core, as a server runs one per queue: the
// core's thread is pinned to the process's last allowed CPU, polls while
// frames arrive, and sleeps on the queue's interrupt once the queue has
// been idle for the default 300 µs (Adaptive, the zero Mode). Here a
// software queue stands in for dev.Rx(0) of an open nic.Device.
func Example() {
	rx, err := lcoretest.New(0, 256) // dev.Rx(0)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer rx.Close()

	cpus, err := lcore.AllowedCPUs()
	if err != nil {
		fmt.Println(err)
		return
	}
	core, err := lcore.New(lcore.Config{CPU: cpus[len(cpus)-1]})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer core.Close() // before the device's Close

	frames, bytes := 0, 0
	done := make(chan struct{})
	err = core.AddQueue(rx, func(q nic.Queue, batch []nic.Completion) error {
		for _, c := range batch { // on the core's thread
			if c.Err != nil {
				continue // a bad device entry, already recycled
			}
			frames++
			bytes += c.Len
			if err := rx.Repost(c.Buf, nil); err != nil { // the buffer goes back; the core flushes once per round
				return err
			}
		}
		if frames == 1000 {
			close(done)
		}
		return nil
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := core.Start(context.Background()); err != nil {
		fmt.Println(err)
		return
	}
	for range 10 {
		// The device writes 100 completions once the core has read the
		// last 100: with 256 buffers none is dropped, however late the
		// core's thread runs.
		for rx.Pending() > 0 {
			time.Sleep(time.Millisecond)
		}
		rx.Inject(100)
	}
	<-done
	if err := core.Close(); err != nil {
		fmt.Println(err)
		return
	}
	st := core.Stats()
	fmt.Printf("%d frames, %d bytes; %d completions read by the core\n", frames, bytes, st.Completions)
	// Output:
	// 1000 frames, 64000 bytes; 1000 completions read by the core
}
