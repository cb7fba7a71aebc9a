package verbs_test

import (
	"context"
	"errors"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/cq/qpsim"
	"github.com/vfnic/vfnic/tests/leakcheck"
	"github.com/vfnic/vfnic/verbs"
)

// rdma-core test_cq.py: sizes 1, max/2 and max; max+1 and a completion
// vector out of range are EINVAL.
func TestCreateCQSizes(t *testing.T) {
	e := newEnv(t)
	da := verbs.QueryDevice(e.p)
	require.Positive(t, da.MaxCQE)
	require.Positive(t, da.NumCompVectors)
	for _, n := range []int{1, da.MaxCQE / 2, da.MaxCQE} {
		c := e.cq(verbs.CQInitAttr{CQE: n, CompVector: da.NumCompVectors - 1})
		require.GreaterOrEqual(t, c.CQE(), n)
		require.NoError(t, c.Close())
	}
	for _, a := range []verbs.CQInitAttr{
		{CQE: da.MaxCQE + 1},
		{CQE: 0},
		{CQE: -1},
		{CQE: 8, CompVector: da.NumCompVectors},
		{CQE: 8, CompVector: -1},
		{CQE: 8, Fields: 1 << 40},
		{CQE: 8, Flags: 1 << 7},
	} {
		_, err := verbs.CreateCQ(e.p, a)
		require.ErrorIs(t, err, os.ErrInvalid, "%+v", a)
		require.ErrorIs(t, err, cq.ErrInvalid)
	}
	_, err := verbs.CreateCQ(nil, verbs.CQInitAttr{CQE: 1})
	require.ErrorIs(t, err, os.ErrInvalid)
}

// A field or flag the device cannot honour fails at creation with "not
// supported"; the device's query says which.
func TestCreateCQUnsupported(t *testing.T) {
	e := newEnv(t)
	da := verbs.QueryDevice(e.p)
	for _, f := range []verbs.Fields{verbs.FieldCompletionTimestamp, verbs.FieldCompletionWallclock,
		verbs.FieldCVLAN, verbs.FieldFlowTag, verbs.FieldCsumOK, verbs.FieldSL, verbs.FieldSLID} {
		require.Zero(t, da.Fields&f, "%v", f)
		_, err := verbs.CreateCQ(e.p, verbs.CQInitAttr{CQE: 4, Fields: verbs.FieldByteLen | f})
		require.ErrorIs(t, err, errors.ErrUnsupported, "%v", f)
		require.Contains(t, err.Error(), f.String())
	}
	_, err := verbs.CreateCQ(e.p, verbs.CQInitAttr{CQE: 4, Flags: verbs.IgnoreOverrun})
	require.ErrorIs(t, err, errors.ErrUnsupported)
	c := e.cq(verbs.CQInitAttr{CQE: 4, Fields: da.Fields, Flags: verbs.SingleThreaded, Context: "mine"})
	require.Equal(t, "mine", c.Context())
	require.NoError(t, c.Close())
}

// allFieldsProvider is the software device's provider claiming every
// completion field and flag, as a device whose entries carried them would.
type allFieldsProvider struct{ verbs.Provider }

func (p allFieldsProvider) QueryDevice() verbs.DeviceAttr {
	a := p.Provider.QueryDevice()
	a.Fields = ^verbs.Fields(0)
	a.Flags = ^verbs.CreateFlags(0)
	return a
}

// A field the verbs layer cannot deliver (no accessor, or one that always
// returns 0) is refused whatever the provider claims, and QueryDevice
// reports only what both can do.
func TestCreateCQFieldsTheLayerLacks(t *testing.T) {
	e := newEnv(t)
	p := allFieldsProvider{e.p}
	da := verbs.QueryDevice(p)
	require.Equal(t, verbs.FieldByteLen|verbs.FieldImm|verbs.FieldQPNum|verbs.FieldSrcQP, da.Fields)
	require.Equal(t, verbs.SingleThreaded|verbs.IgnoreOverrun, da.Flags)
	for _, f := range []verbs.Fields{verbs.FieldCompletionTimestamp, verbs.FieldCompletionWallclock,
		verbs.FieldCVLAN, verbs.FieldFlowTag, verbs.FieldSLID, verbs.FieldSL, verbs.FieldDLIDPathBits,
		verbs.FieldCsumOK} {
		_, err := verbs.CreateCQ(p, verbs.CQInitAttr{CQE: 4, Fields: verbs.FieldByteLen | f})
		require.ErrorIs(t, err, errors.ErrUnsupported, "%v", f)
		require.Contains(t, err.Error(), f.String())
	}
	c, err := verbs.CreateCQ(p, verbs.CQInitAttr{CQE: 4, Fields: da.Fields})
	require.NoError(t, err)
	require.NoError(t, c.Close())
}

// The fi_cq CQ underneath has the narrowest format that holds the fields
// asked for: FormatData only for the immediate data. Without FieldImm the
// other fields are still right.
func TestFormatFollowsFields(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		fields verbs.Fields
		want   cq.Format
	}{
		{0, cq.FormatMsg},
		{verbs.FieldByteLen | verbs.FieldQPNum | verbs.FieldSrcQP, cq.FormatMsg},
		{verbs.FieldImm, cq.FormatData},
		{verbs.FieldByteLen | verbs.FieldImm, cq.FormatData},
	} {
		c := e.cq(verbs.CQInitAttr{CQE: 8, Fields: tc.fields})
		require.Equal(t, tc.want, c.FI().Attr().Format, "fields %v", tc.fields)
		require.NoError(t, c.Close())
	}
	c := e.cq(verbs.CQInitAttr{CQE: 8, Fields: verbs.FieldByteLen | verbs.FieldQPNum})
	a, b := e.qp(c, false), e.qp(c, false)
	defer func() { _ = a.Close(); _ = b.Close(); _ = c.Close() }()
	e.recv(b, 1000)
	e.send(a, b, 7, 100, qpsim.SendOpts{Data: 0xabcd, HasData: true})
	require.NoError(t, c.StartPoll())
	require.Equal(t, []any{uint64(1000), verbs.WCRecv, verbs.WCSuccess, uint32(100), uint32(b.Addr()), verbs.WCFlagWithImm},
		[]any{c.WRID(), c.Opcode(), c.Status(), c.ByteLen(), c.QPNum(), c.WCFlags()})
	require.NoError(t, c.NextPoll())
	require.Equal(t, []any{uint64(7), verbs.WCSend, uint32(100), uint32(a.Addr())},
		[]any{c.WRID(), c.Opcode(), c.ByteLen(), c.QPNum()})
	c.EndPoll()
}

// The iterator: ENOENT when empty (no EndPoll), each completion's fields,
// ENOENT at the end of the batch, EndPoll; then the classic Poll.
func TestIterator(t *testing.T) {
	e := newEnv(t)
	c := e.cq(verbs.CQInitAttr{CQE: 64, Fields: verbs.FieldByteLen | verbs.FieldImm | verbs.FieldQPNum | verbs.FieldSrcQP})
	z := e.qp(c, false) // QP 0: a and b have non-zero numbers
	a, b := e.qp(c, false), e.qp(c, false)
	defer func() { _ = z.Close(); _ = a.Close(); _ = b.Close(); _ = c.Close() }()

	err := c.StartPoll()
	require.ErrorIs(t, err, syscall.ENOENT)
	require.ErrorIs(t, err, verbs.ErrEmpty)

	e.recv(b, 1000)
	e.send(a, b, 7, 100, qpsim.SendOpts{Data: 0xabcd, HasData: true})
	e.send(a, nowhere(a), uint64(1)<<40, 60, qpsim.SendOpts{})

	require.NoError(t, c.StartPoll())
	type got struct {
		wrid       uint64
		op         verbs.WCOpcode
		st         verbs.WCStatus
		n, qp, src uint32
		imm        uint32
		flags      verbs.WCFlags
	}
	var all []got
	for {
		all = append(all, got{c.WRID(), c.Opcode(), c.Status(), c.ByteLen(), c.QPNum(), c.SrcQP(), c.ImmData(), c.WCFlags()})
		if err := c.NextPoll(); err != nil {
			require.ErrorIs(t, err, syscall.ENOENT)
			break
		}
	}
	c.EndPoll()
	require.Equal(t, []got{
		// The device delivers the frame, then completes the send.
		{1000, verbs.WCRecv, verbs.WCSuccess, 100, uint32(b.Addr()), uint32(a.Addr()), 0xabcd, verbs.WCFlagWithImm},
		{7, verbs.WCSend, verbs.WCSuccess, 100, uint32(a.Addr()), 0, 0, 0},
		{1 << 40, verbs.WCSend, verbs.WCSuccess, 60, uint32(a.Addr()), 0, 0, 0},
	}, all)
	require.ErrorIs(t, c.StartPoll(), verbs.ErrEmpty)

	// The classic poll on the same path, and a batch ended early keeps
	// the rest for the next one.
	for i := range 5 {
		e.send(a, nowhere(a), uint64(i), 10, qpsim.SendOpts{})
	}
	require.NoError(t, c.StartPoll())
	require.Equal(t, uint64(0), c.WRID())
	c.EndPoll()
	wcs := make([]verbs.WC, 3)
	n, err := c.Poll(wcs)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	require.Equal(t, []uint64{1, 2, 3}, []uint64{wcs[0].WRID, wcs[1].WRID, wcs[2].WRID})
	rest := drain(t, c)
	require.Len(t, rest, 1)
	require.Equal(t, uint64(4), rest[0].WRID)
	n, err = c.Poll(wcs)
	require.NoError(t, err)
	require.Zero(t, n)
}

// EndPoll outside a batch does nothing: after a failed StartPoll, a
// second time, or with no StartPoll. (It used to unlock the CQ's unlocked
// mutex, a fatal error that no recover catches.) The CQ works afterwards,
// its lock free.
func TestEndPollOutsideBatch(t *testing.T) {
	e := newEnv(t)
	for _, fl := range []verbs.CreateFlags{0, verbs.SingleThreaded} {
		c := e.cq(verbs.CQInitAttr{CQE: 8, Flags: fl})
		a := e.qp(c, false)
		// works checks that a completion is read, on another goroutine
		// for a locked CQ (whose lock must be free).
		works := func(wrid uint64) {
			t.Helper()
			e.send(a, nowhere(a), wrid, 10, qpsim.SendOpts{})
			got := make(chan []verbs.WC, 1)
			poll := func() {
				wcs := make([]verbs.WC, 4)
				n, _ := c.Poll(wcs)
				got <- wcs[:n]
			}
			if fl&verbs.SingleThreaded != 0 {
				poll()
			} else {
				go poll()
			}
			select {
			case wcs := <-got:
				require.Len(t, wcs, 1)
				require.Equal(t, wrid, wcs[0].WRID)
			case <-time.After(5 * time.Second):
				t.Fatalf("flags %v: the CQ's lock is held", fl)
			}
		}

		c.EndPoll() // no StartPoll
		works(1)

		require.ErrorIs(t, c.StartPoll(), verbs.ErrEmpty)
		c.EndPoll() // after a failed StartPoll
		works(2)

		e.send(a, nowhere(a), 3, 10, qpsim.SendOpts{})
		e.send(a, nowhere(a), 4, 10, qpsim.SendOpts{})
		require.NoError(t, c.StartPoll())
		require.Equal(t, uint64(3), c.WRID())
		c.EndPoll()
		c.EndPoll() // a second time: consumes nothing more
		wcs := drain(t, c)
		require.Len(t, wcs, 1)
		require.Equal(t, uint64(4), wcs[0].WRID)
		works(5)

		require.NoError(t, a.Close())
		require.NoError(t, c.Close())
	}
}

// Error completions come in completion order with their status and
// vendor error; bad device entries are general errors.
func TestErrorCompletions(t *testing.T) {
	e := newEnv(t)
	c := e.cq(verbs.CQInitAttr{CQE: 64})
	a := e.qp(c, false)
	defer func() { _ = a.Close(); _ = c.Close() }()
	e.send(a, nowhere(a), 1, 10, qpsim.SendOpts{})
	require.NoError(t, e.d.Inject(c.FI(), qpsim.Fault{Kind: qpsim.FaultErrorStatus, Status: qpsim.StatusLocalProtErr, Syndrome: 0x1234}))
	e.send(a, nowhere(a), 2, 10, qpsim.SendOpts{})
	require.NoError(t, e.d.Inject(c.FI(), qpsim.Fault{Kind: qpsim.FaultErrorStatus, Status: qpsim.StatusRemoteAccessErr, Syndrome: 7}))
	e.send(a, nowhere(a), 3, 10, qpsim.SendOpts{})
	require.NoError(t, e.d.Inject(c.FI(), qpsim.Fault{Kind: qpsim.FaultBadLen}))
	e.send(a, nowhere(a), 4, 10, qpsim.SendOpts{})
	e.send(a, nowhere(a), 5, 10, qpsim.SendOpts{})
	badLen := int32(cq.ProvBadLen)
	wcs := drain(t, c)
	require.Len(t, wcs, 5)
	want := []struct {
		wrid   uint64
		st     verbs.WCStatus
		vendor uint32
	}{{1, verbs.WCSuccess, 0}, {2, verbs.WCLocProtErr, 0x1234}, {3, verbs.WCRemAccessErr, 7},
		{4, verbs.WCGeneralErr, uint32(badLen)}, {5, verbs.WCSuccess, 0}}
	for i, w := range want {
		require.Equal(t, w.wrid, wcs[i].WRID, "%d", i)
		require.Equal(t, w.st, wcs[i].Status, "%d", i)
		require.Equal(t, w.vendor, wcs[i].VendorErr, "%d", i)
		require.Equal(t, verbs.WCSend, wcs[i].Opcode)
	}
}

// A device entry that reports a receive for a posted send (or a send for
// a posted receive) is a general error of the operation posted, never a
// successful IBV_WC_RECV: the opcode is checked against the posting as
// ids and lengths are. The vendor error is cq.ProvBadOp.
func TestWrongOpcode(t *testing.T) {
	e := newEnv(t)
	c := e.cq(verbs.CQInitAttr{CQE: 64})
	a := e.qp(c, false)
	b := e.qp(c, false)
	defer func() { _ = a.Close(); _ = b.Close(); _ = c.Close() }()
	require.NoError(t, e.d.Inject(c.FI(), qpsim.Fault{Kind: qpsim.FaultWrongOpcode}))
	e.send(a, nowhere(a), 1, 10, qpsim.SendOpts{}) // reported as a RECV
	e.send(a, nowhere(a), 2, 10, qpsim.SendOpts{})
	e.recv(b, 3)
	require.NoError(t, e.d.Inject(c.FI(), qpsim.Fault{Kind: qpsim.FaultWrongOpcode}))
	e.send(a, b, 4, 10, qpsim.SendOpts{}) // b's receive reported as a SEND
	e.recv(b, 5)
	e.send(a, b, 6, 10, qpsim.SendOpts{})
	wcs := drain(t, c)
	byID := map[uint64]verbs.WC{}
	for _, w := range wcs {
		_, dup := byID[w.WRID]
		require.False(t, dup, "wrid %d completed twice", w.WRID)
		byID[w.WRID] = w
	}
	badOp := int32(cq.ProvBadOp)
	for _, w := range []struct {
		wrid   uint64
		st     verbs.WCStatus
		op     verbs.WCOpcode
		vendor uint32
	}{
		{1, verbs.WCGeneralErr, verbs.WCSend, uint32(badOp)},
		{2, verbs.WCSuccess, verbs.WCSend, 0},
		{4, verbs.WCSuccess, verbs.WCSend, 0},
		{3, verbs.WCGeneralErr, verbs.WCRecv, uint32(badOp)},
		{6, verbs.WCSuccess, verbs.WCSend, 0},
		{5, verbs.WCSuccess, verbs.WCRecv, 0},
	} {
		got, ok := byID[w.wrid]
		require.True(t, ok, "wrid %d completed (got %+v)", w.wrid, wcs)
		require.Equal(t, w.st, got.Status, "wrid %d", w.wrid)
		require.Equal(t, w.op, got.Opcode, "wrid %d: the posted operation's opcode", w.wrid)
		require.Equal(t, w.vendor, got.VendorErr, "wrid %d", w.wrid)
	}
	require.Len(t, wcs, 6)
}

// Closing a QP that flushes completes its posted receives with "Work
// Request Flushed Error", in order.
func TestFlushOnClose(t *testing.T) {
	e := newEnv(t)
	c := e.cq(verbs.CQInitAttr{CQE: 64})
	a := e.qp(c, true)
	for i := range 3 {
		e.recv(a, uint64(100+i))
	}
	require.NoError(t, a.Close())
	wcs := drain(t, c)
	require.Len(t, wcs, 3)
	for i, w := range wcs {
		require.Equal(t, uint64(100+i), w.WRID)
		require.Equal(t, verbs.WCWRFlushErr, w.Status)
		require.Equal(t, verbs.WCRecv, w.Opcode)
		require.Equal(t, "Work Request Flushed Error", w.Status.String())
	}
	require.NoError(t, c.Close())
	require.ErrorIs(t, c.StartPoll(), os.ErrClosed)
	_, err := c.Poll(make([]verbs.WC, 1))
	require.ErrorIs(t, err, os.ErrClosed)
}

// An overrun CQ reports cq.ErrOverrun and stays in the error state.
func TestOverrun(t *testing.T) {
	e := newEnv(t)
	c := e.cq(verbs.CQInitAttr{CQE: 4})
	a := e.qp(c, false)
	defer func() { _ = a.Close(); _ = c.Close() }()
	for i := range c.CQE() + 1 {
		e.send(a, nowhere(a), uint64(i), 10, qpsim.SendOpts{})
	}
	wcs := make([]verbs.WC, 64)
	n, err := c.Poll(wcs)
	require.NoError(t, err)
	require.Equal(t, c.CQE(), n)
	_, err = c.Poll(wcs)
	require.ErrorIs(t, err, cq.ErrOverrun)
	require.ErrorIs(t, c.StartPoll(), cq.ErrOverrun)
}

func TestStrings(t *testing.T) {
	require.Equal(t, "success", verbs.WCSuccess.String())
	require.Equal(t, "local length error", verbs.WCLocLenErr.String())
	require.Equal(t, "local protection error", verbs.WCLocProtErr.String())
	require.Equal(t, "remote access error", verbs.WCRemAccessErr.String())
	require.Equal(t, "memory management operation error", verbs.WCMWBindErr.String())
	require.Equal(t, "general error", verbs.WCGeneralErr.String())
	require.Equal(t, "unknown status 99", verbs.WCStatus(99).String())
	require.Equal(t, "RECV_RDMA_WITH_IMM", verbs.WCRecvRDMAWithImm.String())
	require.Equal(t, "BYTE_LEN|QP_NUM|0x1000000", (verbs.FieldByteLen | verbs.FieldQPNum | 1<<24).String())
}

// The iterator allocates nothing.
func TestIteratorAllocs(t *testing.T) {
	e := newEnv(t)
	for _, single := range []bool{false, true} {
		fl := verbs.CreateFlags(0)
		if single {
			fl = verbs.SingleThreaded
		}
		c := e.cq(verbs.CQInitAttr{CQE: 4096, Flags: fl})
		a, err := e.d.NewQP(qpsim.QPConfig{SendCQ: c.FI(), RecvCQ: c.FI(), SendSize: 4096})
		require.NoError(t, err)
		ctxs := make([]any, 3300)
		for i := range ctxs {
			ctxs[i] = uint64(i)
		}
		for off := 0; off < len(ctxs); off += 256 {
			n, err := a.SendBatch(a.Addr(), ctxs[off:min(off+256, len(ctxs))], make([]byte, 64), qpsim.SendOpts{})
			require.NoError(t, err)
			require.NoError(t, a.Flush(context.Background()))
			_ = n
		}
		require.NoError(t, e.d.Sync(context.Background()))
		var sum uint64
		allocs := testing.AllocsPerRun(100, func() {
			if c.StartPoll() != nil {
				t.Fatal("empty")
			}
			for k := 0; ; k++ { // a batch of 32
				sum += c.WRID() + uint64(c.Status()) + uint64(c.Opcode()) + uint64(c.ByteLen())
				if k == 31 || c.NextPoll() != nil {
					break
				}
			}
			c.EndPoll()
		})
		require.Zero(t, allocs, "single=%v", single)
		const n = 101 * 32 // AllocsPerRun's warm-up run and 100
		require.Equal(t, uint64(n*(n-1)/2+64*n), sum, "ids 0 to n-1 in order, 64 bytes, SEND, success")
		require.NoError(t, a.Close())
		require.NoError(t, c.Close())
	}
}

// Destroying CQs and channels gives back every descriptor.
func TestNoLeakedFDs(t *testing.T) {
	before, err := leakcheck.Snapshot()
	require.NoError(t, err)
	e := newEnv(t)
	ch, err := verbs.NewCompChannel()
	require.NoError(t, err)
	for range 5 {
		c := e.cq(verbs.CQInitAttr{CQE: 16, Channel: ch})
		a := e.qp(c, false)
		_, err := c.ReqNotify(false)
		require.NoError(t, err)
		e.send(a, nowhere(a), 1, 10, qpsim.SendOpts{})
		got, _ := getEvent(t, ch)
		got.AckEvents(1)
		require.NoError(t, a.Close())
		require.NoError(t, c.Close())
	}
	require.NoError(t, ch.Close())
	require.NoError(t, e.d.Close())
	after, err := leakcheck.Snapshot()
	require.NoError(t, err)
	require.Equal(t, before.FDs, after.FDs, "before %v, after %v", before, after)
}

// ignoreOverrun is the software device's provider claiming IgnoreOverrun,
// to test the verbs side of the flag: the device still drops what does not
// fit, but the CQ does not enter the error state.
type ignoreOverrun struct{ verbs.Provider }

func (p ignoreOverrun) QueryDevice() verbs.DeviceAttr {
	a := p.Provider.QueryDevice()
	a.Flags |= verbs.IgnoreOverrun
	return a
}

func TestIgnoreOverrun(t *testing.T) {
	e := newEnv(t)
	c, err := verbs.CreateCQ(ignoreOverrun{e.p}, verbs.CQInitAttr{CQE: 4, Flags: verbs.IgnoreOverrun})
	require.NoError(t, err)
	a := e.qp(c, false)
	defer func() { _ = a.Close(); _ = c.Close() }()
	for i := range c.CQE() + 1 {
		e.send(a, nowhere(a), uint64(i), 10, qpsim.SendOpts{})
	}
	wcs := make([]verbs.WC, 64)
	n, err := c.Poll(wcs)
	require.NoError(t, err)
	require.Equal(t, c.CQE(), n)
	for range 3 {
		n, err = c.Poll(wcs)
		require.NoError(t, err, "no error state")
		require.Zero(t, n)
		require.ErrorIs(t, c.StartPoll(), verbs.ErrEmpty)
	}
}

// On a CQ created IgnoreOverrun, ReqNotify does not count an overrun as
// a completion present: polling gives nothing, so present=true would
// have the caller poll for ever. With or without a channel.
func TestIgnoreOverrunReqNotify(t *testing.T) {
	e := newEnv(t)
	ch, err := verbs.NewCompChannel()
	require.NoError(t, err)
	defer func() { require.NoError(t, ch.Close()) }()
	for _, withCh := range []bool{false, true} {
		attr := verbs.CQInitAttr{CQE: 4, Flags: verbs.IgnoreOverrun}
		if withCh {
			attr.Channel = ch
		}
		c, err := verbs.CreateCQ(ignoreOverrun{e.p}, attr)
		require.NoError(t, err)
		a := e.qp(c, false)
		for i := range c.CQE() + 1 {
			e.send(a, nowhere(a), uint64(i), 10, qpsim.SendOpts{})
		}
		present, err := c.ReqNotify(false)
		require.NoError(t, err)
		require.True(t, present, "channel %v: the CQ is full", withCh)
		require.Len(t, drain(t, c), c.CQE())
		for range 3 {
			present, err := c.ReqNotify(false)
			require.NoError(t, err)
			require.False(t, present, "channel %v: nothing to poll", withCh)
			require.ErrorIs(t, c.StartPoll(), verbs.ErrEmpty)
		}
		require.NoError(t, a.Close())
		require.NoError(t, c.Close())
	}
}
