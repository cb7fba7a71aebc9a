package igb

import (
	"errors"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/nic"
)

// wbEvent is one completion as either API reports it: the posted
// context, the length, and the code of an error (0 for a success).
type wbEvent struct {
	ctx  any
	len  int
	code int
}

// codeOf is the provider code a queue-API error carries through the CQ
// API (ProvErrno).
func codeOf(err error) int {
	switch {
	case errors.Is(err, nic.ErrBadLen):
		return cq.ProvBadLen
	case errors.Is(err, nic.ErrBadPhase):
		return cq.ProvBadPhase
	case errors.Is(err, nic.ErrMultiBuffer):
		return provMultiBuffer
	case errors.Is(err, nic.ErrBadID):
		return cq.ProvBadID
	}
	return -100 // anything else: no match with the CQ side
}

// FuzzWriteBack writes arbitrary bytes over igb's receive descriptor ring
// after buffers were posted (so DD, EOP, lengths and the offload words are
// whatever the input says) and reads the ring through the queue API
// (Poll, nic.Completion) on one device and through a CQ (cq.Entry,
// ReadErr) on a twin with the same bytes. Both must report the same
// completions with the same codes, nothing may panic, and both must
// account for every buffer afterwards (free, posted or lent) with their
// outstanding counts equal.
//
// Input: byte 0 the buffers posted (up to the ring's 7), the rest written
// over the ring from descriptor 0.
func FuzzWriteBack(f *testing.F) {
	good := make([]byte, 1+8*descSize)
	good[0] = 7
	for i := range 4 {
		d := good[1+i*descSize:]
		d[8] = byte(rxdStatusDD | rxdStatusEOP)
		d[12] = byte(60 + i)
	}
	f.Add(good)
	noEOP := append([]byte(nil), good...)
	noEOP[1+8] = byte(rxdStatusDD) // a frame that continues in the next buffer
	f.Add(noEOP)
	long := append([]byte(nil), good...)
	long[1+12], long[1+13] = 0x01, 0x08 // 2049 bytes in a 2048-byte buffer
	f.Add(long)
	beyond := append([]byte(nil), good...)
	beyond[0] = 2 // DD on descriptors that were never posted
	f.Add(beyond)
	hole := append([]byte(nil), good...)
	hole[1+8] = 0 // no DD before one with DD
	f.Add(hole)
	flipped := append([]byte(nil), good...)
	for i := 3; i < len(flipped); i += 5 {
		flipped[i] ^= 0xa5
	}
	f.Add(flipped)
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 1 {
			return
		}
		posts := int(data[0]) % 8
		body := data[1:]
		type side struct {
			d   *Device
			rx  *RxQueue
			c   *cq.CQ
			got []wbEvent
		}
		mk := func(viaCQ bool) *side {
			d, _ := newFakeDevice(t, Config{Config: nic.Config{QueueSize: 8, RxBuffers: 16}})
			s := &side{d: d, rx: d.rx[0]}
			if viaCQ {
				c, err := cq.New(cq.Attr{Format: cq.FormatData}, cq.Limits{})
				require.NoError(t, err)
				require.NoError(t, d.BindCQ(c, 0, nic.Recv))
				s.c = c
				t.Cleanup(func() { _ = d.Close(); _ = c.Close() })
			} else {
				t.Cleanup(func() { _ = d.Close() })
			}
			for i := range posts {
				require.NoError(t, s.rx.PostRecv(i))
			}
			require.NoError(t, s.rx.Flush())
			ring := unsafe.Slice((*byte)(unsafe.Pointer(&s.rx.desc[0])), len(s.rx.desc))
			copy(ring, body)
			return s
		}
		sides := [2]*side{mk(false), mk(true)}
		out := make([]nic.Completion, 3)
		ents := make([]cq.Entry, 3)
		for step := 0; step < 32; step++ {
			// Queue API.
			a := sides[0]
			n := a.rx.Poll(out)
			for _, c := range out[:n] {
				e := wbEvent{ctx: c.Context, len: c.Len}
				if c.Err != nil {
					e.code = codeOf(c.Err)
					require.Nil(t, c.Data)
				} else {
					require.Len(t, c.Data, c.Len)
					require.NoError(t, a.rx.Release(c.Buf))
				}
				a.got = append(a.got, e)
			}
			// CQ API, the same number of reads.
			b := sides[1]
			k, err := b.c.Read(ents)
			switch {
			case err == cq.ErrAvail:
				var ee cq.ErrEntry
				require.NoError(t, b.c.ReadErr(&ee))
				b.got = append(b.got, wbEvent{ctx: ee.Context, len: ee.Len, code: ee.ProvErrno})
			case err == cq.ErrAgain:
			default:
				require.NoError(t, err)
				for _, e := range ents[:k] {
					f, err := b.rx.Frame(e.Buf, e.Len)
					require.NoError(t, err)
					require.Len(t, f, e.Len)
					require.NoError(t, b.rx.Release(e.Buf))
					b.got = append(b.got, wbEvent{ctx: e.Context, len: e.Len})
				}
			}
		}
		// Drain both, then compare.
		for range 16 {
			n := sides[0].rx.Poll(out)
			for _, c := range out[:n] {
				e := wbEvent{ctx: c.Context, len: c.Len}
				if c.Err != nil {
					e.code = codeOf(c.Err)
				} else {
					require.NoError(t, sides[0].rx.Release(c.Buf))
				}
				sides[0].got = append(sides[0].got, e)
			}
			k, err := sides[1].c.Read(ents)
			if err == cq.ErrAvail {
				var ee cq.ErrEntry
				require.NoError(t, sides[1].c.ReadErr(&ee))
				sides[1].got = append(sides[1].got, wbEvent{ctx: ee.Context, len: ee.Len, code: ee.ProvErrno})
			} else if err == nil {
				for _, e := range ents[:k] {
					require.NoError(t, sides[1].rx.Release(e.Buf))
					sides[1].got = append(sides[1].got, wbEvent{ctx: e.Context, len: e.Len})
				}
			}
		}
		require.Equal(t, sides[0].got, sides[1].got, "the queue API and the CQ report the same completions")
		for _, s := range sides {
			posted := 0
			for _, st := range s.rx.state {
				if st == bufPosted {
					posted++
				}
			}
			require.Equal(t, s.rx.pool.Cap(), s.rx.pool.Free()+posted, "every buffer free or posted")
			require.LessOrEqual(t, s.rx.Outstanding(), posts)
		}
		require.Equal(t, sides[0].rx.Outstanding(), sides[1].rx.Outstanding())
	})
}
