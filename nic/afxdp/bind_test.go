package afxdp

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/cq"
	vt "github.com/vfnic/vfnic/internal/vethtest"
	"github.com/vfnic/vfnic/nic"
)

// TestBindCQ: a queue pair bound to a cq.CQ delivers its receives and
// sends there, read with SRead sleeping on the CQ's eventfd (signalled
// from the socket's readiness), the queues' own reads refused; at Close
// each buffer still posted comes back as a flushed error entry.
func TestBindCQ(t *testing.T) {
	const frames = 2000
	v := vt.New(t, 1)
	dev := openIn(t, v.A, "vfx0", nic.Config{})
	var p *vt.Peer
	require.NoError(t, vt.In(v.B, func() (err error) { p, err = vt.NewPeer("vfx1"); return err }))
	defer p.Close()
	c, err := cq.New(cq.Attr{Size: 2048, WaitObj: cq.WaitFD, Format: cq.FormatData}, cq.Limits{})
	require.NoError(t, err)
	defer c.Close() // after dev.Close (Cleanup of openIn runs later: close explicitly below)
	require.NoError(t, dev.BindCQ(c, 0, nic.Recv|nic.Send))
	require.ErrorIs(t, dev.BindCQ(c, 0, nic.Recv), nic.ErrInvalid, "bound already")
	rx, tx := dev.rx[0], dev.tx[0]
	out := make([]nic.Completion, 1)
	require.Equal(t, 1, rx.Poll(out))
	require.ErrorIs(t, out[0].Err, nic.ErrBound)
	_, err = tx.SRead(context.Background(), out, 1, 0)
	require.ErrorIs(t, err, nic.ErrBound)

	for i := 0; rx.PostRecv(i) == nil; i++ {
	}
	require.NoError(t, rx.Flush())
	ents := make([]cq.Entry, 64)
	// Idle: SRead times out.
	_, err = c.SRead(context.Background(), ents, 1, 100*time.Millisecond)
	require.ErrorIs(t, err, cq.ErrAgain)

	// Receives: the peer sends, the CQ's SRead wakes.
	sent := make(chan error, 1)
	go func() {
		sent <- vt.In(v.B, func() error {
			b := make([]byte, 2048)
			for seq := uint64(0); seq < frames; seq++ {
				if err := p.Send(vt.MakeFrame(b, dev.MAC(), p.MAC, seq)); err != nil {
					return err
				}
				if seq%64 == 63 {
					time.Sleep(5 * time.Millisecond) // the ring holds 256
				}
			}
			return nil
		})
	}()
	seen := make([]bool, frames)
	got := 0
	for got < frames {
		n, err := c.SRead(context.Background(), ents, 1, 5*time.Second)
		require.NoError(t, err, "received %d of %d", got, frames)
		for _, e := range ents[:n] {
			require.Equal(t, cq.FlagRecv|cq.FlagMsg, e.Flags)
			require.EqualValues(t, 0, e.Queue)
			b, err := rx.Frame(e.Buf, e.Len)
			require.NoError(t, err)
			seq, ok, err := vt.CheckFrame(b, dev.MAC(), p.MAC)
			require.NoError(t, err)
			require.True(t, ok)
			require.False(t, seen[seq])
			seen[seq] = true
			got++
			require.NoError(t, rx.Repost(e.Buf, e.Context))
		}
		require.NoError(t, rx.Flush())
	}
	require.NoError(t, <-sent)

	// Sends: completions in the CQ, with their contexts.
	buf := make([]byte, 2048)
	done := 0
	for seq := uint64(0); seq < frames; {
		if err := tx.Send(vt.MakeFrame(buf, p.MAC, dev.MAC(), seq), seq); err == nil {
			seq++
			if seq%32 != 0 {
				continue
			}
		} else {
			require.ErrorIs(t, err, nic.ErrFull)
		}
		require.NoError(t, tx.Flush())
		n, err := c.SRead(context.Background(), ents, 1, 5*time.Second)
		require.NoError(t, err)
		for _, e := range ents[:n] {
			require.Equal(t, cq.FlagSend|cq.FlagMsg, e.Flags)
			require.EqualValues(t, 1, e.Queue)
			require.Equal(t, vt.FrameLen(e.Context.(uint64)), e.Len)
			done++
		}
	}
	require.NoError(t, tx.Flush())
	for done < frames {
		n, err := c.SRead(context.Background(), ents, 1, 5*time.Second)
		require.NoError(t, err, "%d of %d sends completed", done, frames)
		done += n
	}

	// Close: the buffers still posted come back flushed.
	posted := rx.Outstanding()
	require.Positive(t, posted)
	require.NoError(t, dev.Close())
	flushed := 0
	for {
		_, err := c.Read(ents)
		if errors.Is(err, cq.ErrAgain) {
			break
		}
		require.ErrorIs(t, err, cq.ErrAvail)
		var e cq.ErrEntry
		require.NoError(t, c.ReadErr(&e))
		require.Equal(t, cq.ECANCELED, e.Err)
		require.Contains(t, c.StrError(e.ProvErrno, nil), "flushed")
		flushed++
	}
	require.Equal(t, posted, flushed)
	require.NoError(t, c.Close(), "the device let go of the CQ")
}
