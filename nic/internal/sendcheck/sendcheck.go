// Package sendcheck is the check each driver's tests run on
// nic.TxQueue.SendFunc, the in-place send: its refusals, frames written in
// place arriving intact with their contexts, and the contract that a
// transmit buffer keeps what the last frame sent from it left there (zeros
// in one never used), which lets a sender write only the bytes that change.
package sendcheck

import (
	"encoding/binary"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/nic"
)

// EtherType is the check's frames' type (IEEE local experimental): a Wire
// returns only frames of this type.
const EtherType = 0x88b7

// hdr is what a header-only fill writes: the Ethernet header and an
// 8-byte sequence number.
const hdr = 22

// Wire returns the next n frames of EtherType the queue's device put on
// the wire since its last call, in order (after the check's Flush), or
// fails t.
type Wire func(t testing.TB, n int) [][]byte

// Run checks tx's SendFunc; dst and src go into the frames' headers. The
// queue must be fresh (nothing sent from it yet) and have no other sender.
func Run(t *testing.T, tx nic.TxQueue, dst, src net.HardwareAddr, wire Wire) {
	t.Helper()
	called := false
	mark := func([]byte) { called = true }
	require.ErrorIs(t, tx.SendFunc(100, nil, nil), nic.ErrInvalid, "nil fill")
	require.ErrorIs(t, tx.SendFunc(nic.MinFrame-1, nil, mark), nic.ErrFrameSize)
	require.ErrorIs(t, tx.SendFunc(tx.MaxFrame()+1, nil, mark), nic.ErrFrameSize)
	require.False(t, called, "fill called for a refused send")

	const size = 200
	header := func(b []byte, seq int) {
		copy(b[0:], dst)
		copy(b[6:], src)
		binary.BigEndian.PutUint16(b[12:], EtherType)
		binary.LittleEndian.PutUint64(b[14:], uint64(seq))
	}
	pattern := func(i int) byte { return byte(i*13 + 5) }
	full := func(seq, n int) []byte {
		b := make([]byte, n)
		header(b, seq)
		for i := hdr; i < n; i++ {
			b[i] = pattern(i) ^ byte(seq)
		}
		return b
	}
	comps := make([]nic.Completion, 64)
	seq := 0
	// burst posts until the ring is full, hands the frames to the device
	// and returns how many; reclaim then reads their completions.
	burst := func(send func(seq int) error) int {
		n := 0
		for ; ; n++ {
			require.Less(t, n, 4*tx.Size()+4, "the queue never filled")
			err := send(seq + n)
			if errors.Is(err, nic.ErrFull) {
				break
			}
			require.NoError(t, err)
		}
		require.Positive(t, n)
		require.NoError(t, tx.Flush())
		return n
	}
	reclaim := func(ctxs []any) {
		got := 0
		for deadline := time.Now().Add(10 * time.Second); tx.Outstanding() > 0; {
			require.True(t, time.Now().Before(deadline), "%d sends never completed", tx.Outstanding())
			k := tx.Poll(comps)
			for _, c := range comps[:k] {
				require.NoError(t, c.Err)
				if ctxs != nil {
					require.Equal(t, ctxs[got], c.Context, "completion %d's context", got)
				}
				got++
			}
			if k == 0 {
				time.Sleep(100 * time.Microsecond)
				_ = tx.Flush()
			}
		}
	}
	headerOnly := func(s int) error {
		return tx.SendFunc(size, nil, func(b []byte) {
			if len(b) != size {
				panic("SendFunc lent a buffer of the wrong length")
			}
			header(b, s)
		})
	}
	expect := func(frames [][]byte, first int, body func(i int) byte, what string) {
		t.Helper()
		for k, f := range frames {
			require.Len(t, f, size, "%s: frame %d", what, k)
			require.EqualValues(t, first+k, binary.LittleEndian.Uint64(f[14:]), "%s: frame %d's sequence number", what, k)
			for i := hdr; i < size; i++ {
				if f[i] != body(i) {
					t.Fatalf("%s: frame %d byte %d is %#x, want %#x", what, k, i, f[i], body(i))
				}
			}
		}
	}

	// Fresh buffers hold zeros: a header-only frame is zeros after it.
	n := burst(headerOnly)
	expect(wire(t, n), seq, func(int) byte { return 0 }, "fresh buffers")
	seq += n
	reclaim(nil)

	// Two full rings of copied frames with the same body leave it in every
	// buffer; header-only frames then carry it.
	for range 2 {
		n = burst(func(s int) error {
			f := full(0, size)
			binary.LittleEndian.PutUint64(f[14:], uint64(s))
			return tx.Send(f, nil)
		})
		expect(wire(t, n), seq, func(i int) byte { return pattern(i) }, "copied frames")
		seq += n
		reclaim(nil)
	}
	n = burst(headerOnly)
	expect(wire(t, n), seq, func(i int) byte { return pattern(i) }, "buffers kept")
	seq += n
	reclaim(nil)

	// Whole frames written in place, of several lengths, each with its
	// context.
	var ctxs []any
	// Untagged frames: MaxFrame may allow for a VLAN tag (a socket
	// refuses an untagged frame longer than MTU+14).
	lens := []int{nic.MinFrame, 60, 61, min(1514, tx.MaxFrame()), 333}
	n = burst(func(s int) error {
		l := lens[s%len(lens)]
		if l < hdr {
			l = hdr
		}
		ctxs = append(ctxs, s)
		err := tx.SendFunc(l, s, func(b []byte) { copy(b, full(s, l)) })
		if err != nil {
			ctxs = ctxs[:len(ctxs)-1]
		}
		return err
	})
	frames := wire(t, n)
	for k, f := range frames {
		s := seq + k
		l := max(lens[s%len(lens)], hdr)
		require.Equal(t, full(s, l), f, "in-place frame %d", k)
	}
	reclaim(ctxs)
}
