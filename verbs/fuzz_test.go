package verbs_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/cq/qpsim"
	"github.com/vfnic/vfnic/cq/ring"
	"github.com/vfnic/vfnic/doorbell"
	"github.com/vfnic/vfnic/verbs"
	"github.com/vfnic/vfnic/verbs/simverbs"
)

// fuzzRing is the number of entries of FuzzPoll's ring.
const fuzzRing = 16

// fuzzQueues are the queues FuzzPoll posts to: QP 0 and QP 1, send (even)
// and receive (odd).
var fuzzQueues = []uint32{0, 1, 2, 3}

// fuzzProvider is the software device's verbs provider (its codes, vendor
// errors and QP numbering) over a ring whose bytes the fuzzer writes: the
// ring and the tables of operations posted to it are made by OpenCQ.
type fuzzProvider struct {
	simverbs.Provider
	t     *testing.T
	mem   []byte // the ring
	over  doorbell.Reg32
	posts int
	tabs  map[uint32]*ring.Table
}

// OpenCQ implements verbs.Provider: a CQ over a sim-format ring of
// fuzzRing entries, with posts operations on each of fuzzQueues.
func (p *fuzzProvider) OpenCQ(entries, vector int, format cq.Format, single bool) (*cq.CQ, error) {
	t := p.t
	page, err := unix.Mmap(-1, 0, 4096+fuzzRing*qpsim.CQESize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	require.NoError(t, err)
	t.Cleanup(func() { _ = unix.Munmap(page) })
	w := doorbell.NewWindow(page[:4096])
	cons, err := w.Reg32(qpsim.OffCQConsumer)
	require.NoError(t, err)
	p.over, err = w.Reg32(qpsim.OffCQOverrun)
	require.NoError(t, err)
	p.mem = page[4096:]
	src, err := ring.NewRingSource(ring.RingConfig{Mem: p.mem, Layout: qpsim.Layout(fuzzRing), Codes: qpsim.Codes(),
		Regs: ring.RingRegs{Doorbell: doorbell.NewDoorbell(cons), Overrun: p.over, OverrunMask: 1}})
	require.NoError(t, err)
	c, err := cq.New(cq.Attr{Size: max(entries, fuzzRing), Format: format, WaitObj: cq.WaitFD, SingleThreaded: single},
		qpsim.Limits())
	if err != nil {
		return nil, err
	}
	require.NoError(t, c.Driver().AddSource(src))
	p.tabs = map[uint32]*ring.Table{}
	for _, qn := range fuzzQueues {
		tab, err := ring.NewTable(fuzzRing, 32)
		require.NoError(t, err)
		require.NoError(t, src.BindTable(qn, tab))
		p.tabs[qn] = tab
		for i := range p.posts {
			op := ring.Op{Context: fuzzWRID(qn, i), Len: 64 + i, Flags: cq.FlagSend | cq.FlagMsg}
			if qn%2 == 1 {
				op.Flags, op.Buf = cq.FlagRecv|cq.FlagMsg, uintptr(0x10000*(i+1))
			}
			_, err := tab.Post(op)
			require.NoError(t, err)
		}
	}
	return c, nil
}

// fuzzWRID is the work request id of operation i of queue qn.
func fuzzWRID(qn uint32, i int) uint64 { return uint64(qn)<<8 | uint64(i) }

// fuzzEntry is the entry the software device writes for operation i of
// queue qn (the first posting of slot i has id 1<<4|i in a 16-slot table).
func fuzzEntry(qn uint32, i int, ln uint32) []byte {
	e := make([]byte, qpsim.CQESize)
	binary.LittleEndian.PutUint32(e[qpsim.OffID:], 1<<4|uint32(i))
	binary.LittleEndian.PutUint16(e[qpsim.OffQueue:], uint16(qn))
	e[qpsim.OffOpcode] = byte(qpsim.OpSend)
	if qn%2 == 1 {
		e[qpsim.OffOpcode] = byte(qpsim.OpRecv)
	}
	binary.LittleEndian.PutUint32(e[qpsim.OffByteLen:], ln)
	binary.LittleEndian.PutUint32(e[qpsim.OffOwner:], qpsim.OwnerBit) // the first lap's phase
	return e
}

// FuzzPoll fills a software-device ring with arbitrary bytes, after
// operations were posted on two QPs, and reads it through a verbs CQ
// (Poll, which runs the extended-polling iterator) and through a cq.CQ
// over the same bytes. Nothing may panic; every work completion must be
// the cq.CQ's completion decoded (its wrid, status from the error number,
// opcode, length and QP number); each work request completes at most
// once; and a successful one reports the kind of operation posted (a send
// as IBV_WC_SEND, a receive as IBV_WC_RECV or RECV_RDMA_WITH_IMM) and at
// most the bytes posted.
//
// Input: byte 0 is how many operations are posted per queue (mod 17),
// byte 1 bit 0 flags an overrun at the end; the rest is the ring.
func FuzzPoll(f *testing.F) {
	for _, s := range pollSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) { pollFuzzed(t, data) })
}

// pollSeeds are FuzzPoll's seed corpus: the entries a well-behaved device
// writes, the same with bytes flipped, and with a receive reported for a
// send and a send for a receive.
func pollSeeds() [][]byte {
	var seeds [][]byte
	var good []byte
	for i := range 4 {
		for _, qn := range fuzzQueues {
			good = append(good, fuzzEntry(qn, i, uint32(10+i))...)
		}
	}
	seeds = append(seeds, append([]byte{8, 0}, good...))
	bad := append([]byte(nil), good...)
	for i := 5; i < len(bad); i += 11 {
		bad[i] ^= 0x3c
	}
	seeds = append(seeds, append([]byte{6, 1}, bad...))
	wrong := append([]byte(nil), good...)
	wrong[qpsim.OffOpcode] = byte(qpsim.OpRecv) // a receive reported for a send
	wrong[qpsim.CQESize+qpsim.OffOpcode] = byte(qpsim.OpSend)
	seeds = append(seeds, append([]byte{4, 0}, wrong...))
	return seeds
}

// TestPollSeeds: FuzzPoll's seeds reach successful completions, refused
// entries, and the refusal of an opcode for another kind of operation.
func TestPollSeeds(t *testing.T) {
	seeds := pollSeeds()
	good, bad, _ := pollFuzzed(t, seeds[0])
	require.Equal(t, 16, good)
	require.Zero(t, bad)
	_, bad, _ = pollFuzzed(t, seeds[1])
	require.Positive(t, bad)
	good, bad, badOp := pollFuzzed(t, seeds[2])
	require.Equal(t, 14, good)
	require.Equal(t, 2, bad)
	require.Equal(t, 2, badOp)
}

// pollFuzzed is FuzzPoll's body; it returns the successful and the error
// work completions read, and how many of those were refused as an opcode
// for another kind of operation (cq.ProvBadOp).
func pollFuzzed(t *testing.T, data []byte) (good, bad, badOp int) {
	if len(data) < 2 {
		return
	}
	posts, overrun, body := int(data[0])%(fuzzRing+1), data[1]&1 != 0, data[2:]
	var ps [2]*fuzzProvider
	var vc *verbs.CQ
	var fc *cq.CQ
	for i := range ps {
		ps[i] = &fuzzProvider{t: t, posts: posts}
		var err error
		if i == 0 {
			vc, err = verbs.CreateCQ(ps[i], verbs.CQInitAttr{CQE: fuzzRing,
				Fields: verbs.FieldByteLen | verbs.FieldQPNum | verbs.FieldImm | verbs.FieldSrcQP})
			require.NoError(t, err)
			t.Cleanup(func() { _ = vc.Close() })
		} else {
			fc, err = ps[i].OpenCQ(fuzzRing, 0, cq.FormatData, false)
			require.NoError(t, err)
			t.Cleanup(func() { _ = fc.Close() })
		}
		copy(ps[i].mem, body)
		if overrun {
			ps[i].over.Write(1)
		}
	}
	posted := map[uint64]int{} // wrid -> queue
	for _, qn := range fuzzQueues {
		for i := range posts {
			posted[fuzzWRID(qn, i)] = int(qn)
		}
	}
	seen := map[uint64]bool{}
	wcs := make([]verbs.WC, 5)
	ents := make([]cq.Entry, 1)
	for step, idle := 0, 0; step < 8*fuzzRing && idle < 2; step++ {
		n, verr := vc.Poll(wcs)
		if verr != nil {
			// Only the overrun the input asked for ends a read.
			require.True(t, overrun, "step %d: %v", step, verr)
			require.ErrorIs(t, verr, cq.ErrOverrun)
			_, ferr := fc.Read(ents)
			require.ErrorIs(t, ferr, cq.ErrOverrun, "both CQs overrun")
			return good, bad, badOp
		}
		if n == 0 {
			idle++
		} else {
			idle = 0
		}
		for k, w := range wcs[:n] {
			msg := fmt.Sprintf("step %d wc %d %+v", step, k, w)
			// The same completion from the layer below.
			var want cq.Entry
			status, vendor := verbs.WCSuccess, uint32(0)
			m, ferr := fc.Read(ents)
			if errors.Is(ferr, cq.ErrAvail) {
				var ee cq.ErrEntry
				require.NoError(t, fc.ReadErr(&ee), msg)
				want, status = ee.Entry, verbs.StatusOf(&ee)
				vendor = ps[1].VendorErr(&ee)
				bad++
				if ee.ProvErrno == cq.ProvBadOp {
					badOp++
				}
			} else {
				require.NoError(t, ferr, msg)
				require.Equal(t, 1, m, msg)
				want = ents[0]
				good++
			}
			require.Equal(t, want.Context, w.Context, msg)
			require.Equal(t, status, w.Status, msg)
			require.Equal(t, vendor, w.VendorErr, msg)
			require.NotContains(t, w.Status.String(), "WCStatus(", msg)
			require.Equal(t, uint32(want.Len), w.ByteLen, msg)
			require.Equal(t, want.Queue>>1, w.QPNum, msg)
			if want.Context == nil {
				require.Zero(t, w.WRID, "%s: a refused entry is tied to no work request", msg)
				continue
			}
			qn, ok := posted[w.WRID]
			require.True(t, ok, "%s: never posted", msg)
			require.False(t, seen[w.WRID], "%s: completed twice", msg)
			seen[w.WRID] = true
			require.Equal(t, uint32(qn>>1), w.QPNum, msg)
			if w.Status != verbs.WCSuccess {
				continue
			}
			i := int(w.WRID & 0xff)
			require.LessOrEqual(t, w.ByteLen, uint32(64+i), "%s: more than posted", msg)
			if qn%2 == 0 {
				require.Equal(t, verbs.WCSend, w.Opcode, msg)
			} else {
				require.Contains(t, []verbs.WCOpcode{verbs.WCRecv, verbs.WCRecvRDMAWithImm}, w.Opcode, msg)
			}
		}
	}
	// The verbs CQ read everything the cq.CQ holds.
	m, ferr := fc.Read(ents)
	require.Zero(t, m)
	require.True(t, errors.Is(ferr, cq.ErrAgain) || errors.Is(ferr, cq.ErrOverrun), "%v", ferr)
	for _, tab := range ps[0].tabs {
		require.LessOrEqual(t, tab.Outstanding(), posts)
		require.Equal(t, posts, tab.Outstanding()+countDone(seen, tab, ps[0].tabs))
	}
	return good, bad, badOp
}

// countDone counts the work requests seen completed that were posted to
// tab.
func countDone(seen map[uint64]bool, tab *ring.Table, tabs map[uint32]*ring.Table) int {
	n := 0
	for wrid := range seen {
		if tabs[uint32(wrid>>8)] == tab {
			n++
		}
	}
	return n
}
