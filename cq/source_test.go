package cq

import (
	"context"
	"errors"
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
	c     *CQ
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
	mu     sync.Mutex
	n      int
	h      *harness
	fired  int
	armed  bool
	cons   uint32
	thr    uint32
	lose   int // interrupts to drop
	loseMu sync.Mutex
}

func (a *armRecorder) Arm(consumed uint32, _ bool, threshold int) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.n++
	a.armed, a.cons, a.thr = true, consumed, uint32(max(threshold, 1))
	return a.fireLocked()
}

func (a *armRecorder) fireLocked() error {
	if !a.armed || a.h.c.Interrupt() == nil || a.h.dev.prod-a.cons < a.thr {
		return nil
	}
	a.armed = false
	a.fired++
	if a.lose > 0 {
		a.lose--
		return nil
	}
	return a.h.c.Interrupt().Add(1)
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

func newHarness(t testing.TB, attr Attr, entries, tableSize int) *harness {
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
	c, err := New(attr, Limits{MaxSize: 1 << 16, DefaultFormat: FormatTagged})
	require.NoError(t, err)
	require.NoError(t, c.AddSource(src))
	tab, err := NewTable(tableSize, 32)
	require.NoError(t, err)
	require.NoError(t, src.BindTable(h.queue, tab))
	h.c, h.src, h.tab = c, src, tab
	h.dev = &fakeDev{mem: mem[4096:], l: l}
	t.Cleanup(func() { _ = c.Close() })
	return h
}

func (h *harness) post(ctx any, ln int, fl Flags) uint32 {
	id, err := h.tab.Post(Op{Context: ctx, Len: ln, Flags: fl, Buf: 0x10000})
	require.NoError(h.t, err)
	return id
}

func (h *harness) complete(e rawEntry) {
	e.queue = h.queue
	h.dev.write(e, false)
}

func TestReadEmptyAndFormats(t *testing.T) {
	for _, f := range []Format{FormatContext, FormatMsg, FormatData, FormatTagged} {
		t.Run(f.String(), func(t *testing.T) {
			h := newHarness(t, Attr{Format: f}, 16, 16)
			ents := make([]Entry, 4)
			addrs := make([]Addr, 4)
			_, err := h.c.Read(ents)
			require.ErrorIs(t, err, ErrAgain)
			id := h.post("rx", 2048, FlagRecv|FlagMsg)
			h.complete(rawEntry{id: id, opcode: 1, ln: 100, flags: 1<<0 | 1<<1 | 1<<4, data: 0xd, tag: 0x7a9, src: 42, bufOff: 0})
			n, err := h.c.ReadFrom(ents, addrs)
			require.NoError(t, err)
			require.Equal(t, 1, n)
			e := ents[0]
			require.Equal(t, "rx", e.Context)
			require.EqualValues(t, h.queue, e.Queue)
			require.EqualValues(t, 42, addrs[0])
			want := Entry{Context: "rx", Queue: h.queue}
			if f >= FormatMsg {
				want.Flags, want.Len = FlagRecv|FlagTagged|FlagRemoteCQData, 100
			}
			if f >= FormatData {
				want.Buf, want.Data = 0x10000, 0xd
			}
			if f >= FormatTagged {
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
		prov     int
		context  bool // the error carries the posted context (slot released)
		posted   int  // outstanding after the error
		errnoVal Errno
	}
	cases := []tc{
		{"never posted", func(h *harness, id uint32) rawEntry { return rawEntry{id: 0x7777, opcode: 0} }, ProvBadID, false, 1, EIO},
		{"slot out of range", func(h *harness, id uint32) rawEntry { return rawEntry{id: 1<<31 | 15} }, ProvBadID, false, 1, EIO},
		{"stale generation", func(h *harness, id uint32) rawEntry { return rawEntry{id: id + 1<<4} }, ProvBadID, false, 1, EIO},
		{"bad queue", func(h *harness, id uint32) rawEntry { return rawEntry{id: id, queue: 9} }, ProvBadQueue, false, 1, EIO},
		{"length above posted", func(h *harness, id uint32) rawEntry { return rawEntry{id: id, ln: 65} }, ProvBadLen, true, 0, EIO},
		{"offset beyond buffer", func(h *harness, id uint32) rawEntry { return rawEntry{id: id, ln: 10, bufOff: 60} }, ProvBadLen, true, 0, EIO},
		{"unknown status", func(h *harness, id uint32) rawEntry { return rawEntry{id: id, status: 0xee} }, ProvBadStatus, true, 0, EIO},
		{"unknown opcode", func(h *harness, id uint32) rawEntry { return rawEntry{id: id, opcode: 0x99} }, ProvBadOpcode, true, 0, EIO},
		{"device error", func(h *harness, id uint32) rawEntry { return rawEntry{id: id, status: 3, syndrome: 0xabc} }, 3, true, 0, ECANCELED},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, Attr{Format: FormatTagged}, 16, 16)
			id := h.post("victim", 64, FlagSend|FlagMsg)
			good := h.post("good", 64, FlagSend|FlagMsg)
			e := c.entry(h, id)
			if e.queue == 0 {
				e.queue = h.queue
			}
			h.dev.write(e, false)
			h.complete(rawEntry{id: good, ln: 64})
			ents := make([]Entry, 4)
			_, err := h.c.Read(ents)
			require.ErrorIs(t, err, ErrAvail)
			var ee ErrEntry
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
	h := newHarness(t, Attr{Format: FormatMsg}, 16, 1)
	id := h.post("once", 64, FlagSend|FlagMsg)
	h.complete(rawEntry{id: id, ln: 1})
	h.complete(rawEntry{id: id, ln: 1}) // the device repeats it
	ents := make([]Entry, 4)
	n, err := h.c.Read(ents)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	_, err = h.c.Read(ents)
	require.ErrorIs(t, err, ErrAvail)
	var ee ErrEntry
	require.NoError(t, h.c.ReadErr(&ee))
	require.Equal(t, ProvBadID, ee.ProvErrno)
	// The slot is reused with a new generation: the old id stays refused.
	id2 := h.post("twice", 64, FlagSend|FlagMsg)
	require.NotEqual(t, id, id2)
}

func TestMixedSuccessAndError(t *testing.T) {
	h := newHarness(t, Attr{Format: FormatMsg}, 16, 16)
	ids := []uint32{h.post(1, 8, FlagSend|FlagMsg), h.post(2, 8, FlagSend|FlagMsg), h.post(3, 8, FlagSend|FlagMsg), h.post(4, 8, FlagSend|FlagMsg)}
	h.complete(rawEntry{id: ids[0], ln: 8})
	h.complete(rawEntry{id: ids[1], ln: 8})
	h.complete(rawEntry{id: ids[2], ln: 8, status: 5})
	h.complete(rawEntry{id: ids[3], ln: 8})
	ents := make([]Entry, 3)
	n, err := h.c.Read(ents)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	_, err = h.c.Read(ents)
	require.ErrorIs(t, err, ErrAvail)
	_, err = h.c.Read(nil)
	require.ErrorIs(t, err, ErrAvail, "a zero-count read reports the error too")
	var ee ErrEntry
	require.NoError(t, h.c.ReadErr(&ee))
	require.Equal(t, 3, ee.Context)
	require.Equal(t, EIO, ee.Err)
	require.ErrorIs(t, h.c.ReadErr(&ee), ErrAgain, "one error only")
	n, err = h.c.Read(ents)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, 4, ents[0].Context)
}

func TestReadErrData(t *testing.T) {
	h := newHarness(t, Attr{}, 16, 16)
	require.ErrorIs(t, h.c.ReadErr(&ErrEntry{}), ErrAgain)
	for i := 0; i < 2; i++ {
		id := h.post(i, 8, FlagRecv|FlagMsg)
		h.complete(rawEntry{id: id, opcode: 1, ln: 20, status: 1, syndrome: 0x1234})
	}
	short := make([]byte, 5)
	ee := ErrEntry{ErrData: short}
	require.NoError(t, h.c.ReadErr(&ee))
	require.Len(t, ee.ErrData, 5, "copied up to the caller's capacity")
	require.Equal(t, &short[0], &ee.ErrData[0], "into the caller's buffer")
	require.Equal(t, ETRUNC, ee.Err)
	require.Equal(t, 12, ee.OLen, "olen = reported - posted")
	require.Equal(t, 8, ee.Len)
	require.Equal(t, 1, ee.ProvErrno)

	var held ErrEntry
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
	h := newHarness(t, Attr{Format: FormatMsg, WaitObj: WaitFD}, 4, 8)
	for i := 0; i < 4; i++ {
		h.complete(rawEntry{id: h.post(i, 8, FlagSend|FlagMsg)})
	}
	h.over.Write(1) // the device had a fifth completion and no room
	ents := make([]Entry, 3)
	n, err := h.c.Read(ents)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	n, err = h.c.Read(ents)
	require.NoError(t, err)
	require.Equal(t, 1, n, "valid entries drain first")
	for i := 0; i < 3; i++ {
		_, err = h.c.Read(ents)
		require.ErrorIs(t, err, ErrOverrun)
	}
	require.ErrorIs(t, h.c.ReadErr(&ErrEntry{}), ErrOverrun)
	_, err = h.c.SRead(context.Background(), ents, 0, time.Second)
	require.ErrorIs(t, err, ErrOverrun)
}

func TestMultiRecvSlotStaysPosted(t *testing.T) {
	h := newHarness(t, Attr{Format: FormatData}, 16, 4)
	id := h.post("mr", 4096, FlagRecv|FlagMsg|FlagMultiRecv)
	h.complete(rawEntry{id: id, opcode: 1, ln: 1000, bufOff: 0})
	h.complete(rawEntry{id: id, opcode: 1, ln: 1000, bufOff: 1024})
	h.complete(rawEntry{id: id, opcode: 1, ln: 2000, bufOff: 2048, flags: 1 << 2})
	h.complete(rawEntry{id: id, opcode: 1, ln: 10}) // after release: refused
	ents := make([]Entry, 8)
	n, err := h.c.Read(ents)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	require.Equal(t, uintptr(0x10000+1024), ents[1].Buf)
	require.Zero(t, ents[0].Flags&FlagMultiRecv)
	require.Equal(t, FlagRecv|FlagMsg|FlagMultiRecv, ents[2].Flags, "the last one releases the buffer")
	_, err = h.c.Read(ents)
	require.ErrorIs(t, err, ErrAvail)
	require.Zero(t, h.tab.Outstanding())
}

func TestWrongPhaseBecomesErrorCompletion(t *testing.T) {
	h := newHarness(t, Attr{Format: FormatMsg, WaitObj: WaitFD}, 8, 8)
	a, b := h.post("a", 8, FlagSend|FlagMsg), h.post("b", 8, FlagSend|FlagMsg)
	h.complete(rawEntry{id: a})
	h.dev.write(rawEntry{id: 0xdead, queue: h.queue}, true)
	ents := make([]Entry, 4)
	n, err := h.c.Read(ents)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	_, err = h.c.Read(ents)
	require.ErrorIs(t, err, ErrAgain, "not misread, waiting for what follows")
	h.complete(rawEntry{id: b})
	_, err = h.c.Read(ents)
	require.ErrorIs(t, err, ErrAvail)
	var ee ErrEntry
	require.NoError(t, h.c.ReadErr(&ee))
	require.Equal(t, ProvBadPhase, ee.ProvErrno)
	require.Nil(t, ee.Context)
	n, err = h.c.Read(ents)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, "b", ents[0].Context)
}

func TestAttrResolve(t *testing.T) {
	lim := Limits{DefaultSize: 512, MaxSize: 65536, PowerOfTwo: true, DefaultFormat: FormatData, Vectors: 2}
	a, err := lim.Resolve(Attr{})
	require.NoError(t, err)
	require.Equal(t, 512, a.Size)
	require.Equal(t, FormatData, a.Format)
	a, err = lim.Resolve(Attr{Size: 1000})
	require.NoError(t, err)
	require.Equal(t, 1024, a.Size)
	for _, bad := range []Attr{{Size: -1}, {Size: 65537}, {Format: 9}, {WaitObj: 17}, {WaitCond: 3},
		{Flags: 1}, {Flags: AttrAffinity, SignalingVector: 2}, {Flags: AttrAffinity, SignalingVector: -1}} {
		_, err := lim.Resolve(bad)
		require.ErrorIs(t, err, ErrInvalid, "%+v", bad)
	}
	_, err = lim.Resolve(Attr{WaitObj: WaitSet})
	require.ErrorIs(t, err, ErrNotSupported)
	a, err = lim.Resolve(Attr{Flags: AttrAffinity, SignalingVector: 1})
	require.NoError(t, err)
	require.Equal(t, 1, a.SignalingVector)
}

func TestErrno(t *testing.T) {
	require.ErrorIs(t, ETRUNC, ETRUNC)
	require.ErrorIs(t, EAGAIN, ErrAgain)
	require.Equal(t, "truncation error", ETRUNC.Error())
	require.Equal(t, EOVERRUN, ErrnoOf(ErrOverrun))
	require.Equal(t, EAGAIN, ErrnoOf(ErrTimeout))
	require.Equal(t, ENOSYS, ErrnoOf(ErrNoWait))
	require.ErrorIs(t, ErrTimeout, ErrAgain)
	require.ErrorIs(t, ErrSignaled, ErrAgain)
	require.NotErrorIs(t, ErrTimeout, ErrSignaled)
	require.Equal(t, "RECV|SEND", (FlagSend | FlagRecv).String())
}

// TestResolveEverySize resolves every size from 1 to 65536: the actual size
// is at least the request, a power of two when the device needs one, and
// the smallest such; one past the maximum is refused.
func TestResolveEverySize(t *testing.T) {
	for _, pow2 := range []bool{false, true} {
		lim := Limits{MaxSize: 65536, PowerOfTwo: pow2}
		for n := 1; n <= 65536; n++ {
			a, err := lim.Resolve(Attr{Size: n})
			if err != nil {
				t.Fatalf("size %d: %v", n, err)
			}
			want := n
			if pow2 {
				want = 1
				for want < n {
					want <<= 1
				}
			}
			if a.Size != want {
				t.Fatalf("size %d (power of two %v): got %d, want %d", n, pow2, a.Size, want)
			}
		}
		if _, err := lim.Resolve(Attr{Size: 65537}); !errors.Is(err, ErrInvalid) {
			t.Fatalf("size 65537: %v", err)
		}
	}
}

// A refused entry is decided and released from one copy: a device that
// rewrites its id while the reader stages it cannot make the reader free
// an id other than the one it looked up (which would leak one slot for
// good and hand an outstanding one out again).
func TestRefusedEntryReadOnce(t *testing.T) {
	for _, f := range []Format{FormatContext, FormatTagged} {
		t.Run(f.String(), func(t *testing.T) {
			h := newHarness(t, Attr{Format: f}, 16, 4)
			a, b := h.post("a", 8, FlagSend|FlagMsg), h.post("b", 8, FlagSend|FlagMsg)
			h.complete(rawEntry{id: a, status: 5}) // GENERAL_ERR
			stageHook = func() {
				setField(h.dev.mem, h.dev.l.Fields.ID, uint64(b)) // the device rewrites the id
			}
			defer func() { stageHook = nil }()
			_, err := h.c.Read(make([]Entry, 4))
			require.ErrorIs(t, err, ErrAvail)
			var ee ErrEntry
			require.NoError(t, h.c.ReadErr(&ee))
			require.Equal(t, "a", ee.Context, "decided from the copy taken")
			require.Equal(t, EIO, ee.Err)
			require.Equal(t, a, readID(ee.ErrData), "the error data is that copy")
			require.Equal(t, 1, h.tab.Outstanding(), "a released, b still outstanding")
			// b completes normally; every slot can be posted again, once.
			h.complete(rawEntry{id: b})
			n, err := h.c.Read(make([]Entry, 4))
			require.NoError(t, err)
			require.Equal(t, 1, n)
			require.Zero(t, h.tab.Outstanding())
			seen := map[uint32]bool{}
			for i := 0; i < 4; i++ {
				id := h.post(i, 8, FlagSend|FlagMsg)
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
	h := newHarness(t, Attr{Format: FormatMsg}, 4, 8)
	_, err := h.c.Read(nil)
	require.ErrorIs(t, err, ErrAgain)
	h.complete(rawEntry{id: h.post("ok", 8, FlagSend|FlagMsg)})
	_, err = h.c.Read(nil)
	require.NoError(t, err, "a success waits")
	n, err := h.c.Read(make([]Entry, 4))
	require.NoError(t, err)
	require.Equal(t, 1, n)
	h.complete(rawEntry{id: h.post("bad", 8, FlagSend|FlagMsg), status: 5})
	for i := 0; i < 2; i++ {
		_, err = h.c.Read(nil)
		require.ErrorIs(t, err, ErrAvail)
	}
	var ee ErrEntry
	require.NoError(t, h.c.ReadErr(&ee))
	require.Equal(t, "bad", ee.Context)
	_, err = h.c.Read(nil)
	require.ErrorIs(t, err, ErrAgain)

	h.over.Write(1)
	require.ErrorIs(t, h.c.ReadErr(&ee), ErrOverrun, "before any Read noticed")
	for i := 0; i < 2; i++ {
		_, err = h.c.Read(nil)
		require.ErrorIs(t, err, ErrOverrun)
	}
	_, err = h.c.Read(make([]Entry, 4))
	require.ErrorIs(t, err, ErrOverrun)
}

func TestAddSourceNil(t *testing.T) {
	c, err := New(Attr{}, Limits{})
	require.NoError(t, err)
	defer c.Close()
	require.ErrorIs(t, c.AddSource(nil), ErrInvalid)
	_, err = c.Read(make([]Entry, 1))
	require.ErrorIs(t, err, ErrAgain, "the CQ is unchanged")
}
