package afpacket

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/cq"
	vt "github.com/vfnic/vfnic/internal/vethtest"
	"github.com/vfnic/vfnic/nic"
	"golang.org/x/sys/unix"
)

// TestForwarderStaleReadiness: while the caller holds a lent frame, the
// socket stays readable with nothing to read (Linux's packet_poll: the
// slot before the kernel's position is not the kernel's). A CQ armed
// then (an SRead that sleeps 300 ms and times out) costs the receive
// queue's forwarder at most a few looks, not one per interval: it sleeps
// until the socket raises a new event. A frame sent afterwards still
// signals the CQ: an SRead asleep on the CQ's eventfd returns it. The
// transmit queue, whose completions the driver signals itself, has no
// forwarder goroutine looking at all.
func TestForwarderStaleReadiness(t *testing.T) {
	v := vt.New(t, 1)
	c, err := cq.New(cq.Attr{Size: 512, WaitObj: cq.WaitFD, Format: cq.FormatData}, cq.Limits{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() }) // after the device's Close: registered first
	dev := openIn(t, v.A, "vfx0", nic.Config{})
	var p *vt.Peer
	require.NoError(t, vt.In(v.B, func() (err error) { p, err = vt.NewPeer("vfx1"); return err }))
	defer p.Close()
	require.NoError(t, dev.BindCQ(c, 0, nic.Recv|nic.Send))
	rx, tx := dev.rx[0], dev.tx[0]
	for rx.PostRecv(nil) == nil {
	}
	require.NoError(t, rx.Flush())
	b := make([]byte, 2048)
	send := func(seq uint64) error {
		return vt.In(v.B, func() error { return p.Send(vt.MakeFrame(b, dev.MAC(), p.MAC, seq)) })
	}
	// recv waits up to 5 s for frame seq in the CQ, skipping the
	// peer's own traffic (IPv6 neighbour discovery), which it reposts.
	ents := make([]cq.Entry, 1)
	recv := func(seq uint64) uintptr {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			n, err := c.SRead(context.Background(), ents, 1, time.Until(deadline))
			require.NoError(t, err, "waiting for frame %d", seq)
			require.Equal(t, 1, n)
			f, err := rx.Frame(ents[0].Buf, ents[0].Len)
			require.NoError(t, err)
			got, ok, err := vt.CheckFrame(f, dev.MAC(), p.MAC)
			require.NoError(t, err)
			if ok {
				require.Equal(t, seq, got)
				return ents[0].Buf
			}
			require.NoError(t, rx.Repost(ents[0].Buf, nil))
			require.NoError(t, rx.Flush())
		}
	}

	require.NoError(t, send(0))
	held := recv(0) // lent, not reposted
	pfd := []unix.PollFd{{Fd: int32(dev.socks[0].fd), Events: unix.POLLIN}}
	n, err := unix.Poll(pfd, 0)
	require.NoError(t, err)
	require.Equal(t, 1, n, "the socket is readable while a frame is lent")

	forwarder := func(q *queue) func() uint64 {
		q.Mu.Lock()
		defer q.Mu.Unlock()
		require.NotNil(t, q.FW)
		return q.FW.Looks
	}
	rxLooks, txLooks := forwarder(&rx.queue), forwarder(&tx.queue)
	rx0, tx0 := rxLooks(), txLooks()
	_, err = c.SRead(context.Background(), ents, 1, 300*time.Millisecond)
	require.ErrorIs(t, err, cq.ErrAgain, "nothing arrived")
	rxN, txN := rxLooks()-rx0, txLooks()-tx0
	t.Logf("armed 300 ms on a stale readiness: %d looks by the receive forwarder, %d by the transmit one", rxN, txN)
	require.LessOrEqual(t, rxN, uint64(3), "the receive forwarder's looks")
	require.Zero(t, txN, "the transmit forwarder's looks")

	// The next frame's event signals the CQ, asleep by then.
	sent := make(chan error, 1)
	go func() { time.Sleep(50 * time.Millisecond); sent <- send(1) }()
	next := recv(1)
	require.NoError(t, <-sent)
	for _, buf := range []uintptr{held, next} {
		require.NoError(t, rx.Repost(buf, nil))
	}
	require.NoError(t, rx.Flush())

	// A send still completes into the armed CQ, signalled by the driver.
	require.NoError(t, tx.Send(vt.MakeFrame(b, p.MAC, dev.MAC(), 2), uint64(2)))
	go func() { time.Sleep(50 * time.Millisecond); sent <- tx.Flush() }()
	for {
		n, err := c.SRead(context.Background(), ents, 1, 5*time.Second)
		require.NoError(t, err, "waiting for the send's completion")
		require.Equal(t, 1, n)
		if ents[0].Flags&cq.FlagSend != 0 {
			require.Equal(t, uint64(2), ents[0].Context)
			break
		}
		require.NoError(t, rx.Repost(ents[0].Buf, nil)) // the peer's own traffic
	}
	require.NoError(t, <-sent)
}

// TestSReadStaleReadiness: a queue's own SRead (no CQ) while the caller
// holds the last frame received, the socket readable with nothing to
// read, sleeps until its timeout instead of waking at once, again and
// again (116,020 wake-ups in 500 ms of one SRead before WaitFor): the
// queue counts no interrupt in 300 ms. The transmit queue's, with
// nothing owed, sleeps too. The next frame wakes the receive queue's.
func TestSReadStaleReadiness(t *testing.T) {
	v := vt.New(t, 1)
	dev := openIn(t, v.A, "vfx0", nic.Config{})
	var p *vt.Peer
	require.NoError(t, vt.In(v.B, func() (err error) { p, err = vt.NewPeer("vfx1"); return err }))
	defer p.Close()
	rx, tx := dev.rx[0], dev.tx[0]
	for rx.PostRecv(nil) == nil {
	}
	require.NoError(t, rx.Flush())
	b := make([]byte, 2048)
	send := func(seq uint64) error {
		return vt.In(v.B, func() error { return p.Send(vt.MakeFrame(b, dev.MAC(), p.MAC, seq)) })
	}
	comps := make([]nic.Completion, 8)
	recv := func(seq uint64) uintptr {
		t.Helper()
		n, err := rx.SRead(context.Background(), comps, 1, 5*time.Second)
		require.NoError(t, err, "waiting for frame %d", seq)
		require.Equal(t, 1, n)
		got, ok, err := vt.CheckFrame(comps[0].Data, dev.MAC(), p.MAC)
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, seq, got)
		return comps[0].Buf
	}
	require.NoError(t, send(0))
	held := recv(0) // lent, not reposted: the socket stays readable

	for name, q := range map[string]nic.Queue{"receive": rx, "transmit": tx} {
		before := q.Stats().Interrupts
		_, err := q.SRead(context.Background(), comps, 1, 300*time.Millisecond)
		require.ErrorIs(t, err, nic.ErrTimeout)
		require.Equal(t, before, q.Stats().Interrupts, "%s queue: wake-ups in 300 ms of a stale readiness", name)
	}

	sent := make(chan error, 1)
	go func() { time.Sleep(50 * time.Millisecond); sent <- send(1) }()
	next := recv(1)
	require.NoError(t, <-sent)
	require.NoError(t, rx.Repost(held, nil))
	require.NoError(t, rx.Repost(next, nil))
}
