package igb

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/nic"
)

// TestVectorModes: with QEMU's 10 vectors, 4 pairs get a vector per queue,
// 8 (and 9) a vector per pair, as Linux igb pairs them, and 16 none
// (NoQueueInterrupts): the IVAR entries, EIAC, Info and the queues'
// interrupts say so.
func TestVectorModes(t *testing.T) {
	d, f := newFakeDevice(t, Config{Config: nic.Config{QueuePairs: 4, QueueSize: 8}})
	require.Equal(t, uint32(0x8281), f.get(regIVAR0), "queue 0: rx vector 1, tx vector 2")
	require.Equal(t, uint32(0x1ff), f.get(regEIAC))
	require.Equal(t, 9, d.Info().Vectors)
	require.NotSame(t, d.rx[3].Interrupt(), d.tx[3].Interrupt())

	d, f = newFakeDevice(t, Config{Config: nic.Config{QueuePairs: 8, QueueSize: 8}})
	for i := 0; i < 8; i++ {
		v := uint32(1+i) | ivarValid
		require.Equal(t, v|v<<8, f.get(regIVAR0+4*uint32(i)), "pair %d: rx and tx on vector %d", i, 1+i)
		require.Same(t, d.rx[i].Interrupt(), d.tx[i].Interrupt(), "pair %d shares an eventfd", i)
		require.NotNil(t, d.rx[i].Interrupt())
	}
	require.Equal(t, uint32(0x1ff), f.get(regEIAC), "vectors 0-8 auto-clear")
	in := d.Info()
	require.Equal(t, 9, in.Vectors)
	require.Equal(t, 9, in.MaxQueuePairs)
	require.Contains(t, in.Features, "vector-per-pair")
	_, err := startFake(newFakeRegs(t), Config{Config: nic.Config{QueuePairs: 9, QueueSize: 8}})
	require.NoError(t, err, "9 pairs and the link fill 10 vectors")

	d, f = newFakeDevice(t, Config{Config: nic.Config{QueuePairs: 16, QueueSize: 8}, NoQueueInterrupts: true})
	for i := 0; i < 8; i++ {
		require.Zero(t, f.get(regIVAR0+4*uint32(i)), "no queue cause goes to a vector")
	}
	require.Equal(t, uint32(1), f.get(regEIAC), "vector 0 only")
	require.Equal(t, uint32(1), f.get(regEIMS))
	in = d.Info()
	require.Equal(t, 1, in.Vectors)
	require.Equal(t, 16, in.MaxQueuePairs)
	require.Contains(t, in.Features, "no-queue-interrupts")
	rx := d.rx[15]
	require.Nil(t, rx.Interrupt())
	require.ErrorIs(t, rx.Arm(1), nic.ErrNotSupported)
	require.ErrorIs(t, rx.WaitInterrupt(t.Context(), time.Now().Add(time.Millisecond)), nic.ErrNotSupported)
	_, err = rx.SRead(t.Context(), make([]nic.Completion, 1), 1, time.Millisecond)
	require.ErrorIs(t, err, nic.ErrNotSupported)
	require.Equal(t, 0, rx.Poll(make([]nic.Completion, 1)), "Poll works")
	c, err := cq.New(cq.Attr{Format: cq.FormatData, WaitObj: cq.WaitFD}, cq.Limits{})
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, d.BindCQ(c, 3, nic.Recv))
	_, err = c.SRead(t.Context(), make([]cq.Entry, 1), 1, 10*time.Second)
	require.ErrorIs(t, err, nic.ErrNotSupported, "a CQ fed by queues without a vector cannot sleep")
	require.NoError(t, d.Close())
}

// TestSharedVectorMask: on a shared vector, a read that masks the vector
// for one queue leaves it unmasked while the other queue is armed.
func TestSharedVectorMask(t *testing.T) {
	d, f := newFakeDevice(t, Config{Config: nic.Config{QueuePairs: 8, QueueSize: 16}})
	dev := newFakeNIC(t, d, f)
	rx, tx := d.rx[0], d.tx[0]
	fill(t, rx)
	require.NoError(t, rx.Arm(1))
	require.NoError(t, tx.Arm(1))
	require.Equal(t, uint32(1<<1), f.get(regEIMS)&(1<<1), "vector 1 unmasked")
	f.set(regEIMC, 0) // data-path writes land in the fake's memory: watch EIMC itself
	dev.receive(frameOf(0, 64))
	out := make([]nic.Completion, 4)
	require.Equal(t, 1, rx.Poll(out))
	require.NoError(t, rx.Repost(out[0].Buf, nil))
	require.Zero(t, f.get(regEIMC), "not masked: tx is armed")
	require.NoError(t, tx.Send(frameOf(1, 60), nil))
	require.NoError(t, tx.Flush())
	dev.transmit()
	require.Equal(t, 1, tx.Poll(out))
	require.Equal(t, uint32(1<<1), f.get(regEIMC), "masked once neither queue is armed")
}

// TestSharedVectorWakeups: the receive and transmit queues of a pair
// sleep on one eventfd. An interrupt taken by one is passed on to the
// other when it is armed, so each SRead returns its completion whichever
// took the interrupt; a passed-on wake-up is not passed back (no
// ping-pong).
func TestSharedVectorWakeups(t *testing.T) {
	d, f := newFakeDevice(t, Config{Config: nic.Config{QueuePairs: 8, QueueSize: 16}})
	dev := newFakeNIC(t, d, f)
	rx, tx := d.rx[0], d.tx[0]
	efd := rx.Interrupt()
	fill(t, rx)

	// Directly: tx takes the interrupt, rx gets a wake-up; rx's is its own.
	require.NoError(t, rx.Arm(1))
	require.NoError(t, tx.Arm(1))
	require.NoError(t, efd.Add(1))
	require.NoError(t, tx.WaitInterrupt(t.Context(), time.Now().Add(time.Second)))
	require.NoError(t, rx.WaitInterrupt(t.Context(), time.Now().Add(time.Second)), "the interrupt passed on")
	err := tx.WaitInterrupt(t.Context(), time.Now().Add(20*time.Millisecond))
	require.ErrorIs(t, err, nic.ErrTimeout, "rx's wake-up was not passed back")
	require.EqualValues(t, 1, tx.Stats().Interrupts)
	require.EqualValues(t, 1, rx.Stats().Interrupts)

	// Two blocked readers, frames for one of them at a time: whichever
	// sleeper takes the interrupt, the one with the completion returns it.
	out := make([]nic.Completion, 4)
	for round := 0; round < 20; round++ {
		ctx, cancel := context.WithCancel(t.Context())
		rxDone, txDone := make(chan error, 1), make(chan error, 1)
		go func() {
			_, err := tx.SRead(ctx, make([]nic.Completion, 4), 1, 10*time.Second)
			txDone <- err
		}()
		go func() {
			n, err := rx.SRead(ctx, out, 1, 10*time.Second)
			if err == nil && n != 1 {
				err = errors.New("not one completion")
			}
			rxDone <- err
		}()
		time.Sleep(5 * time.Millisecond) // both asleep, most rounds
		dev.receive(frameOf(round, 64))
		require.NoError(t, efd.Add(1)) // the device's interrupt
		select {
		case err := <-rxDone:
			require.NoError(t, err, "round %d", round)
		case err := <-txDone:
			t.Fatalf("round %d: the transmit read returned first (%v)", round, err)
		case <-time.After(5 * time.Second):
			t.Fatalf("round %d: the receive read slept through its completion's interrupt", round)
		}
		require.NoError(t, rx.Repost(out[0].Buf, nil))
		require.NoError(t, rx.Flush())
		cancel()
		require.ErrorIs(t, <-txDone, context.Canceled)
	}
	require.NoError(t, d.Close())
}

// TestSharedVectorBindCQ: a pair that shares a vector is bound to a CQ
// whole, and the vector wakes that CQ.
func TestSharedVectorBindCQ(t *testing.T) {
	d, f := newFakeDevice(t, Config{Config: nic.Config{QueuePairs: 8, QueueSize: 16}})
	dev := newFakeNIC(t, d, f)
	c, err := cq.New(cq.Attr{Format: cq.FormatData, WaitObj: cq.WaitFD}, cq.Limits{})
	require.NoError(t, err)
	defer c.Close()
	require.ErrorIs(t, d.BindCQ(c, 0, nic.Recv), nic.ErrNotSupported)
	require.ErrorIs(t, d.BindCQ(c, 0, nic.Send), nic.ErrNotSupported)
	require.NoError(t, d.BindCQ(c, 0, nic.Recv|nic.Send))
	fill(t, d.rx[0])
	require.NoError(t, c.Signal()) // SRead's first wake-up: ErrAgain
	_, err = c.SRead(t.Context(), make([]cq.Entry, 4), 1, time.Second)
	require.ErrorIs(t, err, cq.ErrAgain)
	done := make(chan int, 1)
	go func() {
		n, _ := c.SRead(t.Context(), make([]cq.Entry, 4), 1, 5*time.Second)
		done <- n
	}()
	for i := 0; f.get(regEIMS)&(1<<1) == 0; i++ {
		require.Less(t, i, 5000, "the CQ's SRead arms the vector")
		time.Sleep(time.Millisecond)
	}
	dev.receive(frameOf(1, 64))
	require.NoError(t, c.Driver().Interrupt().Add(1)) // the vector, wired to the CQ
	require.Equal(t, 1, <-done)
	require.NoError(t, d.Close())
}
