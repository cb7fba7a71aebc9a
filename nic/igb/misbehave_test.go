package igb

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/nic"
)

// A device that writes what it may not: every case ends in error
// completions with the right error, never a panic, and the buffers come
// back to the pool.

func TestMisbehaveLengthBeyondBuffer(t *testing.T) {
	d, f := newFakeDevice(t, Config{Config: nic.Config{QueueSize: 8, RxBuffers: 8}})
	dev := newFakeNIC(t, d, f)
	rx := d.rx[0]
	require.Equal(t, 7, fill(t, rx))
	dev.writeBack(0, rxdStatusDD|rxdStatusEOP, 2049) // one byte beyond the 2 KiB buffer
	dev.rdh = 1
	dev.writeBack(1, rxdStatusDD|rxdStatusEOP, 0xffff)
	dev.rdh = 2
	dev.receive(frameOf(2, 64))
	out := make([]nic.Completion, 8)
	n := rx.Poll(out)
	require.Equal(t, 1, n, "an error completion ends the batch")
	require.ErrorIs(t, out[0].Err, cq.ProvBadLen)
	require.Nil(t, out[0].Data)
	require.Equal(t, 0, out[0].Context)
	n = rx.Poll(out)
	require.Equal(t, 1, n)
	require.ErrorIs(t, out[0].Err, cq.ProvBadLen)
	n = rx.Poll(out)
	require.Equal(t, 1, n)
	require.NoError(t, out[0].Err)
	require.Equal(t, frameOf(2, 64), out[0].Data)
	require.Equal(t, 4, rx.Outstanding())
	require.Equal(t, 3, rx.bufs.Free(), "two refused buffers recycled, one lent")
	require.EqualValues(t, 2, rx.Stats().Errors)
	require.NoError(t, rx.Repost(out[0].Buf, nil), "the queue keeps working")
}

func TestMisbehaveNeverPosted(t *testing.T) {
	d, f := newFakeDevice(t, Config{Config: nic.Config{QueueSize: 8}})
	dev := newFakeNIC(t, d, f)
	rx := d.rx[0]
	require.NoError(t, rx.PostRecv("a"))
	require.NoError(t, rx.PostRecv("b"))
	require.NoError(t, rx.Flush())
	dev.receive(frameOf(0, 60))
	dev.receive(frameOf(1, 60))
	dev.writeBack(2, rxdStatusDD|rxdStatusEOP, 60) // beyond the tail
	out := make([]nic.Completion, 8)
	n := rx.Poll(out)
	require.Equal(t, 3, n)
	require.NoError(t, out[0].Err)
	require.NoError(t, out[1].Err)
	require.ErrorIs(t, out[2].Err, cq.ProvBadID)
	require.Nil(t, out[2].Context)
	require.Zero(t, rx.Poll(out), "a broken queue reads nothing")
	require.ErrorIs(t, rx.PostRecv(nil), nic.ErrBroken)
	require.ErrorIs(t, rx.Flush(), nic.ErrBroken)
	require.NoError(t, rx.Release(out[0].Buf), "lent buffers still go back")

	// The same on the transmit ring: DD on a descriptor never sent.
	tx := d.tx[0]
	require.NoError(t, tx.Send(frameOf(0, 60), 0))
	require.NoError(t, tx.Flush())
	dev.transmit()
	*(*uint32)(ptrAdd(desc(&tx.queue, 1), 12)) = txdStatusDD // never sent
	n = tx.Poll(out)
	require.Equal(t, 2, n)
	require.NoError(t, out[0].Err)
	require.Equal(t, 0, out[0].Context)
	require.ErrorIs(t, out[1].Err, cq.ProvBadID)
	require.ErrorIs(t, tx.Send(frameOf(1, 60), 1), nic.ErrBroken)
}

func TestMisbehaveHole(t *testing.T) {
	d, f := newFakeDevice(t, Config{Config: nic.Config{QueueSize: 8}})
	dev := newFakeNIC(t, d, f)
	rx := d.rx[0]
	fill(t, rx)
	dev.writeBack(1, rxdStatusDD|rxdStatusEOP, 60) // DD on 1 while 0 has none
	out := make([]nic.Completion, 8)
	n := rx.Poll(out)
	require.Equal(t, 1, n)
	require.ErrorIs(t, out[0].Err, cq.ProvBadPhase)
	require.ErrorIs(t, rx.PostRecv(nil), nic.ErrBroken)
}

func TestMisbehaveNoEOP(t *testing.T) {
	d, f := newFakeDevice(t, Config{Config: nic.Config{QueueSize: 16}})
	dev := newFakeNIC(t, d, f)
	rx := d.rx[0]
	require.Equal(t, 15, fill(t, rx))
	free := rx.bufs.Free()
	dev.writeBack(0, rxdStatusDD, 2048) // first part of a frame
	dev.writeBack(1, rxdStatusDD, 2048) // middle part
	dev.writeBack(2, rxdStatusDD|rxdStatusEOP, 100)
	dev.rdh = 3
	dev.receive(frameOf(7, 77))
	out := make([]nic.Completion, 8)
	var got []nic.Completion
	for i := 0; i < 10 && len(got) < 4; i++ {
		n := rx.Poll(out)
		got = append(got, out[:n]...)
	}
	require.Len(t, got, 4)
	for i := 0; i < 3; i++ {
		require.ErrorIs(t, got[i].Err, cq.ProvMultiBuffer, "part %d", i)
		require.Equal(t, i, got[i].Context)
		require.Nil(t, got[i].Data)
	}
	require.NoError(t, got[3].Err)
	require.Equal(t, frameOf(7, 77), got[3].Data)
	require.Equal(t, free+3, rx.bufs.Free(), "every part of the frame recycled")
	require.Equal(t, 11, rx.Outstanding())
}

// A write-back shorter than an Ethernet header (nic.MinFrame) is refused
// with cq.ProvBadLen (cq.ProvBadLen, as virtio refuses it), through Poll
// and through a bound CQ alike: the context comes back, the buffer goes
// back to the pool, and the queue keeps working.
func TestMisbehaveShortFrame(t *testing.T) {
	for _, viaCQ := range []bool{false, true} {
		d, f := newFakeDevice(t, Config{Config: nic.Config{QueueSize: 8, RxBuffers: 8}})
		dev := newFakeNIC(t, d, f)
		rx := d.rx[0]
		require.Equal(t, 7, fill(t, rx))
		free := rx.bufs.Free()
		var c *cq.CQ
		if viaCQ {
			c = newCQ(t)
			require.NoError(t, d.BindCQ(c, 0, nic.Recv))
		}
		dev.writeBack(0, rxdStatusDD|rxdStatusEOP, 0)
		dev.writeBack(1, rxdStatusDD|rxdStatusEOP, 5)
		dev.rdh = 2
		dev.receive(frameOf(2, nic.MinFrame)) // the shortest good one
		want := []struct {
			ctx any
			len int
		}{{0, 0}, {1, 5}}
		for _, w := range want {
			if viaCQ {
				_, err := c.Read(make([]cq.Entry, 4))
				require.ErrorIs(t, err, cq.ErrAvail)
				var ee cq.ErrEntry
				require.NoError(t, c.ReadErr(&ee))
				require.Equal(t, w.ctx, ee.Context)
				require.Equal(t, cq.ProvBadLen, ee.ProvErrno)
				require.Equal(t, cq.EIO, ee.Err)
				require.Equal(t, w.len, ee.Len)
				continue
			}
			out := make([]nic.Completion, 4)
			require.Equal(t, 1, rx.Poll(out), "an error completion ends the batch")
			require.ErrorIs(t, out[0].Err, cq.ProvBadLen)
			require.Equal(t, w.ctx, out[0].Context)
			require.Equal(t, w.len, out[0].Len)
			require.Nil(t, out[0].Data)
			require.Zero(t, out[0].Buf)
		}
		var buf uintptr
		if viaCQ {
			ents := make([]cq.Entry, 4)
			n, err := c.Read(ents)
			require.NoError(t, err)
			require.Equal(t, 1, n)
			require.Equal(t, 2, ents[0].Context)
			require.Equal(t, nic.MinFrame, ents[0].Len)
			buf = ents[0].Buf
		} else {
			out := make([]nic.Completion, 4)
			require.Equal(t, 1, rx.Poll(out))
			require.NoError(t, out[0].Err)
			require.Equal(t, frameOf(2, nic.MinFrame), out[0].Data)
			buf = out[0].Buf
		}
		require.Equal(t, free+2, rx.bufs.Free(), "both refused buffers recycled")
		require.EqualValues(t, 2, rx.Stats().Errors)
		require.NoError(t, rx.Repost(buf, nil), "the queue keeps working")
	}
}

// A write-back with RXE (a frame received in error) is refused: the driver
// does not ask the device to store bad frames (RCTL.SBP), so the device
// misbehaves. The completion carries nic.ErrDeviceStatus and, in a CQ,
// the status as its provider error number (provRxError, which StrError
// names); the context comes back and the buffer goes back to the pool.
func TestMisbehaveRxError(t *testing.T) {
	for _, viaCQ := range []bool{false, true} {
		d, f := newFakeDevice(t, Config{Config: nic.Config{QueueSize: 8, RxBuffers: 8}})
		dev := newFakeNIC(t, d, f)
		rx := d.rx[0]
		require.Equal(t, 7, fill(t, rx))
		free := rx.bufs.Free()
		var c *cq.CQ
		if viaCQ {
			c = newCQ(t)
			require.NoError(t, d.BindCQ(c, 0, nic.Recv))
		}
		dev.receive(frameOf(0, 60))
		dev.writeBack(0, rxdStatusDD|rxdStatusEOP|rxdStatusIPCS|rxdErrIPE|rxdErrRXE, 60)
		dev.receive(frameOf(1, 60))
		if viaCQ {
			_, err := c.Read(make([]cq.Entry, 4))
			require.ErrorIs(t, err, cq.ErrAvail)
			var ee cq.ErrEntry
			require.NoError(t, c.ReadErr(&ee))
			require.Equal(t, 0, ee.Context)
			require.Equal(t, cq.EIO, ee.Err)
			require.Equal(t, provRxError, ee.ProvErrno)
			require.Contains(t, c.StrError(ee.ProvErrno, ee.ErrData), "RXE")
			require.Equal(t, []any{1}, readOK(t, c, 1))
		} else {
			out := make([]nic.Completion, 4)
			require.Equal(t, 1, rx.Poll(out), "an error completion ends the batch")
			require.ErrorIs(t, out[0].Err, nic.ErrDeviceStatus)
			require.Equal(t, 0, out[0].Context)
			require.Nil(t, out[0].Data)
			require.Zero(t, out[0].Buf)
			require.Equal(t, 1, rx.Poll(out))
			require.NoError(t, out[0].Err)
			require.Equal(t, frameOf(1, 60), out[0].Data)
			o, err := rx.Offload(out[0].Buf)
			require.NoError(t, err)
			require.False(t, o.RxError)
		}
		require.Equal(t, free+1, rx.bufs.Free(), "the refused buffer recycled, the good one lent")
		require.EqualValues(t, 1, rx.Stats().Errors)
	}
}
