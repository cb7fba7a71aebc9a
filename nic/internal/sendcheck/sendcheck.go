// Package sendcheck is the check each driver's tests run on
// nic.TxQueue.SendFunc, the in-place send: its refusals, frames written in
// place arriving intact with their contexts, and the contract that a
// transmit buffer keeps what the last frame sent from it left there (zeros
// in one never used), which lets a sender write only the bytes that change;
// and on nic.TxQueue.SendBurst: refusals part-way (a bad frame, a full
// ring) leaving the frames before posted, contexts in order, no
// allocation.
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

// Run checks tx's SendFunc, then its SendBurst; dst and src go into the
// frames' headers. The queue must be fresh (nothing sent from it yet) and
// have no other sender.
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
	seq += n
	reclaim(ctxs)

	burstCheck(t, tx, full, wire, reclaim, seq)
}

// burstCheck checks tx's SendBurst, with full(seq, n) making frame seq of
// n bytes, wire and reclaim Run's, and seq the next frame's number.
func burstCheck(t *testing.T, tx nic.TxQueue, full func(seq, n int) []byte, wire Wire, reclaim func(ctxs []any), seq int) {
	const size = 100
	// frames makes k frames numbered from seq on, with contexts seq, ...
	frames := func(k int) ([][]byte, []any) {
		fs, cs := make([][]byte, k), make([]any, k)
		for i := range fs {
			fs[i], cs[i] = full(seq+i, size), seq+i
		}
		return fs, cs
	}
	arrive := func(n int, what string) {
		t.Helper()
		got := wire(t, n)
		require.Len(t, got, n, what)
		for k, f := range got {
			require.Equal(t, full(seq+k, size), f, "%s: frame %d", what, k)
		}
	}

	n, err := tx.SendBurst(nil, nil)
	require.NoError(t, err, "an empty burst")
	require.Zero(t, n)
	fs, cs := frames(2)
	n, err = tx.SendBurst(fs, cs[:1])
	require.ErrorIs(t, err, nic.ErrInvalid, "one context for two frames")
	require.Zero(t, n, "nothing posted with the wrong contexts")

	// A bad frame part-way: those before it are posted, with their
	// contexts, and go out at the Flush; the bad one and those after it
	// are not.
	fs, cs = frames(5)
	short, long := make([]byte, nic.MinFrame-1), make([]byte, tx.MaxFrame()+1)
	n, err = tx.SendBurst([][]byte{fs[0], fs[1], short, fs[4]}, []any{cs[0], cs[1], "short", cs[4]})
	require.ErrorIs(t, err, nic.ErrFrameSize, "a short frame third")
	require.Equal(t, 2, n, "the two frames before it posted")
	n, err = tx.SendBurst([][]byte{fs[2], long, fs[4]}, nil)
	require.ErrorIs(t, err, nic.ErrFrameSize, "a long frame second")
	require.Equal(t, 1, n)
	require.NoError(t, tx.Flush())
	arrive(3, "a burst refused part-way")
	reclaim([]any{cs[0], cs[1], nil})
	seq += 3

	// A burst longer than the ring: posted until it is full.
	fs, cs = frames(4*tx.Size() + 4)
	n, err = tx.SendBurst(fs, cs)
	require.ErrorIs(t, err, nic.ErrFull, "a burst longer than the ring")
	require.Positive(t, n)
	require.Less(t, n, len(fs))
	require.NoError(t, tx.Flush())
	arrive(n, "a burst up to a full ring")
	reclaim(cs[:n])
	seq += n

	// No allocation, per frame or per burst.
	const runs = 2
	k := max(1, min(8, tx.Size()/(2*(runs+1))))
	fs, cs = frames(k * (runs + 1))
	i := 0
	allocs := testing.AllocsPerRun(runs, func() {
		n, err := tx.SendBurst(fs[i:i+k], cs[i:i+k])
		if n != k || err != nil {
			t.Fatalf("burst of %d: %d posted, %v", k, n, err)
		}
		i += k
	})
	require.Zero(t, allocs, "allocations per burst of %d", k)
	require.NoError(t, tx.Flush())
	arrive(len(fs), "the bursts measured")
	reclaim(cs)
}
