package afxdp

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	vt "github.com/vfnic/vfnic/internal/vethtest"
	"github.com/vfnic/vfnic/lcore"
	"github.com/vfnic/vfnic/nic"
)

// txWaitSends is how many sends the tests post before one Flush: at most
// the kernel's copy-mode budget of 32 per kick, so that the one kick of
// the Flush sends and completes them all.
const txWaitSends = 16

// copyModeTx opens vfx0 of a new veth pair (copy mode: veth refuses
// zero-copy) with TxOwedWait an hour for the test, so that only the
// kernel's wake-up can end a transmit wait before its deadline.
func copyModeTx(t *testing.T) (*Device, *TxQueue) {
	v := vt.New(t, 1)
	dev := openIn(t, v.A, "vfx0", nic.Config{})
	tx := dev.tx[0]
	require.NotNil(t, tx.x.wirq, "copy mode: the transmit queue sleeps on the socket's write readiness")
	old := TxOwedWait
	TxOwedWait = time.Hour
	t.Cleanup(func() { TxOwedWait = old })
	return dev, tx
}

// postSends posts txWaitSends frames with contexts 0, 1, ... without a
// Flush: nothing is handed to the kernel yet.
func postSends(t *testing.T, dev *Device, tx *TxQueue) {
	frame := vt.MakeFrame(make([]byte, 2048), dev.MAC(), dev.MAC(), 1)
	for i := range txWaitSends {
		require.NoError(t, tx.Send(frame, i))
	}
}

// TestTxSReadWakesOnCompletion: a transmit SRead asleep while its sends
// are owed wakes when another goroutine's Flush has the kernel send
// them: the kernel raises the socket's write readiness as it frees each
// sent skb (copy mode), and the runtime poller hands that to the waiter.
// With TxOwedWait an hour and the SRead's timeout 10 s, only that
// wake-up returns all the completions within 5 s.
func TestTxSReadWakesOnCompletion(t *testing.T) {
	dev, tx := copyModeTx(t)
	postSends(t, dev, tx)
	type result struct {
		n   int
		err error
		at  time.Time
	}
	out := make([]nic.Completion, txWaitSends)
	done := make(chan result, 1)
	go func() {
		n, err := tx.SRead(context.Background(), out, txWaitSends, 10*time.Second)
		done <- result{n, err, time.Now()}
	}()
	time.Sleep(200 * time.Millisecond)
	select {
	case r := <-done:
		t.Fatalf("SRead returned before the sends were flushed: %d, %v", r.n, r.err)
	default:
	}
	before := tx.Stats().Interrupts
	flushed := time.Now()
	require.NoError(t, tx.Flush())
	var r result
	select {
	case r = <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("SRead still asleep")
	}
	require.NoError(t, r.err)
	require.Equal(t, txWaitSends, r.n)
	for i, c := range out[:r.n] {
		require.NoError(t, c.Err)
		require.Equal(t, i, c.Context, "completions in posting order")
	}
	woke := r.at.Sub(flushed)
	wakeups := tx.Stats().Interrupts - before
	t.Logf("SRead returned %v after the Flush, after %d wake-ups", woke, wakeups)
	require.Less(t, woke, 5*time.Second, "woken by the completions, not by its 10 s timeout")
	require.GreaterOrEqual(t, wakeups, uint64(1), "woken by the socket's write readiness")
}

// TestTxAdaptiveCoreWakesOnCompletion: an adaptive lcore core that reads
// a transmit queue sleeps once its queue is idle, and wakes for the
// completions of sends another goroutine posts and flushes: its epoll set
// waits for the socket's EPOLLOUT.
func TestTxAdaptiveCoreWakesOnCompletion(t *testing.T) {
	dev, tx := copyModeTx(t)
	core, err := lcore.New(lcore.Config{CPU: lcore.AnyCPU, Mode: lcore.Adaptive, IdleInterval: time.Millisecond})
	require.NoError(t, err)
	var got atomic.Int64
	require.NoError(t, core.AddQueue(tx, func(_ nic.Queue, batch []nic.Completion) error {
		for _, c := range batch {
			if c.Err == nil {
				got.Add(1)
			}
		}
		return nil
	}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	require.NoError(t, core.Start(ctx))
	defer core.Close()
	asleep := func() bool { st := core.Stats(); return st.Sleeps > 0 && st.Sleeps > st.Wakeups }
	require.Eventually(t, asleep, 5*time.Second, time.Millisecond, "the idle core sleeps")
	time.Sleep(50 * time.Millisecond) // the registration's first event spent
	require.Eventually(t, asleep, 5*time.Second, time.Millisecond, "and stays asleep")
	st := core.Stats()

	postSends(t, dev, tx)
	require.NoError(t, tx.Flush())
	require.Eventually(t, func() bool { return got.Load() == txWaitSends }, 5*time.Second, time.Millisecond,
		"the core woke for the completions")
	// Wake-ups are published at the core's next sleep.
	require.Eventually(t, func() bool { return core.Stats().Sleeps > st.Sleeps }, 5*time.Second, time.Millisecond, "asleep again")
	end := core.Stats()
	t.Logf("core: %d wake-ups for the completions", end.Wakeups-st.Wakeups)
}

// TestTxSReadDrainsBeyondOneKick: sends flushed in a number the kernel's
// copy mode takes several kicks to send (32 a kick) all complete within
// one SRead asleep on the write readiness: each kick's completions raise
// events whose poll of the socket (xsk_poll) drives the transmit ring on,
// as the kernel does for a poll(2) in copy mode. With TxOwedWait an hour,
// no bounded sleep does it.
func TestTxSReadDrainsBeyondOneKick(t *testing.T) {
	dev, tx := copyModeTx(t)
	const sends = 200 // of a 256-entry ring
	frame := vt.MakeFrame(make([]byte, 2048), dev.MAC(), dev.MAC(), 1)
	for i := range sends {
		require.NoError(t, tx.Send(frame, i))
	}
	require.NoError(t, tx.Flush())
	out := make([]nic.Completion, sends)
	start := time.Now()
	n, err := tx.SRead(context.Background(), out, sends, 10*time.Second)
	took := time.Since(start)
	require.NoError(t, err)
	require.Equal(t, sends, n)
	for i, c := range out[:n] {
		require.NoError(t, c.Err)
		require.Equal(t, i, c.Context)
	}
	t.Logf("%d sends completed %v after the Flush; %d wake-ups, %d kicks", sends, took, tx.Stats().Interrupts, tx.Stats().Notifies)
	require.Less(t, took, 5*time.Second, "not left to the SRead's timeout")
}
