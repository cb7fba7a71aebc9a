package virtio

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/nic"
)

// usedEvent is one completion as either API reports it: a success with the
// index of the posted buffer's context and its length, or an error with
// its provider code (cq.Prov*, virtio's Prov*).
type usedEvent struct {
	ctx  int // -1: none
	len  int
	prov cq.ProvErrno // 0 for a success
}

// provOf is the code an error completion of the queue API carries through
// the CQ API.
func provOf(err error) cq.ProvErrno {
	switch {
	case errors.Is(err, cq.ProvBadLen):
		return cq.ProvBadLen
	case errors.Is(err, cq.ProvBadPhase):
		return cq.ProvBadPhase
	case errors.Is(err, cq.ProvBadIndex):
		return cq.ProvBadIndex
	case errors.Is(err, cq.ProvMultiBuffer):
		return cq.ProvMultiBuffer
	}
	return cq.ProvBadID
}

func ctxIndex(c any) int {
	if p, ok := c.(*int); ok && p != nil {
		return *p
	}
	return -1
}

// FuzzUsedRing writes arbitrary bytes where the device writes used
// entries (the packed descriptor ring, or the split used ring with its
// index) after buffers were posted, and reads them through the queue API
// (Poll, nic.Completion) on one rig and through a CQ (cq.Entry, ReadErr)
// on a twin rig with the same bytes. Both must report the same completions
// with the same codes, nothing may panic, and both queues must account for
// every buffer afterwards (free, posted or lent).
//
// Input: bit 0 of byte 0 picks packed or split, bit 1 merged receive
// buffers, byte 1 the buffers posted; the rest is written over the area.
func FuzzUsedRing(f *testing.F) {
	for _, packed := range []bool{true, false} {
		for _, seed := range usedSeeds(f, packed) {
			f.Add(seed)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) { readFuzzedUsed(t, data) })
}

// usedSeeds are the used areas a well-behaved device leaves after
// receiving 3 frames into 6 posted buffers, then the same with bytes
// flipped.
func usedSeeds(t testing.TB, packed bool) [][]byte {
	r := newRig(t, 8, packed, true, 64<<10)
	rx := r.rxQueue(t, 16, 2048, false)
	for i := range 6 {
		require.NoError(t, rx.PostRecv(i))
	}
	require.NoError(t, rx.Flush())
	for i := range 3 {
		tk, ok := r.dev.take()
		require.True(t, ok)
		r.dev.complete(tk.id, writeFrame(tk, frameFor(i, 64), 1), tk.ndesc)
	}
	flags := byte(0)
	if packed {
		flags = 1
	}
	area := usedArea(r, packed)
	good := append([]byte{flags, 6}, area...)
	bad := append([]byte(nil), good...)
	for i := 5; i < len(bad); i += 5 {
		bad[i] ^= 0xa5
	}
	return [][]byte{good, bad}
}

// usedArea is the memory the device writes used entries into.
func usedArea(r *rig, packed bool) []byte {
	if packed {
		return r.mem.desc
	}
	return r.mem.device
}

// readFuzzedUsed is FuzzUsedRing's body; it returns what was read.
func readFuzzedUsed(t *testing.T, data []byte) []usedEvent {
	if len(data) < 2 {
		return nil
	}
	packed, mrg := data[0]&1 != 0, data[0]&2 != 0
	posts := 1 + int(data[1])%8
	var rxs [2]*RxQueue
	var c *cq.CQ
	ctxs := make([]int, posts)
	for i := range ctxs {
		ctxs[i] = i
	}
	for i := range rxs {
		r := newRig(t, 8, packed, true, 64<<10)
		rx := r.rxQueue(t, 16, 2048, mrg)
		for j := range posts {
			require.NoError(t, rx.PostRecv(&ctxs[j]))
		}
		require.NoError(t, rx.Flush())
		copy(usedArea(r, packed), data[2:])
		rxs[i] = rx
		if i == 1 {
			c = bindTest(t, &rx.queue, rx, cq.FormatData)
		}
	}

	var direct, viaCQ []usedEvent
	var comps [5]nic.Completion
	for range 40 {
		n := rxs[0].Poll(comps[:])
		for _, cp := range comps[:n] {
			if cp.Err != nil {
				direct = append(direct, usedEvent{ctx: ctxIndex(cp.Context), prov: provOf(cp.Err)})
				continue
			}
			require.Equal(t, cp.Len, len(cp.Data))
			direct = append(direct, usedEvent{ctx: ctxIndex(cp.Context), len: cp.Len})
		}
	}
	ents := make([]cq.Entry, 3)
	var ee cq.ErrEntry
	for range 40 {
		n, err := c.Read(ents)
		for _, e := range ents[:n] {
			viaCQ = append(viaCQ, usedEvent{ctx: ctxIndex(e.Context), len: e.Len})
		}
		if errors.Is(err, cq.ErrAvail) {
			require.NoError(t, c.ReadErr(&ee))
			viaCQ = append(viaCQ, usedEvent{ctx: ctxIndex(ee.Context), prov: ee.ProvErrno})
		}
	}
	require.Equal(t, direct, viaCQ, "the queue API and the CQ API report the same completions and codes")
	lent := 0
	for _, ev := range direct {
		if ev.prov == 0 {
			lent++
		}
	}
	for i, rx := range rxs {
		t.Run(fmt.Sprint(i), func(t *testing.T) { accounted(t, rx, lent) })
	}
	return direct
}

// TestUsedSeeds runs FuzzUsedRing's seeds and checks that they reach both
// the success and the refusal paths on both ring formats.
func TestUsedSeeds(t *testing.T) {
	for _, packed := range []bool{true, false} {
		seeds := usedSeeds(t, packed)
		good := readFuzzedUsed(t, seeds[0])
		require.Len(t, good, 3, "packed=%v: the well-behaved device's frames", packed)
		for _, ev := range good {
			require.Zero(t, ev.prov)
		}
		refused := 0
		for _, ev := range readFuzzedUsed(t, seeds[1]) {
			if ev.prov != 0 {
				refused++
			}
		}
		require.Positive(t, refused, "packed=%v: the garbled area is refused", packed)
	}
}
