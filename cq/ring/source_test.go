package ring

import (
	"context"
	"errors"
	"fmt"
	"github.com/vfnic/vfnic/cq"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vfnic/vfnic/doorbell"
)

// harness is a CQ over one 64-byte ring written by a fakeDev, with one
// posted-operation table on queue 3.
type harness struct {
	t     testing.TB
	c     *cq.CQ
	src   *RingSource
	dev   *fakeDev
	tab   *Table
	over  doorbell.Reg32
	cons  doorbell.Reg32
	arms  *armRecorder
	queue uint32
}

// armRecorder is a Notifier that counts arms and, like a device with an
// arm doorbell, fires at once when entries beyond the consumer index exist.
type armRecorder struct {
	mu    sync.Mutex
	n     int
	h     *harness
	fired int
	armed bool
	cons  uint32
	thr   uint32
	lose  int // interrupts to drop (under mu)
}

func (a *armRecorder) Arm(consumed uint32, _ bool, threshold int) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.n++
	a.armed, a.cons, a.thr = true, consumed, uint32(max(threshold, 1))
	return a.fireLocked()
}

func (a *armRecorder) fireLocked() error {
	if !a.armed || a.h.c.Driver().Interrupt() == nil || a.h.dev.prod-a.cons < a.thr {
		return nil
	}
	a.armed = false
	a.fired++
	if a.lose > 0 {
		a.lose--
		return nil
	}
	return a.h.c.Driver().Interrupt().Add(1)
}

// produce writes an entry from the device side and raises the interrupt if
// it is armed, as a device does.
func (h *harness) produce(e rawEntry) {
	h.arms.mu.Lock()
	defer h.arms.mu.Unlock()
	e.queue = h.queue
	h.dev.write(e, false)
	_ = h.arms.fireLocked()
}

func newHarness(t testing.TB, attr cq.Attr, entries, tableSize int) *harness {
	l := simLayout(entries)
	mem := mmap(t, 4096+entries*64)
	w := doorbell.NewWindow(mem[:4096])
	cons, err := w.Reg32(0)
	require.NoError(t, err)
	over, err := w.Reg32(16)
	require.NoError(t, err)
	h := &harness{t: t, over: over, cons: cons, queue: 3}
	h.arms = &armRecorder{h: h}
	src, err := NewRingSource(RingConfig{
		Mem: mem[4096:], Layout: l, Codes: simCodes(), Notifier: h.arms,
		Regs: RingRegs{Doorbell: doorbell.NewDoorbell(cons), Overrun: over, OverrunMask: 1},
	})
	require.NoError(t, err)
	attr.Size = entries
	c, err := cq.New(attr, cq.Limits{MaxSize: 1 << 16, DefaultFormat: cq.FormatTagged})
	require.NoError(t, err)
	require.NoError(t, c.Driver().AddSource(src))
	newTable := NewTable
	if attr.SingleThreaded {
		newTable = NewSingleThreadedTable
	}
	tab, err := newTable(tableSize, 32)
	require.NoError(t, err)
	require.NoError(t, src.BindTable(h.queue, tab))
	h.c, h.src, h.tab = c, src, tab
	h.dev = &fakeDev{mem: mem[4096:], l: l}
	t.Cleanup(func() { _ = c.Close() })
	return h
}

func (h *harness) post(ctx any, ln int, fl cq.Flags) uint32 {
	id, err := h.tab.Post(Op{Context: ctx, Len: ln, Flags: fl, Buf: 0x10000})
	require.NoError(h.t, err)
	return id
}

func (h *harness) complete(e rawEntry) {
	e.queue = h.queue
	h.dev.write(e, false)
}

func TestReadEmptyAndFormats(t *testing.T) {
	for _, f := range []cq.Format{cq.FormatContext, cq.FormatMsg, cq.FormatData, cq.FormatTagged} {
		t.Run(f.String(), func(t *testing.T) {
			h := newHarness(t, cq.Attr{Format: f}, 16, 16)
			ents := make([]cq.Entry, 4)
			addrs := make([]cq.Addr, 4)
			_, err := h.c.Read(ents)
			require.ErrorIs(t, err, cq.ErrAgain)
			id := h.post("rx", 2048, cq.FlagRecv|cq.FlagMsg)
			h.complete(rawEntry{id: id, opcode: 1, ln: 100, flags: 1<<0 | 1<<1 | 1<<4, data: 0xd, tag: 0x7a9, src: 42, bufOff: 0})
			n, err := h.c.ReadFrom(ents, addrs)
			require.NoError(t, err)
			require.Equal(t, 1, n)
			e := ents[0]
			require.Equal(t, "rx", e.Context)
			require.EqualValues(t, h.queue, e.Queue)
			require.EqualValues(t, 42, addrs[0])
			want := cq.Entry{Context: "rx", Queue: h.queue}
			if f >= cq.FormatMsg {
				want.Flags, want.Len = cq.FlagRecv|cq.FlagTagged|cq.FlagRemoteCQData, 100
			}
			if f >= cq.FormatData {
				want.Buf, want.Data = 0x10000, 0xd
			}
			if f >= cq.FormatTagged {
				want.Tag = 0x7a9
			}
			require.Equal(t, want, e, "fields outside the format stay zero")
		})
	}
}

func TestSourceRefusesBadEntries(t *testing.T) {
	type tc struct {
		name     string
		entry    func(h *harness, id uint32) rawEntry
		prov     cq.ProvErrno
		context  bool // the error carries the posted context (slot released)
		posted   int  // outstanding after the error
		errnoVal cq.Errno
	}
	cases := []tc{
		{"never posted", func(h *harness, id uint32) rawEntry { return rawEntry{id: 0x7777, opcode: 0} }, cq.ProvBadID, false, 1, cq.EIO},
		{"slot out of range", func(h *harness, id uint32) rawEntry { return rawEntry{id: 1<<31 | 15} }, cq.ProvBadID, false, 1, cq.EIO},
		{"stale generation", func(h *harness, id uint32) rawEntry { return rawEntry{id: id + 1<<4} }, cq.ProvBadID, false, 1, cq.EIO},
		{"bad queue", func(h *harness, id uint32) rawEntry { return rawEntry{id: id, queue: 9} }, cq.ProvBadQueue, false, 1, cq.EIO},
		{"length above posted", func(h *harness, id uint32) rawEntry { return rawEntry{id: id, ln: 65} }, cq.ProvBadLen, true, 0, cq.EIO},
		{"offset beyond buffer", func(h *harness, id uint32) rawEntry { return rawEntry{id: id, ln: 10, bufOff: 60} }, cq.ProvBadLen, true, 0, cq.EIO},
		{"unknown status", func(h *harness, id uint32) rawEntry { return rawEntry{id: id, status: 0xee} }, cq.ProvBadStatus, true, 0, cq.EIO},
		{"unknown opcode", func(h *harness, id uint32) rawEntry { return rawEntry{id: id, opcode: 0x99} }, cq.ProvBadOpcode, true, 0, cq.EIO},
		{"device error", func(h *harness, id uint32) rawEntry { return rawEntry{id: id, status: 3, syndrome: 0xabc} }, 3, true, 0, cq.ECANCELED},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, cq.Attr{Format: cq.FormatTagged}, 16, 16)
			id := h.post("victim", 64, cq.FlagSend|cq.FlagMsg)
			good := h.post("good", 64, cq.FlagSend|cq.FlagMsg)
			e := c.entry(h, id)
			if e.queue == 0 {
				e.queue = h.queue
			}
			h.dev.write(e, false)
			h.complete(rawEntry{id: good, ln: 64})
			ents := make([]cq.Entry, 4)
			_, err := h.c.Read(ents)
			require.ErrorIs(t, err, cq.ErrAvail)
			var ee cq.ErrEntry
			require.NoError(t, h.c.ReadErr(&ee))
			require.Equal(t, c.prov, ee.ProvErrno)
			require.Equal(t, c.errnoVal, ee.Err)
			require.True(t, errors.Is(ee.Err, c.errnoVal))
			if c.context {
				require.Equal(t, "victim", ee.Context)
			} else {
				require.Nil(t, ee.Context)
			}
			require.Len(t, ee.ErrData, 64, "the raw entry is the error data")
			require.NotEmpty(t, h.c.StrError(ee.ProvErrno, ee.ErrData))
			n, err := h.c.Read(ents)
			require.NoError(t, err)
			require.Equal(t, 1, n)
			require.Equal(t, "good", ents[0].Context, "the good completion after a bad one is delivered")
			require.Equal(t, c.posted, h.tab.Outstanding())
		})
	}
}

func TestNoDoubleCompletion(t *testing.T) {
	h := newHarness(t, cq.Attr{Format: cq.FormatMsg}, 16, 1)
	id := h.post("once", 64, cq.FlagSend|cq.FlagMsg)
	h.complete(rawEntry{id: id, ln: 1})
	h.complete(rawEntry{id: id, ln: 1}) // the device repeats it
	ents := make([]cq.Entry, 4)
	n, err := h.c.Read(ents)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	_, err = h.c.Read(ents)
	require.ErrorIs(t, err, cq.ErrAvail)
	var ee cq.ErrEntry
	require.NoError(t, h.c.ReadErr(&ee))
	require.Equal(t, cq.ProvBadID, ee.ProvErrno)
	// The slot is reused with a new generation: the old id stays refused.
	id2 := h.post("twice", 64, cq.FlagSend|cq.FlagMsg)
	require.NotEqual(t, id, id2)
}

func TestMixedSuccessAndError(t *testing.T) {
	h := newHarness(t, cq.Attr{Format: cq.FormatMsg}, 16, 16)
	ids := []uint32{h.post(1, 8, cq.FlagSend|cq.FlagMsg), h.post(2, 8, cq.FlagSend|cq.FlagMsg), h.post(3, 8, cq.FlagSend|cq.FlagMsg), h.post(4, 8, cq.FlagSend|cq.FlagMsg)}
	h.complete(rawEntry{id: ids[0], ln: 8})
	h.complete(rawEntry{id: ids[1], ln: 8})
	h.complete(rawEntry{id: ids[2], ln: 8, status: 5})
	h.complete(rawEntry{id: ids[3], ln: 8})
	ents := make([]cq.Entry, 3)
	n, err := h.c.Read(ents)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	_, err = h.c.Read(ents)
	require.ErrorIs(t, err, cq.ErrAvail)
	_, err = h.c.Read(nil)
	require.ErrorIs(t, err, cq.ErrAvail, "a zero-count read reports the error too")
	var ee cq.ErrEntry
	require.NoError(t, h.c.ReadErr(&ee))
	require.Equal(t, 3, ee.Context)
	require.Equal(t, cq.EIO, ee.Err)
	require.ErrorIs(t, h.c.ReadErr(&ee), cq.ErrAgain, "one error only")
	n, err = h.c.Read(ents)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, 4, ents[0].Context)
}

func TestReadErrData(t *testing.T) {
	h := newHarness(t, cq.Attr{}, 16, 16)
	require.ErrorIs(t, h.c.ReadErr(&cq.ErrEntry{}), cq.ErrAgain)
	for i := 0; i < 2; i++ {
		id := h.post(i, 8, cq.FlagRecv|cq.FlagMsg)
		h.complete(rawEntry{id: id, opcode: 1, ln: 20, status: 1, syndrome: 0x1234})
	}
	short := make([]byte, 5)
	ee := cq.ErrEntry{ErrData: short}
	require.NoError(t, h.c.ReadErr(&ee))
	require.Len(t, ee.ErrData, 5, "copied up to the caller's capacity")
	require.Equal(t, &short[0], &ee.ErrData[0], "into the caller's buffer")
	require.Equal(t, cq.ETRUNC, ee.Err)
	require.Equal(t, 12, ee.OLen, "olen = reported - posted")
	require.Equal(t, 8, ee.Len)
	require.Equal(t, cq.ProvErrno(1), ee.ProvErrno)

	var held cq.ErrEntry
	require.NoError(t, h.c.ReadErr(&held))
	require.Len(t, held.ErrData, 64)
	require.Equal(t, h.dev.mem[:5], short, "the short copy is a prefix of the raw entry")
	require.Equal(t, h.dev.mem[64:128], held.ErrData, "the CQ-held data is the raw entry")
	msg := h.c.StrError(held.ProvErrno, held.ErrData)
	require.Contains(t, msg, "LOCAL_LEN_ERR")
	require.Contains(t, msg, "0x1234")
	allocs := testing.AllocsPerRun(50, func() { _ = h.c.ReadErr(&held) })
	require.Zero(t, allocs)
}

func TestOverrunDrainsThenFatal(t *testing.T) {
	h := newHarness(t, cq.Attr{Format: cq.FormatMsg, WaitObj: cq.WaitFD}, 4, 8)
	for i := 0; i < 4; i++ {
		h.complete(rawEntry{id: h.post(i, 8, cq.FlagSend|cq.FlagMsg)})
	}
	h.over.Write(1) // the device had a fifth completion and no room
	ents := make([]cq.Entry, 3)
	n, err := h.c.Read(ents)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	n, err = h.c.Read(ents)
	require.NoError(t, err)
	require.Equal(t, 1, n, "valid entries drain first")
	for i := 0; i < 3; i++ {
		_, err = h.c.Read(ents)
		require.ErrorIs(t, err, cq.ErrOverrun)
	}
	require.ErrorIs(t, h.c.ReadErr(&cq.ErrEntry{}), cq.ErrOverrun)
	_, err = h.c.SRead(context.Background(), ents, 0, time.Second)
	require.ErrorIs(t, err, cq.ErrOverrun)
}

func TestMultiRecvSlotStaysPosted(t *testing.T) {
	h := newHarness(t, cq.Attr{Format: cq.FormatData}, 16, 4)
	id := h.post("mr", 4096, cq.FlagRecv|cq.FlagMsg|cq.FlagMultiRecv)
	h.complete(rawEntry{id: id, opcode: 1, ln: 1000, bufOff: 0})
	h.complete(rawEntry{id: id, opcode: 1, ln: 1000, bufOff: 1024})
	h.complete(rawEntry{id: id, opcode: 1, ln: 2000, bufOff: 2048, flags: 1 << 2})
	h.complete(rawEntry{id: id, opcode: 1, ln: 10}) // after release: refused
	ents := make([]cq.Entry, 8)
	n, err := h.c.Read(ents)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	require.Equal(t, uintptr(0x10000+1024), ents[1].Buf)
	require.Zero(t, ents[0].Flags&cq.FlagMultiRecv)
	require.Equal(t, cq.FlagRecv|cq.FlagMsg|cq.FlagMultiRecv, ents[2].Flags, "the last one releases the buffer")
	_, err = h.c.Read(ents)
	require.ErrorIs(t, err, cq.ErrAvail)
	require.Zero(t, h.tab.Outstanding())
}

func TestWrongPhaseBecomesErrorCompletion(t *testing.T) {
	h := newHarness(t, cq.Attr{Format: cq.FormatMsg, WaitObj: cq.WaitFD}, 8, 8)
	a, b := h.post("a", 8, cq.FlagSend|cq.FlagMsg), h.post("b", 8, cq.FlagSend|cq.FlagMsg)
	h.complete(rawEntry{id: a})
	h.dev.write(rawEntry{id: 0xdead, queue: h.queue}, true)
	ents := make([]cq.Entry, 4)
	n, err := h.c.Read(ents)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	_, err = h.c.Read(ents)
	require.ErrorIs(t, err, cq.ErrAgain, "not misread, waiting for what follows")
	h.complete(rawEntry{id: b})
	_, err = h.c.Read(ents)
	require.ErrorIs(t, err, cq.ErrAvail)
	var ee cq.ErrEntry
	require.NoError(t, h.c.ReadErr(&ee))
	require.Equal(t, cq.ProvBadPhase, ee.ProvErrno)
	require.Nil(t, ee.Context)
	n, err = h.c.Read(ents)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, "b", ents[0].Context)
}

// A refused entry is decided and released from one copy: a device that
// rewrites its id while the reader stages it cannot make the reader free
// an id other than the one it looked up (which would leak one slot for
// good and hand an outstanding one out again).
func TestRefusedEntryReadOnce(t *testing.T) {
	for _, f := range []cq.Format{cq.FormatContext, cq.FormatTagged} {
		t.Run(f.String(), func(t *testing.T) {
			h := newHarness(t, cq.Attr{Format: f}, 16, 4)
			a, b := h.post("a", 8, cq.FlagSend|cq.FlagMsg), h.post("b", 8, cq.FlagSend|cq.FlagMsg)
			h.complete(rawEntry{id: a, status: 5}) // GENERAL_ERR
			decodeHook = func(uint32) {
				setField(h.dev.mem, h.dev.l.Fields.ID, uint64(b)) // the device rewrites the id
			}
			defer func() { decodeHook = nil }()
			_, err := h.c.Read(make([]cq.Entry, 4))
			require.ErrorIs(t, err, cq.ErrAvail)
			var ee cq.ErrEntry
			require.NoError(t, h.c.ReadErr(&ee))
			require.Equal(t, "a", ee.Context, "decided from the copy taken")
			require.Equal(t, cq.EIO, ee.Err)
			require.Equal(t, a, readID(ee.ErrData), "the error data is that copy")
			require.Equal(t, 1, h.tab.Outstanding(), "a released, b still outstanding")
			// b completes normally; every slot can be posted again, once.
			h.complete(rawEntry{id: b})
			n, err := h.c.Read(make([]cq.Entry, 4))
			require.NoError(t, err)
			require.Equal(t, 1, n)
			require.Zero(t, h.tab.Outstanding())
			seen := map[uint32]bool{}
			for i := 0; i < 4; i++ {
				id := h.post(i, 8, cq.FlagSend|cq.FlagMsg)
				require.False(t, seen[id&3], "slot %d handed out twice", id&3)
				seen[id&3] = true
			}
			_, err = h.tab.Post(Op{})
			require.ErrorIs(t, err, ErrFull)
		})
	}
}

func readID(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

// A Read of zero entries reports the state a Read would: ErrAvail for an
// error entry at the head, ErrOverrun on an overrun CQ (for good), nil for
// waiting successes; ReadErr reports an overrun no Read has noticed yet.
func TestZeroReadAndReadErrReportState(t *testing.T) {
	h := newHarness(t, cq.Attr{Format: cq.FormatMsg}, 4, 8)
	_, err := h.c.Read(nil)
	require.ErrorIs(t, err, cq.ErrAgain)
	h.complete(rawEntry{id: h.post("ok", 8, cq.FlagSend|cq.FlagMsg)})
	_, err = h.c.Read(nil)
	require.NoError(t, err, "a success waits")
	n, err := h.c.Read(make([]cq.Entry, 4))
	require.NoError(t, err)
	require.Equal(t, 1, n)
	h.complete(rawEntry{id: h.post("bad", 8, cq.FlagSend|cq.FlagMsg), status: 5})
	for i := 0; i < 2; i++ {
		_, err = h.c.Read(nil)
		require.ErrorIs(t, err, cq.ErrAvail)
	}
	var ee cq.ErrEntry
	require.NoError(t, h.c.ReadErr(&ee))
	require.Equal(t, "bad", ee.Context)
	_, err = h.c.Read(nil)
	require.ErrorIs(t, err, cq.ErrAgain)

	h.over.Write(1)
	require.ErrorIs(t, h.c.ReadErr(&ee), cq.ErrOverrun, "before any Read noticed")
	for i := 0; i < 2; i++ {
		_, err = h.c.Read(nil)
		require.ErrorIs(t, err, cq.ErrOverrun)
	}
	_, err = h.c.Read(make([]cq.Entry, 4))
	require.ErrorIs(t, err, cq.ErrOverrun)
}

func TestAddSourceNil(t *testing.T) {
	c, err := cq.New(cq.Attr{}, cq.Limits{})
	require.NoError(t, err)
	defer c.Close()
	err = c.Driver().AddSource(nil)
	require.ErrorIs(t, err, cq.ErrInvalid)
	// The message names what is missing, not the CQ's fields.
	require.Equal(t, cq.ErrInvalid.Error()+": AddSource: nil source", err.Error())
	_, err = c.Read(make([]cq.Entry, 1))
	require.ErrorIs(t, err, cq.ErrAgain, "the CQ is unchanged")
	err = (*cq.CQ)(nil).Driver().AddSource(&RingSource{})
	require.ErrorIs(t, err, cq.ErrInvalid)
	require.Equal(t, cq.ErrInvalid.Error()+": AddSource: nil CQ", err.Error())
}

// TestOpcodeMatchesPosted: an entry whose opcode reports another kind of
// operation than the one posted under its id (a receive for a posted
// send) is an error completion, ProvBadOp, carrying the operation's
// context and releasing its slot, on the fast path and on the generic
// loop alike; the entries after it are read as usual. An operation posted
// with no kind (a driver that tells them apart by queue) takes any
// defined opcode.
func TestOpcodeMatchesPosted(t *testing.T) {
	const send, recv, write, read, recvImm = 0, 1, 2, 3, 4 // simCodes
	for _, tc := range []struct {
		posted cq.Flags
		ok     []uint32 // the opcodes accepted; the others are refused
	}{
		{cq.FlagSend | cq.FlagMsg, []uint32{send}},
		{cq.FlagSend | cq.FlagTagged, []uint32{send}},
		{cq.FlagRecv | cq.FlagMsg, []uint32{recv, recvImm}},
		{cq.FlagRecv | cq.FlagTagged, []uint32{recv, recvImm}},
		{cq.FlagRMA | cq.FlagWrite, []uint32{write}},
		{cq.FlagRMA | cq.FlagRead, []uint32{read}},
		{0, []uint32{send, recv, write, read, recvImm}},
	} {
		for _, generic := range []bool{false, true} {
			for _, opcode := range []uint32{send, recv, write, read, recvImm} {
				name := fmt.Sprintf("%v/opcode=%d/generic=%v", tc.posted, opcode, generic)
				h := newHarness(t, cq.Attr{Format: cq.FormatTagged}, 16, 16)
				require.NotNil(t, h.src.fast)
				if generic {
					h.src.fast = nil
				}
				h.complete(rawEntry{id: h.post("victim", 64, tc.posted), opcode: opcode, ln: 10})
				h.complete(rawEntry{id: h.post("next", 64, cq.FlagRecv|cq.FlagMsg), opcode: recv, ln: 20})
				ents := make([]cq.Entry, 4)
				n, err := h.c.Read(ents)
				if slices.Contains(tc.ok, opcode) {
					require.NoError(t, err, name)
					require.Equal(t, 2, n, name)
					require.Equal(t, "victim", ents[0].Context, name)
					require.Equal(t, "next", ents[1].Context, name)
				} else {
					require.ErrorIs(t, err, cq.ErrAvail, name)
					var ee cq.ErrEntry
					require.NoError(t, h.c.ReadErr(&ee), name)
					require.Equal(t, cq.ProvBadOp, ee.ProvErrno, name)
					require.Equal(t, cq.EIO, ee.Err, name)
					require.Equal(t, "victim", ee.Context, name)
					require.Equal(t, tc.posted, ee.Flags, "%s: the posted operation's flags, none of the opcode's", name)
					require.Contains(t, h.c.StrError(ee.ProvErrno, ee.ErrData), "another kind of operation", name)
					n, err = h.c.Read(ents)
					require.NoError(t, err, name)
					require.Equal(t, 1, n, name)
					require.Equal(t, "next", ents[0].Context, name)
				}
				require.Zero(t, h.tab.Outstanding(), "%s: every slot released", name)
			}
		}
	}
}
