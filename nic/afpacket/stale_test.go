package afpacket

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/cq"
	vt "github.com/vfnic/vfnic/internal/vethtest"
	"github.com/vfnic/vfnic/lcore"
	"github.com/vfnic/vfnic/nic"
	"golang.org/x/sys/unix"
)

// staleRig is a device on a veth pair, its receive queue's buffers all
// posted, and the Linux peer that sends it frames (the veth pair has
// IPv6 off: no frame the test did not send).
type staleRig struct {
	dev  *Device
	p    *vt.Peer
	b    []byte
	send func(seq uint64) error
}

func newStaleRig(t *testing.T) *staleRig {
	t.Helper()
	v := vt.New(t, 1)
	r := &staleRig{dev: openIn(t, v.A, "vfx0", nic.Config{}), b: make([]byte, 2048)}
	require.NoError(t, vt.In(v.B, func() (err error) { r.p, err = vt.NewPeer("vfx1"); return err }))
	t.Cleanup(r.p.Close)
	for r.dev.rx[0].PostRecv(nil) == nil {
	}
	require.NoError(t, r.dev.rx[0].Flush())
	r.send = func(seq uint64) error {
		return vt.In(v.B, func() error { return r.p.Send(vt.MakeFrame(r.b, r.dev.MAC(), r.p.MAC, seq)) })
	}
	return r
}

// check requires frame seq in data.
func (r *staleRig) check(t *testing.T, data []byte, seq uint64) {
	t.Helper()
	got, ok, err := vt.CheckFrame(data, r.dev.MAC(), r.p.MAC)
	require.NoError(t, err)
	require.True(t, ok, "a frame of the test")
	require.Equal(t, seq, got)
}

// TestForwarderStaleReadiness: while the caller holds a lent frame, the
// socket stays readable with nothing to read (Linux's packet_poll: the
// slot before the kernel's position is not the kernel's). A CQ armed
// then (an SRead that sleeps 300 ms and times out) costs the receive
// queue's forwarder at most a few looks, not one per interval: it sleeps
// until the socket raises a new event. A frame sent afterwards still
// signals the CQ: an SRead asleep on the CQ's eventfd returns it. The
// transmit queue, whose completions the driver signals itself, has no
// forwarder goroutine looking at all, and its send still signals the CQ.
func TestForwarderStaleReadiness(t *testing.T) {
	c, err := cq.New(cq.Attr{Size: 512, WaitObj: cq.WaitFD, Format: cq.FormatData}, cq.Limits{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() }) // after the device's Close: registered first
	r := newStaleRig(t)
	dev := r.dev
	require.NoError(t, dev.BindCQ(c, 0, nic.Recv|nic.Send))
	rx, tx := dev.rx[0], dev.tx[0]
	ents := make([]cq.Entry, 1)
	read := func(what string) cq.Entry {
		t.Helper()
		n, err := c.SRead(context.Background(), ents, 1, 5*time.Second)
		require.NoError(t, err, what)
		require.Equal(t, 1, n, what)
		return ents[0]
	}
	recv := func(seq uint64) uintptr {
		t.Helper()
		e := read("waiting for a frame")
		f, err := rx.Frame(e.Buf, e.Len)
		require.NoError(t, err)
		r.check(t, f, seq)
		return e.Buf
	}

	require.NoError(t, r.send(0))
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
	go func() { time.Sleep(50 * time.Millisecond); sent <- r.send(1) }()
	next := recv(1)
	require.NoError(t, <-sent)
	for _, buf := range []uintptr{held, next} {
		require.NoError(t, rx.Repost(buf, nil))
	}
	require.NoError(t, rx.Flush())

	// A send completes into the armed CQ, signalled by the driver.
	require.NoError(t, tx.Send(vt.MakeFrame(r.b, r.p.MAC, dev.MAC(), 2), uint64(2)))
	go func() { time.Sleep(50 * time.Millisecond); sent <- tx.Flush() }()
	e := read("waiting for the send's completion")
	require.Equal(t, cq.FlagSend|cq.FlagMsg, e.Flags)
	require.Equal(t, uint64(2), e.Context)
	require.NoError(t, <-sent)
}

// TestSReadStaleReadiness: a queue's own SRead (no CQ) while the caller
// holds the last frame received, the socket readable with nothing to
// read, sleeps until its timeout instead of waking at once, again and
// again (74,388 wake-ups in 300 ms before WaitFor): the queue counts no
// interrupt in 300 ms. The transmit queue's, with nothing owed, sleeps
// too. The next frame wakes the receive queue's.
func TestSReadStaleReadiness(t *testing.T) {
	r := newStaleRig(t)
	rx, tx := r.dev.rx[0], r.dev.tx[0]
	comps := make([]nic.Completion, 8)
	recv := func(seq uint64) uintptr {
		t.Helper()
		n, err := rx.SRead(context.Background(), comps, 1, 5*time.Second)
		require.NoError(t, err, "waiting for frame %d", seq)
		require.Equal(t, 1, n)
		r.check(t, comps[0].Data, seq)
		return comps[0].Buf
	}
	require.NoError(t, r.send(0))
	held := recv(0) // lent, not reposted: the socket stays readable

	for name, q := range map[string]nic.Queue{"receive": rx, "transmit": tx} {
		before := q.Stats().Interrupts
		_, err := q.SRead(context.Background(), comps, 1, 300*time.Millisecond)
		require.ErrorIs(t, err, nic.ErrTimeout)
		require.Equal(t, before, q.Stats().Interrupts, "%s queue: wake-ups in 300 ms of a stale readiness", name)
	}

	sent := make(chan error, 1)
	go func() { time.Sleep(50 * time.Millisecond); sent <- r.send(1) }()
	next := recv(1)
	require.NoError(t, <-sent)
	require.NoError(t, rx.Repost(held, nil))
	require.NoError(t, rx.Repost(next, nil))
}

// TestCoreStaleReadiness: an lcore core in Interrupt mode whose handler
// keeps the last frame received (the socket readable with nothing to
// read) sleeps in its epoll set until the next frame instead of waking
// at once, round after round (98,928 wake-ups in 300 ms with the socket
// registered level-triggered): at most a couple of wake-ups in 300 ms.
// The next frame reaches the handler.
func TestCoreStaleReadiness(t *testing.T) {
	r := newStaleRig(t)
	rx := r.dev.rx[0]
	c, err := lcore.New(lcore.Config{CPU: lcore.AnyCPU, Mode: lcore.Interrupt})
	require.NoError(t, err)
	defer c.Close()
	got := make(chan nic.Completion, 4)
	require.NoError(t, c.AddQueue(rx, func(q nic.Queue, batch []nic.Completion) error {
		for _, comp := range batch {
			if comp.Err != nil {
				return comp.Err
			}
			got <- comp // kept: the handler does not repost it
		}
		return nil
	}))
	require.NoError(t, c.Start(context.Background()))
	next := func(seq uint64) uintptr {
		t.Helper()
		select {
		case comp := <-got:
			r.check(t, comp.Data, seq)
			return comp.Buf
		case <-time.After(5 * time.Second):
			t.Fatalf("frame %d not received", seq)
		}
		return 0
	}
	require.NoError(t, r.send(0))
	held := next(0)
	// Stats publishes at a sleep: the one after frame 0's round has it.
	require.Eventually(t, func() bool { st := c.Stats(); return st.Completions == 1 && st.Sleeps > st.Wakeups },
		5*time.Second, time.Millisecond, "asleep again")
	before := c.Stats()
	time.Sleep(300 * time.Millisecond)
	after := c.Stats()
	t.Logf("a core 300 ms asleep while its handler keeps the last frame: %d wake-ups, %d rounds",
		after.Wakeups-before.Wakeups, after.Polls-before.Polls)
	require.LessOrEqual(t, after.Wakeups-before.Wakeups, uint64(2), "wake-ups")
	require.NoError(t, r.send(1))
	held2 := next(1)
	require.NoError(t, c.Close())
	require.NoError(t, rx.Repost(held, nil))
	require.NoError(t, rx.Repost(held2, nil))
}
