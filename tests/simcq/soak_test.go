package simcq

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/cq/qpsim"
)

// soakFaults are the faults TestSoak injects, each at a few percent of
// the sends.
var soakFaults = []qpsim.FaultKind{
	qpsim.FaultErrorStatus, qpsim.FaultBadID, qpsim.FaultDuplicateID, qpsim.FaultBadLen,
	qpsim.FaultBadStatus, qpsim.FaultBadOpcode, qpsim.FaultWrongPhase, qpsim.FaultGarbage,
	qpsim.FaultRewriteID, qpsim.FaultLostIRQ, qpsim.FaultSpuriousIRQ, qpsim.FaultWrongOpcode,
}

// TestSoak runs sends through the software device while it injects random
// faults of every kind at about 3% of the completions, read with SRead,
// for VFNIC_SOAK (a duration; 2s by default, `make soak` runs 60s). It
// checks that every operation completes at most once, that only an
// operation whose completion the device rewrote (FaultRewriteID) may be
// lost, that no read stalls, and at the end that the posted-operation
// table holds exactly the lost operations: no slot leaked.
func TestSoak(t *testing.T) {
	dur := 2 * time.Second
	if s := os.Getenv("VFNIC_SOAK"); s != "" {
		d, err := time.ParseDuration(s)
		require.NoError(t, err, "VFNIC_SOAK")
		dur = d
	}
	const (
		sendSize = 64
		window   = 48 // outstanding sends: with one extra entry per fault, the 256-entry CQ never fills
	)
	dev, err := qpsim.New(qpsim.Config{})
	require.NoError(t, err)
	defer dev.Close()
	c, err := dev.OpenCQ(cq.Attr{Size: 256, Format: cq.FormatData, WaitObj: cq.WaitFD})
	require.NoError(t, err)
	qp, err := dev.NewQP(qpsim.QPConfig{SendCQ: c, RecvCQ: c, SendSize: sendSize})
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	seed := rng.Uint64()
	t.Logf("soak for %v, seed %#x", dur, seed)
	rng = rand.New(rand.NewPCG(seed, 2))

	ctx := context.Background()
	var (
		sent, good, failed, refused int
		faults                      = map[qpsim.FaultKind]int{}
		done                        = map[int]bool{}
		lastProgress                = time.Now()
	)
	ents := make([]cq.Entry, 32)
	var ee cq.ErrEntry
	complete := func(ctxv any, ok bool) {
		i, isInt := ctxv.(int)
		require.True(t, isInt, "completion context %v", ctxv)
		require.False(t, done[i], "operation %d completed twice", i)
		done[i] = true
		if ok {
			good++
		} else {
			failed++
		}
	}
	read := func(timeout time.Duration) {
		n, err := c.SRead(ctx, ents, 1, timeout)
		switch {
		case err == nil:
			for _, e := range ents[:n] {
				complete(e.Context, true)
			}
			lastProgress = time.Now()
		case errors.Is(err, cq.ErrAvail):
			require.NoError(t, c.ReadErr(&ee))
			if ee.Context != nil {
				complete(ee.Context, false)
			} else {
				refused++
			}
			lastProgress = time.Now()
		default:
			require.ErrorIs(t, err, cq.ErrAgain)
		}
	}
	outstanding := func() int { return sent - len(done) }
	end := time.Now().Add(dur)
	for time.Now().Before(end) {
		// Operations whose completion the reader saw with the stale id
		// stay outstanding for good: they do not hold the window.
		for outstanding()-faults[qpsim.FaultRewriteID] < window {
			if rng.IntN(100) < 3 {
				k := soakFaults[rng.IntN(len(soakFaults))]
				require.NoError(t, dev.Inject(c, qpsim.Fault{Kind: k, Status: qpsim.StatusGeneralErr}))
				faults[k]++
			}
			if err := qp.Send(99, sent, nil, qpsim.SendOpts{}); err != nil {
				require.ErrorIs(t, err, qpsim.ErrQueueFull) // the table is full of lost operations
				break
			}
			sent++
		}
		read(20 * time.Millisecond)
		// Lost completions (rewritten ids) stay outstanding; anything
		// else outstanding must make progress.
		if outstanding() > faults[qpsim.FaultRewriteID] {
			require.Less(t, time.Since(lastProgress), 5*time.Second, "stalled with %d outstanding", outstanding())
		}
	}
	// Drain: everything the device completes arrives.
	require.NoError(t, qp.Flush(ctx))
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		read(10 * time.Millisecond)
		if _, err := c.Read(nil); errors.Is(err, cq.ErrAgain) && outstanding() <= faults[qpsim.FaultRewriteID] {
			break
		}
	}
	lost := outstanding()
	t.Logf("%d sends: %d completed, %d with an error, %d refused entries, %d lost to rewritten ids; faults %v",
		sent, good, failed, refused, lost, faults)
	require.LessOrEqual(t, lost, faults[qpsim.FaultRewriteID], "only a rewritten completion may be lost")
	require.Greater(t, good, sent/2)
	require.Positive(t, refused)
	st, err := dev.CQStats(c)
	require.NoError(t, err)
	require.Zero(t, st.Overruns)
	require.Zero(t, st.DriverErrors)

	// The table holds exactly the lost operations: it takes sendSize-lost
	// more sends, then is full.
	extra := 0
	for {
		err := qp.Send(99, -1, nil, qpsim.SendOpts{})
		if err != nil {
			require.ErrorIs(t, err, qpsim.ErrQueueFull)
			break
		}
		extra++
		require.LessOrEqual(t, extra, sendSize)
	}
	require.Equal(t, sendSize-lost, extra, "posted-operation slots leaked")
	require.NoError(t, qp.Flush(ctx))
	for deadline := time.Now().Add(5 * time.Second); extra > 0 && time.Now().Before(deadline); {
		n, err := c.Read(ents)
		if err == nil {
			extra -= n
		}
		if errors.Is(err, cq.ErrAvail) {
			require.NoError(t, c.ReadErr(&ee))
		}
	}
	require.NoError(t, qp.Close())
	require.NoError(t, c.Close())
}
