package virtio

import (
	"encoding/binary"
	"math/rand/v2"
	"os"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/nic"
)

// Faults the soak's device injects into virtio's used rings.
const (
	soakOK         = iota
	soakLong       // a length beyond the posted buffer
	soakShort      // a length too short for the header and an Ethernet header
	soakMulti      // num_buffers 2: the frame takes this buffer and the next
	soakBadID      // an id that is not outstanding, in place of the buffer's entry
	soakGarbage    // random bytes as the used entry, in place of the buffer's
	soakWrongPhase // packed: USED set to the wrap counter, AVAIL not
	soakKinds
)

var soakNames = [soakKinds]string{"ok", "long", "short", "multi-buffer", "bad id", "garbage", "wrong phase"}

// TestSoakUsedRing drives a receive queue, in process as the misbehave
// tests do, with a device that injects random faults of every kind at a
// few percent of its used entries, for VFNIC_SOAK (a duration; 500ms per
// ring and API by default, `make soak` runs 60s), read through the queue's
// Poll and through a CQ it feeds. Every good frame must arrive exactly
// once, in order and intact; every buffer the device completed with a bad
// entry comes back as an error completion with its context, once; no read
// stalls; and at the end the posted buffers are exactly those the device
// lost (the buffer whose entry a bad one replaced), with every pool
// buffer accounted for.
func TestSoakUsedRing(t *testing.T) {
	dur := 500 * time.Millisecond
	if s := os.Getenv("VFNIC_SOAK"); s != "" {
		d, err := time.ParseDuration(s)
		require.NoError(t, err, "VFNIC_SOAK")
		dur = d
	}
	forRings(t, func(t *testing.T, packed bool) {
		for _, viaCQ := range []bool{false, true} {
			name := "poll"
			if viaCQ {
				name = "cq"
			}
			t.Run(name, func(t *testing.T) { soakUsedRing(t, packed, viaCQ, dur) })
		}
	})
}

func soakUsedRing(t *testing.T, packed, viaCQ bool, dur time.Duration) {
	end := time.Now().Add(dur)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %#x", seed)
	rng := rand.New(rand.NewPCG(seed, 3))
	var st soakStats
	for epoch := 0; epoch == 0 || time.Now().Before(end); epoch++ {
		soakEpoch(t, packed, viaCQ, end, rng, &st)
		st.epochs++
	}
	t.Logf("%v in %d epochs (a ring whose device lost a quarter of its buffers is opened again, as a driver would reset it): %d reads, %d good frames, %d error completions, %d buffers lost by the device",
		dur, st.epochs, st.reads, st.good, st.errComps, st.lost)
	for k, n := range st.faults {
		t.Logf("  %-12s %d", soakNames[k], n)
	}
}

// soakStats are a soak's counts over its epochs.
type soakStats struct {
	epochs, reads, good, errComps, lost int
	faults                              [soakKinds]int
}

// soakEpoch runs one queue until end, or on a packed ring until its device
// has lost a quarter of the buffers.
func soakEpoch(t *testing.T, packed, viaCQ bool, end time.Time, rng *rand.Rand, st *soakStats) {
	const size = 64
	r := newRig(t, size, packed, true, 1<<20)
	rx := r.rxQueue(t, 2*size, 2048, true)
	var c *cq.CQ
	if viaCQ {
		c = bindTest(t, &rx.queue, rx, cq.FormatData)
	}
	d := r.dev

	type op struct {
		seq      int
		wantGood bool // the device completed it with a good entry
		lost     bool // the device lost it (packed: its position overwritten)
		done     int  // completions received
		good     bool // received as a good frame
	}
	var all []*op
	var (
		posted   []*op // by post order
		nextSeq  int
		goodSeq  = -1 // last good frame's sequence number read
		goods    int
		faults   [soakKinds]int
		lost     int
		reads    int
		errComps int
	)
	post := func() {
		for rx.Outstanding() < size {
			o := &op{seq: nextSeq}
			nextSeq++
			if err := rx.PostRecv(o); err != nil {
				require.ErrorIs(t, err, nic.ErrFull)
				break
			}
			posted = append(posted, o)
			all = append(all, o)
		}
		require.NoError(t, rx.Flush())
	}
	check := func(ctx any, good bool, frame []byte) {
		o, ok := ctx.(*op)
		require.True(t, ok, "completion with context %v", ctx)
		o.done++
		require.Equal(t, 1, o.done, "op %d completed twice", o.seq)
		if good {
			require.True(t, o.wantGood, "op %d completed good, the device refused it", o.seq)
			require.Greater(t, o.seq, goodSeq, "good frames in order")
			goodSeq = o.seq
			goods++
			o.good = true
			require.Equal(t, frameFor(o.seq, 64+o.seq%1400), frame, "op %d intact", o.seq)
		}
	}
	var comps [32]nic.Completion
	ents := make([]cq.Entry, 32)
	read := func() int {
		reads++
		if !viaCQ {
			n := rx.Poll(comps[:])
			for _, cp := range comps[:n] {
				if cp.Err != nil {
					errComps++
					if cp.Context != nil {
						check(cp.Context, false, nil)
					}
					continue
				}
				check(cp.Context, true, cp.Data)
				require.NoError(t, rx.Release(cp.Buf))
			}
			return n
		}
		n, err := c.Read(ents)
		if err == cq.ErrAvail {
			var ee cq.ErrEntry
			require.NoError(t, c.ReadErr(&ee))
			require.NotZero(t, ee.ProvErrno)
			errComps++
			if ee.Context != nil {
				check(ee.Context, false, nil)
			}
			return 1
		}
		if err == cq.ErrAgain {
			return 0
		}
		require.NoError(t, err)
		for _, e := range ents[:n] {
			f, err := rx.Frame(e.Buf, e.Len)
			require.NoError(t, err)
			check(e.Context, true, f)
			require.NoError(t, rx.Release(e.Buf))
		}
		return n
	}
	post()
	for time.Now().Before(end) && lost < size/4 {
		// The device: take what is available, complete it, some of it
		// badly.
		for range rng.IntN(8) + 1 {
			tk, ok := d.take()
			if !ok {
				break
			}
			o := posted[0]
			posted = posted[1:]
			k := soakOK
			if rng.IntN(100) < 4 {
				k = 1 + rng.IntN(soakKinds-1)
				if k == soakWrongPhase && !packed {
					k = soakBadID
				}
			}
			faults[k]++
			frame := frameFor(o.seq, 64+o.seq%1400)
			switch k {
			case soakOK:
				o.wantGood = true
				writeFrameAt(tk, frame)
				d.complete(tk.id, uint32(netHdrLen+len(frame)), tk.ndesc)
			case soakLong:
				d.complete(tk.id, 2049+uint32(rng.IntN(1<<20)), tk.ndesc)
			case soakShort:
				d.complete(tk.id, uint32(rng.IntN(netHdrLen+nic.MinFrame)), tk.ndesc)
			case soakMulti:
				tk2, ok := d.take() // the frame's second buffer
				if !ok {
					d.complete(tk.id, 4096, tk.ndesc)
					break
				}
				posted = posted[1:] // its op completes with an error too
				b := tk.data(0)
				binary.LittleEndian.PutUint16(b[netHdrNumBuffers:], 2)
				d.complete(tk.id, 2048, tk.ndesc)
				d.complete(tk2.id, 100, tk2.ndesc)
			case soakBadID, soakGarbage:
				// Garbage names no outstanding id either: an entry that
				// names one with a length that fits is a completion no
				// driver can tell from a real one. The entry takes the
				// buffer's place (its position on a packed ring, its
				// used element on a split one): the buffer is lost. An
				// extra split element would move the used index past
				// the available one, which breaks the queue (the
				// misbehave tests cover that).
				if packed {
					id, ln := uint16(size+rng.IntN(1<<15-size)), uint32(rng.IntN(1<<20))
					if k == soakGarbage {
						id, ln = uint16(size+rng.IntN(1<<16-size)), rng.Uint32()
						binary.LittleEndian.PutUint64(tk.data(0)[:8], rng.Uint64())
					}
					d.writeUsed(d.usedPos, id, ln, d.usedWrap, d.usedWrap)
					d.advanceUsed(tk.ndesc)
				} else {
					id, ln := uint32(size+rng.IntN(1<<20)), uint32(rng.IntN(1<<20))
					if k == soakGarbage {
						id, ln = size+rng.Uint32N(1<<32-size), rng.Uint32()
					}
					d.completeRaw(id, ln)
				}
				lost++
				o.lost = true
			case soakWrongPhase:
				d.writeUsed(d.usedPos, tk.id, 100, !d.usedWrap, d.usedWrap)
				d.advanceUsed(tk.ndesc)
				lost++
				o.lost = true
			}
		}
		// The driver: read everything there is, then post again.
		for read() > 0 {
		}
		post()
	}
	for read() > 0 {
	}
	st.reads += reads
	st.errComps += errComps
	st.lost += lost
	for k, n := range faults {
		st.faults[k] += n
	}
	st.good += goods
	// Every buffer the device completed went back exactly once; the ones
	// still posted are those it lost plus those it never took.
	require.Equal(t, lost+len(posted), rx.Outstanding(), "no slot leaked")
	untaken := map[*op]bool{}
	for _, o := range posted {
		untaken[o] = true
	}
	for _, o := range all {
		switch {
		case o.lost || untaken[o]:
			require.Zero(t, o.done, "op %d never completed by the device", o.seq)
		default:
			require.Equal(t, 1, o.done, "op %d completed once", o.seq)
			require.Equal(t, o.wantGood, o.good, "op %d: good as the device wrote it", o.seq)
		}
	}
	accounted(t, rx, 0)
}

// writeFrameAt puts a frame with num_buffers 1 into the buffer the device
// took.
func writeFrameAt(tk taken, frame []byte) {
	b := tk.data(0)
	clear(b[:netHdrLen])
	binary.LittleEndian.PutUint16(b[netHdrNumBuffers:], 1)
	copy(b[netHdrLen:], frame)
}

// advanceUsed moves the packed device's used position past n descriptors.
func (f *fakeDev) advanceUsed(n int) {
	f.usedPos += uint16(n)
	if f.usedPos >= f.size {
		f.usedPos -= f.size
		f.usedWrap = !f.usedWrap
	}
}

// completeRaw appends a split used element with any id and length.
func (f *fakeDev) completeRaw(id, length uint32) {
	e := unsafe.Pointer(&f.mem.device[4+8*int(f.usedIdx&(f.size-1))])
	*(*uint32)(e) = id
	*(*uint32)(unsafe.Add(e, 4)) = length
	f.usedIdx++
	f.publishUsed()
}
