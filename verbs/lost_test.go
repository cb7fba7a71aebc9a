package verbs_test

import (
	"context"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/cq/qpsim"
	"github.com/vfnic/vfnic/verbs"
)

// TestLostWakeup runs the verbs event loop, "GetEvent, AckEvents,
// ReqNotify, poll until empty", against a producer that the consumer
// triggers each time its poll finds nothing: the producer writes one
// completion at once (it wakes the sleeping consumer) and a second after a
// random delay, which lands between the poll that found nothing and the
// next arm, between the arm and the poll, or after the poll. The delay is
// drawn up to twice the mean time from the first completion to the
// consumer's arm (at least 20 µs; 50 to 150 µs here), so that all three
// happen however fast the machine runs: with a fixed 150 µs, a slow run
// saw the second completion land before the arm in all but 1 of 20000
// rounds. A lost wake-up leaves GetEvent waiting for an entry that is in
// the CQ: the test fails after 2 s without an event. VFNIC_VERBS_ROUNDS
// sets the number of rounds (default 20000: 3 to 6 s, 6 to 10 s under
// -race; the figure is 100000).
func TestLostWakeup(t *testing.T) {
	rounds := 20000
	if s := os.Getenv("VFNIC_VERBS_ROUNDS"); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(t, err)
		rounds = n
	}
	_, ch, c, a := chEnv(t)
	payload := make([]byte, 16)
	var produced atomic.Int64
	// base: the clock of firstAt (when the producer wrote a round's first
	// completion) and of armLag (the mean time from it to the arm), in ns.
	base := time.Now()
	var firstAt, armLag atomic.Int64
	armLag.Store(75_000)
	trigger := make(chan struct{}, 1)
	stop := make(chan struct{})
	prodDone := make(chan struct{})
	go func() {
		defer close(prodDone)
		rng := rand.New(rand.NewPCG(1, 2))
		for {
			select {
			case <-stop:
				return
			case <-trigger:
			}
			firstAt.Store(int64(time.Since(base)))
			if a.Send(a.Addr(), uint64(produced.Load()), payload, qpsim.SendOpts{}) == nil {
				produced.Add(1)
			}
			d := time.Duration(rng.Int64N(max(20_000, 2*armLag.Load())))
			for t0 := time.Now(); time.Since(t0) < d; {
			}
			if a.Send(a.Addr(), uint64(produced.Load()), payload, qpsim.SendOpts{}) == nil {
				produced.Add(1)
			}
		}
	}()
	var once sync.Once
	stopProducer := func() { once.Do(func() { close(stop); <-prodDone }) }
	defer stopProducer()

	var consumed, present, absent, spurious int
	wcs := make([]verbs.WC, 32)
	poll := func() int {
		k := 0
		for {
			n, err := c.Poll(wcs)
			require.NoError(t, err)
			for _, w := range wcs[:n] {
				require.Zero(t, w.Status)
			}
			k += n
			if n == 0 {
				return k
			}
		}
	}
	kick := func() {
		select {
		case trigger <- struct{}{}:
		default:
		}
	}
	_, err := c.ReqNotify(false)
	require.NoError(t, err)
	consumed += poll()
	kick()
	start := time.Now()
	for r := 0; r < rounds; r++ {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, _, err := ch.GetEvent(ctx)
		cancel()
		if err != nil {
			t.Fatalf("round %d: lost wake-up: %v (produced %d, consumed %d)", r, err, produced.Load(), consumed)
		}
		c.AckEvents(1)
		p, err := c.ReqNotify(false)
		require.NoError(t, err)
		if lag := int64(time.Since(base)) - firstAt.Load(); lag > 0 {
			armLag.Store((7*armLag.Load() + lag) / 8)
		}
		if p {
			present++
		} else {
			absent++
		}
		k := poll()
		if k == 0 {
			spurious++
		}
		consumed += k
		kick()
	}
	el := time.Since(start)
	stopProducer()
	require.NoError(t, a.Flush(context.Background()))
	for deadline := time.Now().Add(2 * time.Second); int64(consumed) < produced.Load() && time.Now().Before(deadline); {
		consumed += poll()
	}
	require.Equal(t, produced.Load(), int64(consumed))
	t.Logf("%d rounds in %v (%v/round): %d completions; arm found entries present %d times, none %d times; %d spurious wake-ups",
		rounds, el, el/time.Duration(rounds), consumed, present, absent, spurious)
	require.Positive(t, present, "no completion landed before an arm")
	require.Positive(t, absent, "every completion landed before an arm")
}
