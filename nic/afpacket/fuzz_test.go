package afpacket

import (
	"encoding/binary"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/nic"
	"golang.org/x/sys/unix"
)

const fuzzSlots = 8

// fakeRx is a receive queue over a ring in anonymous memory, every slot
// posted (status zero, as the kernel sees a free slot).
func fakeRx(t testing.TB) *RxQueue {
	m, err := unix.Mmap(-1, 0, fuzzSlots*2048, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	require.NoError(t, err)
	t.Cleanup(func() { _ = unix.Munmap(m) })
	q, err := newRxQueue(&sock{fd: -1, ring: m}, 0, "fuzz", fuzzSlots, 2048)
	require.NoError(t, err)
	for i := range uint32(fuzzSlots) {
		*q.status(i) = held
	}
	for q.PostRecv(nil) == nil {
	}
	require.Equal(t, fuzzSlots, q.Outstanding())
	return q
}

// hdr is a tpacket2_hdr's fields the kernel writes and the driver reads.
func hdr(status, wire, snap uint32, mac uint16) []byte {
	b := make([]byte, 16)
	binary.LittleEndian.PutUint32(b, status)
	binary.LittleEndian.PutUint32(b[4:], wire)
	binary.LittleEndian.PutUint32(b[8:], snap)
	binary.LittleEndian.PutUint16(b[12:], mac)
	return b
}

// FuzzRxRing: whatever the kernel writes into the slots' headers (status,
// tp_len, tp_snaplen, tp_mac: 16 bytes per slot from data), the queue
// returns error completions lending nothing or frames inside their slot,
// each lent once; consumed slots stay the driver's (never zero) until
// handed back.
func FuzzRxRing(f *testing.F) {
	f.Add(append(hdr(1, 60, 60, 66), hdr(1, 1514, 1514, 66)...))
	f.Add(hdr(1|unix.TP_STATUS_CSUMNOTREADY, 60, 60, 66))
	f.Add(hdr(1, 3000, 1982, 66))   // truncated
	f.Add(hdr(1, 60, 60, 2000))     // frame beyond the slot
	f.Add(hdr(1, 60, 60, 8))        // inside the kernel's header
	f.Add(hdr(1, 13, 13, 66))       // shorter than a header
	f.Add(hdr(0, 60, 60, 66))       // not the driver's yet
	f.Add(hdr(1, 1<<31, 1<<31, 66)) // lengths beyond anything
	f.Fuzz(func(t *testing.T, data []byte) {
		q := fakeRx(t)
		for i := 0; i < fuzzSlots && 16*i < len(data); i++ {
			copy(q.s.ring[i*2048:i*2048+16], data[16*i:])
		}
		comps := make([]nic.Completion, 3)
		lent := map[uintptr]bool{}
		base := uintptr(unsafe.Pointer(&q.s.ring[0]))
		for range 2 * fuzzSlots {
			n := q.Poll(comps)
			for i, c := range comps[:n] {
				if c.Err != nil {
					require.Equal(t, n-1, i, "an error completion is the last")
					require.Nil(t, c.Data)
					continue
				}
				slot := int((c.Buf - base) / 2048)
				require.Less(t, slot, fuzzSlots)
				require.GreaterOrEqual(t, c.Len, nic.MinFrame)
				require.LessOrEqual(t, int(c.Buf-base)+c.Len, (slot+1)*2048, "inside its slot")
				require.GreaterOrEqual(t, int(c.Buf-base), slot*2048+hdrLen)
				require.Equal(t, c.Buf, uintptr(unsafe.Pointer(&c.Data[0])))
				require.False(t, lent[c.Buf])
				lent[c.Buf] = true
				require.NotZero(t, *q.status(uint32(slot)), "a lent slot is not the kernel's")
			}
			if n == 0 {
				break
			}
		}
		nlent := 0
		for i := range uint32(fuzzSlots) {
			_, err := q.bufs.Lent(q.bufs.Start(i) + frameOff)
			switch {
			case err == nil:
				nlent++
			case !q.bufs.InUse(i):
				require.NotZero(t, *q.status(i), "a free slot is not the kernel's")
			}
		}
		require.Equal(t, len(lent), nlent)
		for b := range lent {
			require.NoError(t, q.Repost(b, nil))
		}
	})
}

// TestSlotChecks: a frame the kernel put elsewhere than frameOff is moved
// there; a VLAN tag is put back only where the slot has room for it, else
// the frame completes with cq.ProvMultiBuffer and its slot goes back.
func TestSlotChecks(t *testing.T) {
	for _, tc := range []struct {
		name      string
		snap, mac uint32
		tag       uint32 // tp_vlan_tci | tp_vlan_tpid<<16
		want      error  // nil: a good frame
		wantLen   int
	}{
		{"at frameOff", 60, frameOff, 0, nil, 60},
		{"moved", 60, 62, 0, nil, 60},
		{"tagged", 60, frameOff, 0x8100<<16 | 5, nil, 64},
		{"tagged, full slot", 2048 - frameOff - vlanLen, frameOff, 0x8100<<16 | 5, nil, 2048 - frameOff},
		{"tagged, no room", 2048 - frameOff, frameOff, 0x8100<<16 | 5, cq.ProvMultiBuffer, 0},
		{"moved, no room", 2048 - 60, 60, 0, cq.ProvMultiBuffer, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := fakeRx(t)
			slot := q.s.ring[:2048]
			for i := range int(tc.snap) {
				slot[int(tc.mac)+i] = byte(i)
			}
			binary.LittleEndian.PutUint32(slot[24:], tc.tag)
			copy(slot, hdr(1, tc.snap, tc.snap, uint16(tc.mac)))
			comps := make([]nic.Completion, 1)
			require.Equal(t, 1, q.Poll(comps))
			c := comps[0]
			if tc.want != nil {
				require.ErrorIs(t, c.Err, tc.want)
				posted, lent := q.bufs.Counts()
				require.Equal(t, [2]int{fuzzSlots - 1, 0}, [2]int{posted, lent}, "the slot is the driver's again")
				return
			}
			require.NoError(t, c.Err)
			require.Equal(t, tc.wantLen, c.Len)
			require.Equal(t, q.bufs.Start(0)+frameOff, c.Buf)
			want := make([]byte, tc.snap)
			for i := range want {
				want[i] = byte(i)
			}
			if tc.tag != 0 {
				want = append(append(append([]byte(nil), want[:12]...), 0x81, 0, 0, 5), want[12:]...)
			}
			require.Equal(t, want, c.Data)
		})
	}
}
