package virtio

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/nic"
)

// TestRxRepostPerCompletionMultiBuffer plays the receive loop of
// cmd/vfnic's echo and capture against frames that span 2-3 mergeable
// buffers mixed with frames that fit one: Poll ends at each multi-buffer
// part (an error completion), so the completions read after it are held
// until later Polls. A caller that posts one buffer per completion it
// got (Repost for a good one, PostRecv for an error's recycled buffer)
// must always find a descriptor for it, even when it refilled the ring
// after an error (as cmd/vfnic's fillRx does): the descriptors of held
// completions are theirs until handed out.
func TestRxRepostPerCompletionMultiBuffer(t *testing.T) {
	for _, refill := range []bool{false, true} {
		name := "one-per-completion"
		if refill {
			name = "refill-after-error"
		}
		t.Run(name, func(t *testing.T) {
			forRings(t, func(t *testing.T, packed bool) {
				testRepostPerCompletion(t, packed, refill)
			})
		})
	}
}

func testRepostPerCompletion(t *testing.T, packed, refill bool) {
	const size, bufSize = 16, 2048
	r := newRig(t, size, packed, true, 256<<10)
	rx := r.rxQueue(t, 2*size, bufSize, true)
	d := r.dev
	posted := 0
	for rx.PostRecv(nil) == nil {
		posted++
	}
	require.Equal(t, size, posted, "the ring takes one buffer per descriptor")
	require.NoError(t, rx.Flush())

	rng := rand.New(rand.NewPCG(7, 29))
	var avail []taken // buffers the device took and has not used yet
	var comps [8]nic.Completion
	frames, parts, good, got, errs := 0, 0, 0, 0, 0
	for round := 0; round < 400; round++ {
		for {
			tk, ok := d.take()
			if !ok {
				break
			}
			avail = append(avail, tk)
		}
		// Whole frames only: one of 1-3 buffers, while enough are taken.
		for len(avail) > 0 {
			nb := 1 + rng.IntN(3)
			if rng.IntN(2) == 0 {
				nb = 1
			}
			if nb > len(avail) {
				break
			}
			for i := range nb {
				tk := avail[i]
				b := tk.data(0)
				n := uint32(netHdrLen + 60 + rng.IntN(bufSize-netHdrLen-60))
				if i == 0 {
					clear(b[:netHdrLen])
					binary.LittleEndian.PutUint16(b[netHdrNumBuffers:], uint16(nb))
					copy(b[netHdrLen:], frameFor(frames, 60))
					if nb > 1 {
						n = bufSize
					}
				} else {
					n = uint32(1 + rng.IntN(bufSize))
				}
				d.complete(tk.id, n, tk.ndesc)
			}
			avail = avail[nb:]
			frames++
			if nb > 1 {
				parts += nb
			} else {
				good++
			}
		}
		// The caller: each Poll's batch, one buffer per completion.
		for {
			n := rx.Poll(comps[:1+rng.IntN(len(comps))])
			if n == 0 {
				break
			}
			failed := false
			for i := range comps[:n] {
				c := &comps[i]
				got++
				if c.Err != nil {
					var mb *nic.MultiBufferError
					require.True(t, errors.As(c.Err, &mb), "round %d: %v", round, c.Err)
					require.Zero(t, c.Buf, "a refused buffer went back to the pool")
					require.Equal(t, n-1, i, "an error ends the batch")
					errs++
					failed = true
					require.NoError(t, rx.PostRecv(nil), "round %d: PostRecv for error completion %d", round, got)
					continue
				}
				require.NoError(t, rx.Repost(c.Buf, nil), "round %d: Repost of completion %d", round, got)
			}
			if failed && refill {
				for {
					err := rx.PostRecv(nil)
					if errors.Is(err, nic.ErrFull) {
						break
					}
					require.NoError(t, err)
				}
			}
			require.NoError(t, rx.Flush())
		}
	}
	require.Equal(t, parts, errs, "every part of a multi-buffer frame is an error completion")
	require.Equal(t, good+parts, got, "every used buffer was handed out")
	require.Positive(t, good)
	require.Positive(t, parts)
	accounted(t, rx, 0)
	require.Equal(t, size, rx.Outstanding(), "the ring stays full")
}
