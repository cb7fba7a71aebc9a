package nic_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/nic/softnic"
)

// Send frames written in place, on a software NIC pair: a buffer's first
// frame is written whole, and as a buffer keeps what its last frame left,
// the frames after it write only the byte that changes.
func ExampleTxQueue_SendFunc() {
	a, b, err := softnic.Pair(nic.Config{QueueSize: 4})
	if err != nil {
		panic(err)
	}
	defer a.Close()
	defer b.Close()
	tx, _ := a.Tx(0)
	rx, _ := b.Rx(0)
	for rx.PostRecv(nil) == nil {
	}
	_ = rx.Flush()

	frame := make([]byte, 60)
	copy(frame, b.MAC())
	copy(frame[6:], a.MAC())
	binary.BigEndian.PutUint16(frame[12:], 0x88b5)
	copy(frame[14:], "frame #0")
	comps := make([]nic.Completion, 4)
	for i := range 6 {
		err := tx.SendFunc(len(frame), i, func(buf []byte) {
			if binary.BigEndian.Uint16(buf[12:]) != 0x88b5 {
				copy(buf, frame) // a buffer never used: zeros
			}
			buf[21] = byte('0' + i)
		})
		if err != nil {
			panic(err)
		}
		_ = tx.Flush()
		for tx.Poll(comps) > 0 { // this device completes sends at Flush
		}
		n, _ := rx.SRead(context.Background(), comps, 1, time.Second)
		for _, c := range comps[:n] {
			fmt.Println(string(c.Data[14:22]))
			_ = rx.Repost(c.Buf, nil)
		}
		_ = rx.Flush()
	}
	// Output:
	// frame #0
	// frame #1
	// frame #2
	// frame #3
	// frame #4
	// frame #5
}
