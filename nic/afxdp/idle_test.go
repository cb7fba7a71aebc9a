package afxdp

import (
	"context"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	vt "github.com/vfnic/vfnic/internal/vethtest"
	"github.com/vfnic/vfnic/lcore"
	"github.com/vfnic/vfnic/nic"
	"golang.org/x/sys/unix"
)

// cpuTime is the process's user and system CPU time so far.
func cpuTime(t testing.TB) time.Duration {
	var ru unix.Rusage
	require.NoError(t, unix.Getrusage(unix.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestIdle: an SRead on each queue of pair 0 and an adaptive lcore core on
// pair 1 sleep on their sockets' readiness (the transmit queues' on its
// write readiness, which stays on with nothing new): idle for 10 s
// together they use under 1% of a CPU (getrusage over the whole process). A frame for each
// queue then wakes each (the peer's sending CPU picks the veth queue).
func TestIdle(t *testing.T) {
	if testing.Short() {
		t.Skip("10 s idle measurement")
	}
	v := vt.New(t, 2)
	dev := openIn(t, v.A, "vfx0", nic.Config{QueuePairs: 2})
	var p *vt.Peer
	require.NoError(t, vt.In(v.B, func() (err error) { p, err = vt.NewPeer("vfx1"); return err }))
	defer p.Close()
	rx0, rx1, tx0, tx1 := dev.rx[0], dev.rx[1], dev.tx[0], dev.tx[1]
	for _, q := range []*RxQueue{rx0, rx1} {
		for q.PostRecv(nil) == nil {
		}
		require.NoError(t, q.Flush())
	}

	core, err := lcore.New(lcore.Config{CPU: lcore.AnyCPU})
	require.NoError(t, err)
	var coreGot atomic.Int64
	require.NoError(t, core.AddQueue(rx1, func(q nic.Queue, batch []nic.Completion) error {
		for _, c := range batch {
			if _, ok, _ := vt.CheckFrame(c.Data, dev.MAC(), p.MAC); ok {
				coreGot.Add(1)
			}
			if err := rx1.Repost(c.Buf, nil); err != nil {
				return err
			}
		}
		return nil
	}))
	require.NoError(t, core.AddQueue(tx1, nil))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	require.NoError(t, core.Start(ctx))
	defer core.Close()

	type result struct {
		n   int
		err error
	}
	sread := func(timeout time.Duration) chan result {
		ch := make(chan result, 1)
		go func() {
			comps := make([]nic.Completion, 8)
			n, err := rx0.SRead(ctx, comps, 1, timeout)
			for _, c := range comps[:n] {
				_ = rx0.Repost(c.Buf, nil)
			}
			ch <- result{n, err}
		}()
		return ch
	}
	idle := sread(10*time.Second + 500*time.Millisecond)
	txIdle := make(chan error, 1)
	go func() {
		_, err := tx0.SRead(ctx, make([]nic.Completion, 8), 1, 10*time.Second+500*time.Millisecond)
		txIdle <- err
	}()
	time.Sleep(300 * time.Millisecond) // the core's idle interval, the reader asleep
	sleeps := core.Stats().Sleeps
	c0, w0 := cpuTime(t), time.Now()
	time.Sleep(10 * time.Second)
	used, wall := cpuTime(t)-c0, time.Since(w0)
	r := <-idle
	require.ErrorIs(t, r.err, nic.ErrTimeout, "nothing to read")
	require.ErrorIs(t, <-txIdle, nic.ErrTimeout, "no send to complete")
	st := core.Stats()
	t.Logf("idle %v: %v of CPU (%.3f%%); core slept %d times, woke %d, %d polls", wall.Round(time.Millisecond), used,
		100*used.Seconds()/wall.Seconds(), st.Sleeps, st.Wakeups, st.Polls)
	require.Less(t, used.Seconds()/wall.Seconds(), 0.01, "idle CPU")
	require.Greater(t, st.Sleeps, uint64(0), "the core sleeps")
	require.LessOrEqual(t, st.Sleeps-sleeps, uint64(2), "and stays asleep")

	// Wake-ups: a frame sent from CPU i lands on queue i.
	cpus, err := lcore.AllowedCPUs()
	require.NoError(t, err)
	if len(cpus) < 2 {
		t.Log("one CPU: the peer cannot aim a frame at queue 1; wake-up checked on queue 0 only")
	}
	woke := sread(5 * time.Second)
	sendFrom := func(cpu int, seq uint64) {
		require.NoError(t, vt.In(v.B, func() error {
			var old, one unix.CPUSet
			if err := unix.SchedGetaffinity(0, &old); err != nil {
				return err
			}
			one.Set(cpu)
			if err := unix.SchedSetaffinity(0, &one); err != nil {
				return err
			}
			defer unix.SchedSetaffinity(0, &old)
			return p.Send(vt.MakeFrame(make([]byte, 2048), dev.MAC(), p.MAC, seq))
		}))
	}
	for i, cpu := range cpus[:min(2, len(cpus))] {
		sendFrom(cpu, uint64(i))
	}
	r = <-woke
	if r.err != nil {
		time.Sleep(time.Second)
		t.Logf("core got %d; rx0 stats %+v rx1 %+v", coreGot.Load(), rx0.Stats(), rx1.Stats())
	}
	require.NoError(t, r.err)
	require.Equal(t, 1, r.n, "SRead on queue 0 woke for its frame")
	if len(cpus) >= 2 {
		require.Eventually(t, func() bool { return coreGot.Load() == 1 }, 5*time.Second, 10*time.Millisecond, "the core woke for queue 1's frame")
	}

	// Closing the device under the sleeping core wakes it at once (the
	// sockets' readiness FDs signal its wake eventfd as they close): it
	// stops with os.ErrClosed, woken once more.
	// Stats publishes at a sleep: the one after the frame's round has
	// its completion (the one before looks asleep too).
	require.Eventually(t, func() bool {
		st := core.Stats()
		return st.Sleeps > st.Wakeups && st.Completions == uint64(coreGot.Load())
	}, 5*time.Second, time.Millisecond, "asleep again")
	asleep := core.Stats()
	start := time.Now()
	require.NoError(t, dev.Close())
	wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
	defer wcancel()
	require.ErrorIs(t, core.Wait(wctx), os.ErrClosed)
	t.Logf("the core stopped %v after Close", time.Since(start).Round(time.Microsecond))
	// Stats publishes Wakeups at the next sleep or the end: the last
	// sleep was woken, by the close, and none followed.
	end := core.Stats()
	require.Equal(t, asleep.Sleeps, end.Sleeps, "no sleep after the close")
	require.Equal(t, end.Sleeps, end.Wakeups, "the last sleep woken")
}
