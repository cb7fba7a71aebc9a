package conformance

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/cq/qpsim"
)

// Run runs every conformance test against p, each as a subtest.
func Run(t *testing.T, p Provider) {
	s := &suite{p: p, caps: p.Caps()}
	tests := []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"OpenSizes", s.testOpenSizes},
		{"BadAttributes", s.testBadAttributes},
		{"ManyOpen", s.testManyOpen},
		{"ReadEmpty", s.testReadEmpty},
		{"Formats", s.testFormats},
		{"ReadFrom", s.testReadFrom},
		{"ZeroCountDrivesProgress", s.testZeroCount},
		{"MixedSuccessError", s.testMixed},
		{"ReadErrNoError", s.testReadErrNone},
		{"ErrDataBuffers", s.testErrData},
		{"DeviceErrors", s.testDeviceErrors},
		{"Truncation", s.testTruncation},
		{"MultiRecv", s.testMultiRecv},
		{"SReadTimeout", s.testSReadTimeout},
		{"SReadImmediate", s.testSReadImmediate},
		{"SReadWakes", s.testSReadWakes},
		{"SReadWaitObjects", s.testSReadWaitObjects},
		{"SReadNoWaitObject", s.testSReadNoWait},
		{"SignalBefore", s.testSignalBefore},
		{"SignalDuring", s.testSignalDuring},
		{"SReadContextCancel", s.testSReadCancel},
		{"Threshold", s.testThreshold},
		{"WaitFD", s.testWaitFD},
		{"Overrun", s.testOverrun},
		{"CloseBound", s.testCloseBound},
		{"CloseWakesSRead", s.testCloseWakesSRead},
		{"SingleThreaded", s.testSingleThreaded},
		{"ConcurrentReadersWriters", s.testConcurrent},
		{"ConcurrentSRead", s.testConcurrentSRead},
		{"NoAllocs", s.testNoAllocs},
		{"Faults", s.testFaults},
	}
	for _, tc := range tests {
		t.Run(tc.name, tc.fn)
	}
}

type suite struct {
	p    Provider
	caps Caps
}

const waitLong = 10 * time.Second

// skipUnless skips t when the provider lacks the capability called name,
// with the provider's reason when it gave one.
func (s *suite) skipUnless(t *testing.T, has bool, name, what string) {
	t.Helper()
	if has {
		return
	}
	if why := s.caps.Why[name]; why != "" {
		t.Skipf("%s: %s", what, why)
	}
	t.Skip(what)
}

func (s *suite) open(t *testing.T, attr cq.Attr) *cq.CQ {
	t.Helper()
	c, err := s.p.OpenCQ(attr)
	require.NoError(t, err, "open %+v", attr)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func (s *suite) endpoint(t *testing.T, c *cq.CQ, attr EndpointAttr) Endpoint {
	t.Helper()
	ep, err := s.p.NewEndpoint(c, attr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ep.Close() })
	return ep
}

func flush(t *testing.T, ep Endpoint) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	require.NoError(t, ep.Flush(ctx))
}

// send retries while the queue is full.
func send(t testing.TB, ep Endpoint, ctx any, payload []byte, o SendOpts) {
	deadline := time.Now().Add(waitLong)
	for {
		err := ep.Send(ctx, payload, o)
		if err == nil {
			return
		}
		if !errors.Is(err, cq.ErrAgain) || time.Now().After(deadline) {
			require.NoError(t, err)
		}
		runtime.Gosched()
	}
}

// readN reads until n completions arrived; any error but ErrAgain fails.
func readN(t *testing.T, c *cq.CQ, n int) []cq.Entry {
	t.Helper()
	out := make([]cq.Entry, 0, n)
	ents := make([]cq.Entry, n)
	deadline := time.Now().Add(waitLong)
	for len(out) < n {
		k, err := c.Read(ents[:n-len(out)])
		if err == nil {
			out = append(out, ents[:k]...)
			continue
		}
		require.ErrorIs(t, err, cq.ErrAgain, "after %d of %d completions", len(out), n)
		require.True(t, time.Now().Before(deadline), "timed out with %d of %d completions", len(out), n)
		time.Sleep(20 * time.Microsecond)
	}
	return out
}

func byContext(ents []cq.Entry) map[any]cq.Entry {
	m := map[any]cq.Entry{}
	for _, e := range ents {
		m[e.Context] = e
	}
	return m
}

func bufAddr(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }

// testOpenSizes: size 0 (provider default) and sizes from 1 to MaxSize open
// with at least the requested entries and close; larger sizes are refused.
func (s *suite) testOpenSizes(t *testing.T) {
	sizes := []int{0}
	for n := 1; n <= 1024 && n <= s.caps.MaxSize; n++ {
		sizes = append(sizes, n)
	}
	for p := 2048; p <= s.caps.MaxSize; p *= 2 {
		sizes = append(sizes, p-1, p)
		if p+1 <= s.caps.MaxSize {
			sizes = append(sizes, p+1)
		}
	}
	sizes = append(sizes, s.caps.MaxSize-1, s.caps.MaxSize)
	// Opening every size up to 65536 maps 64k rings (81 s on the software
	// device): past 1024 the boundaries above plus a seeded random sample
	// are opened, and cq's own tests resolve every size exhaustively.
	rng := rand.New(rand.NewPCG(1, uint64(s.caps.MaxSize)))
	for range 128 {
		if s.caps.MaxSize > 1025 {
			sizes = append(sizes, 1025+rng.IntN(s.caps.MaxSize-1024))
		}
	}
	ents := make([]cq.Entry, 1)
	for _, n := range sizes {
		c, err := s.p.OpenCQ(cq.Attr{Size: n})
		require.NoError(t, err, "size %d", n)
		got := c.Attr().Size
		if n == 0 {
			require.Positive(t, got, "size 0 picks a default")
		} else {
			require.GreaterOrEqual(t, got, n, "size %d", n)
		}
		_, err = c.Read(ents)
		require.ErrorIs(t, err, cq.ErrAgain)
		require.NoError(t, c.Close(), "size %d", n)
		require.NoError(t, c.Close(), "Close is idempotent")
	}
	_, err := s.p.OpenCQ(cq.Attr{Size: s.caps.MaxSize + 1})
	require.ErrorIs(t, err, cq.ErrInvalid)
	_, err = s.p.OpenCQ(cq.Attr{Size: -1})
	require.ErrorIs(t, err, cq.ErrInvalid)
}

func (s *suite) testBadAttributes(t *testing.T) {
	for _, a := range []cq.Attr{{Format: 9}, {WaitObj: 17}, {WaitCond: 5}, {Flags: 1 << 3},
		{Flags: cq.AttrAffinity, SignalingVector: 1 << 20}, {Flags: cq.AttrAffinity, SignalingVector: -1}} {
		_, err := s.p.OpenCQ(a)
		require.ErrorIs(t, err, cq.ErrInvalid, "%+v", a)
	}
	_, err := s.p.OpenCQ(cq.Attr{WaitObj: cq.WaitSet})
	require.ErrorIs(t, err, cq.ErrNotSupported)
	c := s.open(t, cq.Attr{Flags: cq.AttrAffinity, SignalingVector: 0})
	require.Equal(t, cq.AttrAffinity, c.Attr().Flags)
	require.Equal(t, 0, c.Attr().SignalingVector)
	c = s.open(t, cq.Attr{})
	require.NotEqual(t, cq.FormatUnspec, c.Attr().Format, "UNSPEC resolves to the provider's default")
	require.Equal(t, cq.WaitNone, c.Attr().WaitObj, "the default wait object is NONE")
}

// testManyOpen: many CQs at once, each with an endpoint, each seeing only
// its own completions. A device with fewer endpoints (MaxEndpoints) gets
// as many as it has, on the first CQs; the others must stay empty.
func (s *suite) testManyOpen(t *testing.T) {
	const n = 100
	withEP := n
	if s.caps.MaxEndpoints > 0 {
		withEP = min(n, s.caps.MaxEndpoints)
		t.Logf("%d CQs, %d of them with an endpoint (the device has %d)", n, withEP, s.caps.MaxEndpoints)
	}
	cqs := make([]*cq.CQ, n)
	eps := make([]Endpoint, withEP)
	for i := range cqs {
		cqs[i] = s.open(t, cq.Attr{Size: 16, Format: cq.FormatContext})
		if i < withEP {
			eps[i] = s.endpoint(t, cqs[i], EndpointAttr{SendDepth: 4, RecvDepth: 4})
		}
	}
	for i := range eps {
		send(t, eps[i], i, []byte{byte(i)}, SendOpts{})
	}
	for i := range eps {
		got := readN(t, cqs[i], 1)
		require.Equal(t, i, got[0].Context)
	}
	for i := range cqs {
		_, err := cqs[i].Read(make([]cq.Entry, 1))
		require.ErrorIs(t, err, cq.ErrAgain)
		if i < withEP {
			require.NoError(t, eps[i].Close())
		}
		require.NoError(t, cqs[i].Close())
	}
}

func (s *suite) testReadEmpty(t *testing.T) {
	c := s.open(t, cq.Attr{WaitObj: cq.WaitFD})
	s.endpoint(t, c, EndpointAttr{})
	ents := make([]cq.Entry, 4)
	_, err := c.Read(ents)
	require.ErrorIs(t, err, cq.ErrAgain)
	_, err = c.ReadFrom(ents, make([]cq.Addr, 4))
	require.ErrorIs(t, err, cq.ErrAgain)
	require.ErrorIs(t, c.ReadErr(&cq.ErrEntry{}), cq.ErrAgain)
	start := time.Now()
	_, err = c.SRead(context.Background(), ents, 0, 0)
	require.ErrorIs(t, err, cq.ErrAgain, "timeout 0 tries once")
	require.ErrorIs(t, err, cq.ErrTimeout)
	require.Less(t, time.Since(start), time.Second)
}

// testFormats: each format's fields round-trip; fields outside it stay 0.
func (s *suite) testFormats(t *testing.T) {
	for _, f := range []cq.Format{cq.FormatUnspec, cq.FormatContext, cq.FormatMsg, cq.FormatData, cq.FormatTagged} {
		t.Run(f.String(), func(t *testing.T) {
			c := s.open(t, cq.Attr{Format: f, Size: 16})
			eff := c.Attr().Format
			require.NotEqual(t, cq.FormatUnspec, eff)
			if f != cq.FormatUnspec {
				require.Equal(t, f, eff)
			}
			ep := s.endpoint(t, c, EndpointAttr{})
			buf, err := ep.PostRecv("rx", 512, RecvOpts{})
			require.NoError(t, err)
			o := SendOpts{Data: 0xdada, HasData: s.caps.RemoteData, Tag: 0x7a97, Tagged: s.caps.Tagged}
			payload := make([]byte, 100)
			for i := range payload {
				payload[i] = byte(i * 7)
			}
			send(t, ep, "tx", payload, o)
			got := byContext(readN(t, c, 2))
			hdr := s.caps.FrameHeader // the wire's header before the payload
			require.Equal(t, payload, buf[hdr:hdr+100], "the frame landed in the receive buffer")

			msgOrTag := cq.FlagMsg
			if o.Tagged {
				msgOrTag = cq.FlagTagged
			}
			wantRx := cq.Entry{Context: "rx", Queue: got["rx"].Queue}
			wantTx := cq.Entry{Context: "tx", Queue: got["tx"].Queue}
			if eff >= cq.FormatMsg {
				wantRx.Flags = cq.FlagRecv | msgOrTag
				if o.HasData {
					wantRx.Flags |= cq.FlagRemoteCQData
				}
				wantRx.Len = hdr + 100
				wantTx.Flags = cq.FlagSend | msgOrTag
				wantTx.Len = got["tx"].Len // len is defined for receives only
				require.Contains(t, []int{0, 100, hdr + 100}, wantTx.Len)
			}
			if eff >= cq.FormatData {
				wantRx.Buf = bufAddr(buf)
				if o.HasData {
					wantRx.Data = o.Data
				}
			}
			if eff >= cq.FormatTagged && o.Tagged {
				wantRx.Tag = o.Tag
			}
			require.Equal(t, wantRx, got["rx"])
			require.Equal(t, wantTx, got["tx"])
		})
	}
}

// testReadFrom: source addresses where the endpoint has them, AddrNotAvail
// elsewhere; the address slice must cover the entries.
func (s *suite) testReadFrom(t *testing.T) {
	for _, source := range []bool{false, true} {
		t.Run(fmt.Sprintf("source=%v", source), func(t *testing.T) {
			if source {
				s.skipUnless(t, s.caps.Source, "Source", "endpoints have no source addresses")
			}
			c := s.open(t, cq.Attr{Format: cq.FormatMsg, WaitObj: cq.WaitFD})
			ep := s.endpoint(t, c, EndpointAttr{Source: source})
			_, err := ep.PostRecv("rx", 256, RecvOpts{})
			require.NoError(t, err)
			send(t, ep, "tx", []byte("from"), SendOpts{})
			flush(t, ep)
			ents := make([]cq.Entry, 2)
			addrs := make([]cq.Addr, 2)
			_, err = c.ReadFrom(ents, addrs[:1])
			require.ErrorIs(t, err, cq.ErrInvalid)
			_, err = c.SReadFrom(context.Background(), ents, addrs[:1], 0, time.Second)
			require.ErrorIs(t, err, cq.ErrInvalid)
			n := 0
			for n < 2 {
				k, err := c.SReadFrom(context.Background(), ents[n:], addrs[n:], 0, waitLong)
				require.NoError(t, err)
				n += k
			}
			for i, e := range ents {
				switch {
				case e.Context == "rx" && source:
					require.Equal(t, ep.Addr(), addrs[i])
				default:
					require.Equal(t, cq.AddrNotAvail, addrs[i], "%v", e.Context)
				}
			}
		})
	}
}

// testZeroCount: a read of zero entries drives progress and consumes
// nothing.
func (s *suite) testZeroCount(t *testing.T) {
	c := s.open(t, cq.Attr{Format: cq.FormatContext})
	ep := s.endpoint(t, c, EndpointAttr{})
	_, err := c.Read(nil)
	require.ErrorIs(t, err, cq.ErrAgain)
	send(t, ep, "one", []byte("x"), SendOpts{})
	flush(t, ep)
	n, err := c.Read(nil)
	require.NoError(t, err)
	require.Zero(t, n)
	require.Equal(t, "one", readN(t, c, 1)[0].Context, "nothing was consumed")
}

// testMixed: ok, ok, error, ok: a read of 3 returns 2, then ErrAvail, then
// ReadErr returns the error, then the fourth is read.
func (s *suite) testMixed(t *testing.T) {
	s.skipUnless(t, !s.caps.NoFailNext, "FailNext", "the device cannot fail an operation on demand")
	c := s.open(t, cq.Attr{Format: cq.FormatMsg, Size: 16})
	ep := s.endpoint(t, c, EndpointAttr{})
	send(t, ep, 1, []byte("a"), SendOpts{})
	send(t, ep, 2, []byte("b"), SendOpts{})
	flush(t, ep)
	require.NoError(t, ep.FailNext())
	send(t, ep, 3, []byte("c"), SendOpts{})
	flush(t, ep)
	send(t, ep, 4, []byte("d"), SendOpts{})
	flush(t, ep)
	ents := make([]cq.Entry, 3)
	n, err := c.Read(ents)
	require.NoError(t, err)
	require.Equal(t, 2, n, "the successes before the error")
	require.Equal(t, []any{1, 2}, []any{ents[0].Context, ents[1].Context})
	_, err = c.Read(ents)
	require.ErrorIs(t, err, cq.ErrAvail)
	_, err = c.ReadFrom(ents, make([]cq.Addr, 3))
	require.ErrorIs(t, err, cq.ErrAvail)
	var ee cq.ErrEntry
	require.NoError(t, c.ReadErr(&ee))
	require.Equal(t, 3, ee.Context)
	require.NotZero(t, ee.Err)
	require.NotEmpty(t, ee.Err.Error())
	require.NotEmpty(t, c.StrError(ee.ProvErrno, ee.ErrData))
	require.True(t, ee.Flags&cq.FlagSend != 0, "error entries carry every field: %v", ee.Flags)
	require.ErrorIs(t, c.ReadErr(&ee), cq.ErrAgain, "one error entry")
	n, err = c.Read(ents)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, 4, ents[0].Context)
}

func (s *suite) testReadErrNone(t *testing.T) {
	c := s.open(t, cq.Attr{Format: cq.FormatMsg})
	ep := s.endpoint(t, c, EndpointAttr{})
	send(t, ep, "ok", []byte("x"), SendOpts{})
	flush(t, ep)
	require.ErrorIs(t, c.ReadErr(&cq.ErrEntry{}), cq.ErrAgain, "a success at the head is not an error")
	require.Equal(t, "ok", readN(t, c, 1)[0].Context)
}

// testErrData: err_data into a short caller buffer, into a large one, and
// held by the CQ when the caller gives none.
func (s *suite) testErrData(t *testing.T) {
	s.skipUnless(t, !s.caps.NoFailNext, "FailNext", "the device cannot fail an operation on demand")
	c := s.open(t, cq.Attr{Format: cq.FormatMsg})
	ep := s.endpoint(t, c, EndpointAttr{})
	for i := 0; i < 3; i++ {
		require.NoError(t, ep.FailNext())
		send(t, ep, i, []byte("x"), SendOpts{})
		flush(t, ep)
	}
	var held cq.ErrEntry
	require.NoError(t, c.ReadErr(&held))
	full := len(held.ErrData)
	require.Equal(t, 0, held.Context)

	short := make([]byte, 4)
	ee := cq.ErrEntry{ErrData: short}
	require.NoError(t, c.ReadErr(&ee))
	require.Equal(t, 1, ee.Context)
	require.Len(t, ee.ErrData, min(4, full), "copied up to the caller's capacity")
	if full > 0 {
		require.Same(t, &short[0], &ee.ErrData[0], "into the caller's buffer")
	}

	big := make([]byte, 4096)
	ee = cq.ErrEntry{ErrData: big}
	require.NoError(t, c.ReadErr(&ee))
	require.Equal(t, 2, ee.Context)
	require.Len(t, ee.ErrData, full, "resliced to the data's length")
}

// testDeviceErrors: error completions the device makes itself (a frame
// longer than the receive buffer, Oversizer) follow the same rules as
// injected ones. Receives 0..7 are posted; a frame fills 0; the oversized
// frame takes the next n, each an ETRUNC error, and wakes a blocked SRead
// with ErrAvail; frames fill the rest. Reads stop before the first error,
// ReadErr takes the errors in order (error data held by the CQ, or copied
// into a short buffer), then the receives after them read in order.
func (s *suite) testDeviceErrors(t *testing.T) {
	c := s.open(t, cq.Attr{Format: cq.FormatData, Size: 32, WaitObj: cq.WaitFD})
	ep := s.endpoint(t, c, EndpointAttr{})
	ov, ok := ep.(Oversizer)
	s.skipUnless(t, ok, "Oversizer", "the device makes no error completions of its own")
	const posted = 8
	bufs := make([][]byte, posted)
	for i := range bufs {
		var err error
		bufs[i], err = ep.PostRecv(i, 512, RecvOpts{})
		require.NoError(t, err)
	}
	payload := func(i int) []byte {
		p := make([]byte, 64)
		for j := range p {
			p[j] = byte(i*31 + j)
		}
		return p
	}
	send(t, ep, "tx0", payload(0), SendOpts{})
	flush(t, ep)
	got := byContext(readN(t, c, 2))
	require.Contains(t, got, "tx0")
	require.Contains(t, got, 0, "the first frame filled receive 0")

	type result struct {
		n   int
		err error
	}
	woke := make(chan result, 1)
	go func() {
		n, err := c.SRead(context.Background(), make([]cq.Entry, 4), 0, waitLong)
		woke <- result{n, err}
	}()
	time.Sleep(20 * time.Millisecond) // let the reader block (it may not have: the result is the same)
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	n, err := ov.RecvOversize(ctx)
	require.NoError(t, err)
	require.True(t, n >= 1 && n <= posted-2, "the oversized frame took %d receives", n)
	select {
	case r := <-woke:
		require.ErrorIs(t, r.err, cq.ErrAvail, "an error completion wakes SRead")
		require.Zero(t, r.n)
	case <-time.After(waitLong):
		t.Fatal("the error completion did not wake SRead")
	}
	for i := n + 1; i < posted; i++ {
		send(t, ep, fmt.Sprintf("tx%d", i), payload(i), SendOpts{})
	}
	flush(t, ep)

	// Only send completions can come before the first error entry.
	ents := make([]cq.Entry, 16)
	sends := 0
	for {
		k, err := c.Read(ents)
		if err != nil {
			require.ErrorIs(t, err, cq.ErrAvail, "the error entry is at the head")
			break
		}
		for _, e := range ents[:k] {
			require.NotZero(t, e.Flags&cq.FlagSend, "a receive after the error was read before it: %v", e.Context)
			sends++
		}
	}
	for i := 1; i <= n; i++ {
		ee := cq.ErrEntry{}
		short := make([]byte, 4)
		if i%2 == 0 {
			ee.ErrData = short
		}
		require.NoError(t, c.ReadErr(&ee), "error %d of %d", i, n)
		require.Equal(t, i, ee.Context, "errors in posting order")
		require.Equal(t, cq.ETRUNC, ee.Err)
		require.True(t, errors.Is(ee.Err, cq.ETRUNC))
		require.NotZero(t, ee.Flags&cq.FlagRecv, "error entries carry their flags: %v", ee.Flags)
		require.NotEmpty(t, c.StrError(ee.ProvErrno, ee.ErrData))
		if i%2 == 0 && len(ee.ErrData) > 0 {
			require.LessOrEqual(t, len(ee.ErrData), 4, "copied up to the caller's capacity")
			require.Same(t, &short[0], &ee.ErrData[0], "into the caller's buffer")
		}
		if i < n {
			_, err := c.Read(ents)
			require.ErrorIs(t, err, cq.ErrAvail, "the next error is at the head")
		}
	}
	require.ErrorIs(t, c.ReadErr(&cq.ErrEntry{}), cq.ErrAgain, "a success at the head is not an error")

	hdr := s.caps.FrameHeader
	next := n + 1
	after := posted - 1 - n // receives, and sends, after the oversized frame
	for _, e := range readN(t, c, after+after-sends) {
		if e.Flags&cq.FlagSend != 0 {
			continue
		}
		require.Equal(t, next, e.Context, "receives after the errors, in order")
		require.Equal(t, hdr+64, e.Len)
		require.Equal(t, bufAddr(bufs[next]), e.Buf)
		require.Equal(t, payload(next), bufs[next][hdr:hdr+64])
		next++
	}
	require.Equal(t, posted, next, "every receive completed")
	_, err = c.Read(ents)
	require.ErrorIs(t, err, cq.ErrAgain)
}

// testTruncation: a frame longer than the receive buffer is an ETRUNC
// error completion with the overflow in OLen.
func (s *suite) testTruncation(t *testing.T) {
	s.skipUnless(t, s.caps.Truncation, "Truncation", "provider cannot truncate")
	c := s.open(t, cq.Attr{Format: cq.FormatData})
	ep := s.endpoint(t, c, EndpointAttr{})
	buf, err := ep.PostRecv("small", 16, RecvOpts{})
	require.NoError(t, err)
	send(t, ep, "tx", make([]byte, 100), SendOpts{})
	flush(t, ep)
	ents := make([]cq.Entry, 4)
	_, err = c.Read(ents)
	require.ErrorIs(t, err, cq.ErrAvail)
	var ee cq.ErrEntry
	require.NoError(t, c.ReadErr(&ee))
	require.Equal(t, "small", ee.Context)
	require.Equal(t, cq.ETRUNC, ee.Err)
	require.True(t, errors.Is(ee.Err, cq.ETRUNC))
	require.Equal(t, 16, ee.Len)
	require.Equal(t, 84, ee.OLen)
	require.Equal(t, bufAddr(buf), ee.Buf)
	require.Equal(t, "tx", readN(t, c, 1)[0].Context)
}

func (s *suite) testMultiRecv(t *testing.T) {
	s.skipUnless(t, s.caps.MultiRecv, "MultiRecv", "provider has no multi-receive buffers")
	c := s.open(t, cq.Attr{Format: cq.FormatData})
	ep := s.endpoint(t, c, EndpointAttr{})
	buf, err := ep.PostRecv("multi", 4096, RecvOpts{MultiRecv: true, MinFree: 1500})
	require.NoError(t, err)
	for i := 0; i < 3; i++ {
		send(t, ep, i, make([]byte, 1000), SendOpts{})
	}
	flush(t, ep)
	var rx []cq.Entry
	for _, e := range readN(t, c, 6) {
		if e.Context == "multi" {
			rx = append(rx, e)
		}
	}
	require.Len(t, rx, 3)
	base := bufAddr(buf)
	for i, e := range rx {
		require.Equal(t, 1000, e.Len)
		require.GreaterOrEqual(t, e.Buf, base+uintptr(i)*1000, "each message at its own place")
		require.LessOrEqual(t, e.Buf+1000, base+4096)
		if i < 2 {
			require.Zero(t, e.Flags&cq.FlagMultiRecv)
			require.Less(t, e.Buf, rx[i+1].Buf)
		}
	}
	require.Equal(t, base, rx[0].Buf)
	require.NotZero(t, rx[2].Flags&cq.FlagMultiRecv, "the last message releases the buffer")
	require.NotZero(t, rx[2].Flags&cq.FlagRecv)
}

// testSReadTimeout: an SRead on an empty CQ returns ErrTimeout after its
// timeout, within 25%.
func (s *suite) testSReadTimeout(t *testing.T) {
	c := s.open(t, cq.Attr{WaitObj: cq.WaitFD})
	s.endpoint(t, c, EndpointAttr{})
	const timeout = 200 * time.Millisecond
	var el time.Duration
	for attempt := 0; attempt < 3; attempt++ { // a loaded 2-core box may be late once
		start := time.Now()
		_, err := c.SRead(context.Background(), make([]cq.Entry, 1), 0, timeout)
		el = time.Since(start)
		require.ErrorIs(t, err, cq.ErrTimeout)
		require.ErrorIs(t, err, cq.ErrAgain)
		require.GreaterOrEqual(t, el, timeout, "never early")
		if el <= timeout*5/4 {
			return
		}
	}
	t.Fatalf("SRead(%v) took %v", timeout, el)
}

func (s *suite) testSReadImmediate(t *testing.T) {
	c := s.open(t, cq.Attr{WaitObj: cq.WaitFD, Format: cq.FormatContext})
	ep := s.endpoint(t, c, EndpointAttr{})
	send(t, ep, "ready", []byte("x"), SendOpts{})
	flush(t, ep)
	start := time.Now()
	ents := make([]cq.Entry, 4)
	n, err := c.SRead(context.Background(), ents, 0, waitLong)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	// At once, against a 10 s timeout: a second leaves room for a loaded
	// machine or an emulated guest.
	require.Less(t, time.Since(start), time.Second, "queued entries return at once")
}

func (s *suite) testSReadWakes(t *testing.T) {
	c := s.open(t, cq.Attr{WaitObj: cq.WaitFD, Format: cq.FormatContext})
	ep := s.endpoint(t, c, EndpointAttr{})
	for i := 0; i < 20; i++ {
		go func() {
			time.Sleep(5 * time.Millisecond)
			_ = ep.Send(i, []byte("x"), SendOpts{})
		}()
		ents := make([]cq.Entry, 1)
		n, err := c.SRead(context.Background(), ents, 0, -1)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Equal(t, i, ents[0].Context)
	}
}

// testSReadWaitObjects: SRead blocks and wakes with every wait object that
// supports it.
func (s *suite) testSReadWaitObjects(t *testing.T) {
	for _, w := range []cq.WaitObj{cq.WaitUnspec, cq.WaitFD, cq.WaitMutexCond, cq.WaitYield} {
		t.Run(w.String(), func(t *testing.T) {
			c := s.open(t, cq.Attr{WaitObj: w, Format: cq.FormatContext})
			ep := s.endpoint(t, c, EndpointAttr{})
			go func() {
				time.Sleep(20 * time.Millisecond)
				_ = ep.Send("w", []byte("x"), SendOpts{})
			}()
			ents := make([]cq.Entry, 1)
			n, err := c.SRead(context.Background(), ents, 0, waitLong)
			require.NoError(t, err)
			require.Equal(t, 1, n)
			fd, err := c.WaitFD()
			if w == cq.WaitFD || w == cq.WaitUnspec {
				require.NoError(t, err)
				require.GreaterOrEqual(t, fd, 0)
			} else {
				require.ErrorIs(t, err, cq.ErrNoData, "%v has no descriptor", w)
			}
		})
	}
}

func (s *suite) testSReadNoWait(t *testing.T) {
	c := s.open(t, cq.Attr{WaitObj: cq.WaitNone})
	_, err := c.SRead(context.Background(), make([]cq.Entry, 1), 0, time.Second)
	require.ErrorIs(t, err, cq.ErrNotSupported)
	require.ErrorIs(t, err, cq.ErrNoWait)
	require.ErrorIs(t, c.Signal(), cq.ErrNotSupported)
	_, err = c.WaitFD()
	require.ErrorIs(t, err, cq.ErrNoData)
	require.Error(t, c.TryWait())
}

// testSignalBefore: a Signal with no reader is remembered by the next SRead
// and consumed by it.
func (s *suite) testSignalBefore(t *testing.T) {
	c := s.open(t, cq.Attr{WaitObj: cq.WaitFD})
	s.endpoint(t, c, EndpointAttr{})
	require.NoError(t, c.Signal())
	start := time.Now()
	_, err := c.SRead(context.Background(), make([]cq.Entry, 1), 0, -1)
	require.ErrorIs(t, err, cq.ErrAgain)
	require.ErrorIs(t, err, cq.ErrSignaled)
	require.Less(t, time.Since(start), time.Second)
	_, err = c.SRead(context.Background(), make([]cq.Entry, 1), 0, 30*time.Millisecond)
	require.ErrorIs(t, err, cq.ErrTimeout, "the signal was consumed")
}

func (s *suite) testSignalDuring(t *testing.T) {
	for _, w := range []cq.WaitObj{cq.WaitFD, cq.WaitYield} {
		t.Run(w.String(), func(t *testing.T) {
			c := s.open(t, cq.Attr{WaitObj: w})
			s.endpoint(t, c, EndpointAttr{})
			done := make(chan error, 1)
			go func() {
				_, err := c.SRead(context.Background(), make([]cq.Entry, 1), 0, -1)
				done <- err
			}()
			time.Sleep(50 * time.Millisecond)
			select {
			case err := <-done:
				t.Fatalf("SRead returned before the signal: %v", err)
			default:
			}
			require.NoError(t, c.Signal())
			select {
			case err := <-done:
				require.ErrorIs(t, err, cq.ErrAgain)
			case <-time.After(waitLong):
				t.Fatal("Signal did not wake SRead")
			}
		})
	}
}

func (s *suite) testSReadCancel(t *testing.T) {
	c := s.open(t, cq.Attr{WaitObj: cq.WaitFD})
	s.endpoint(t, c, EndpointAttr{})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := c.SRead(ctx, make([]cq.Entry, 1), 0, -1)
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

// testThreshold: with CondThreshold, SRead waits for cond entries; at its
// timeout it returns what is there.
func (s *suite) testThreshold(t *testing.T) {
	c := s.open(t, cq.Attr{WaitObj: cq.WaitFD, WaitCond: cq.CondThreshold, Format: cq.FormatContext})
	ep := s.endpoint(t, c, EndpointAttr{})
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	ents := make([]cq.Entry, 8)
	go func() {
		n, err := c.SRead(context.Background(), ents, 4, waitLong)
		done <- result{n, err}
	}()
	send(t, ep, 0, []byte("x"), SendOpts{})
	send(t, ep, 1, []byte("x"), SendOpts{})
	flush(t, ep)
	select {
	case r := <-done:
		t.Fatalf("SRead returned with %d entries before its threshold of 4: %v", r.n, r.err)
	case <-time.After(100 * time.Millisecond):
	}
	send(t, ep, 2, []byte("x"), SendOpts{})
	send(t, ep, 3, []byte("x"), SendOpts{})
	// The fourth entry must wake the reader, not its timeout (waitLong):
	// a device that arms its interrupt for the entries already queued
	// rather than for the threshold never interrupts again.
	var r result
	select {
	case r = <-done:
	case <-time.After(waitLong / 3):
		// What the CQ holds tells a lost wake-up (4 queued) from a
		// device that has not completed the sends.
		t.Fatalf("SRead with a threshold of 4 still blocked %v after the fourth entry was sent, with %d entries queued",
			waitLong/3, c.Driver().Pending(len(ents)))
	}
	require.NoError(t, r.err)
	require.Equal(t, 4, r.n)

	send(t, ep, 4, []byte("x"), SendOpts{})
	flush(t, ep)
	start := time.Now()
	n, err := c.SRead(context.Background(), ents, 4, 100*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, 1, n, "at the timeout, what is queued")
	require.GreaterOrEqual(t, time.Since(start), 100*time.Millisecond)

	// Without CondThreshold, cond is ignored.
	c2 := s.open(t, cq.Attr{WaitObj: cq.WaitFD, Format: cq.FormatContext})
	ep2 := s.endpoint(t, c2, EndpointAttr{})
	send(t, ep2, 0, []byte("x"), SendOpts{})
	n, err = c2.SRead(context.Background(), ents, 4, waitLong)
	require.NoError(t, err)
	require.Equal(t, 1, n)
}

func pollFD(t *testing.T, fd int, timeout time.Duration) bool {
	t.Helper()
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	deadline := time.Now().Add(timeout)
	for {
		// A negative timeout would block for good: a slow guest can be
		// more than a millisecond past a zero timeout's deadline here.
		ms := max(int(time.Until(deadline).Milliseconds()), 0)
		n, err := unix.Poll(pfd, ms)
		if err == unix.EINTR {
			continue
		}
		require.NoError(t, err)
		return n == 1 && pfd[0].Revents&unix.POLLIN != 0
	}
}

// testWaitFD: the descriptor works with poll and epoll and is readable
// exactly when entries are queued (TryWait before blocking, as fi_trywait).
func (s *suite) testWaitFD(t *testing.T) {
	c := s.open(t, cq.Attr{WaitObj: cq.WaitFD, Format: cq.FormatContext})
	ep := s.endpoint(t, c, EndpointAttr{})
	fd, err := c.WaitFD()
	require.NoError(t, err)

	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	require.NoError(t, err)
	defer unix.Close(epfd)
	require.NoError(t, unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}))
	events := make([]unix.EpollEvent, 1)

	for round := 0; round < 3; round++ {
		require.NoError(t, c.TryWait(), "round %d: nothing queued", round)
		require.False(t, pollFD(t, fd, 0), "round %d: not readable while empty", round)
		n, err := unix.EpollWait(epfd, events, 0)
		require.NoError(t, err)
		require.Zero(t, n)

		send(t, ep, round, []byte("x"), SendOpts{})
		require.True(t, pollFD(t, fd, waitLong), "round %d: readable once an entry is queued", round)
		n, err = unix.EpollWait(epfd, events, 1000)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.ErrorIs(t, c.TryWait(), cq.ErrAgain, "round %d: entries are queued", round)
		require.Equal(t, round, readN(t, c, 1)[0].Context)
	}
	require.NoError(t, c.TryWait())
	require.False(t, pollFD(t, fd, 20*time.Millisecond))

	for _, w := range []cq.WaitObj{cq.WaitNone, cq.WaitYield, cq.WaitMutexCond} {
		c := s.open(t, cq.Attr{WaitObj: w})
		_, err := c.WaitFD()
		require.ErrorIs(t, err, cq.ErrNoData, "%v", w)
	}
}

// testOverrun: a CQ that overflows returns its valid entries, then
// ErrOverrun for good.
func (s *suite) testOverrun(t *testing.T) {
	s.skipUnless(t, s.caps.Overrun, "Overrun", "the device cannot overrun a CQ")
	c := s.open(t, cq.Attr{Size: 8, WaitObj: cq.WaitFD, Format: cq.FormatContext})
	size := c.Attr().Size
	ep := s.endpoint(t, c, EndpointAttr{SendDepth: 4 * size})
	for i := 0; i < 2*size; i++ {
		send(t, ep, i, []byte("x"), SendOpts{})
	}
	flush(t, ep)
	got := 0
	ents := make([]cq.Entry, 3)
	for {
		n, err := c.Read(ents)
		if err != nil {
			require.ErrorIs(t, err, cq.ErrOverrun)
			break
		}
		for _, e := range ents[:n] {
			require.Equal(t, got, e.Context, "valid entries in order")
			got++
		}
	}
	require.Equal(t, size, got, "every valid entry drains before the overrun")
	for i := 0; i < 3; i++ {
		_, err := c.Read(ents)
		require.ErrorIs(t, err, cq.ErrOverrun, "overrun is fatal")
	}
	_, err := c.SRead(context.Background(), ents, 0, time.Second)
	require.ErrorIs(t, err, cq.ErrOverrun)
	require.ErrorIs(t, c.ReadErr(&cq.ErrEntry{}), cq.ErrOverrun)
	require.Equal(t, cq.EOVERRUN, cq.ErrnoOf(err))
}

func (s *suite) testCloseBound(t *testing.T) {
	c, err := s.p.OpenCQ(cq.Attr{WaitObj: cq.WaitFD})
	require.NoError(t, err)
	ep, err := s.p.NewEndpoint(c, EndpointAttr{})
	require.NoError(t, err)
	require.ErrorIs(t, c.Close(), cq.ErrBusy)
	send(t, ep, "still works", []byte("x"), SendOpts{})
	require.Equal(t, "still works", readN(t, c, 1)[0].Context, "a refused Close leaves the CQ usable")
	require.NoError(t, ep.Close())
	require.NoError(t, c.Close())
	require.NoError(t, c.Close())
	_, err = c.Read(make([]cq.Entry, 1))
	require.ErrorIs(t, err, cq.ErrClosed)
	require.ErrorIs(t, c.ReadErr(&cq.ErrEntry{}), cq.ErrClosed)
	_, err = c.SRead(context.Background(), make([]cq.Entry, 1), 0, time.Second)
	require.ErrorIs(t, err, cq.ErrClosed)
	require.ErrorIs(t, c.Signal(), cq.ErrClosed)
	_, err = c.WaitFD()
	require.ErrorIs(t, err, cq.ErrClosed)
	_, err = s.p.NewEndpoint(c, EndpointAttr{})
	require.Error(t, err, "no endpoint binds to a closed CQ")
}

func (s *suite) testCloseWakesSRead(t *testing.T) {
	c, err := s.p.OpenCQ(cq.Attr{WaitObj: cq.WaitFD})
	require.NoError(t, err)
	ep, err := s.p.NewEndpoint(c, EndpointAttr{})
	require.NoError(t, err)
	done := make(chan error, 2)
	for i := 0; i < 2; i++ { // a leader on the eventfd and a follower
		go func() {
			_, err := c.SRead(context.Background(), make([]cq.Entry, 1), 0, -1)
			done <- err
		}()
	}
	time.Sleep(50 * time.Millisecond)
	require.NoError(t, ep.Close())
	require.NoError(t, c.Close())
	for i := 0; i < 2; i++ {
		select {
		case err := <-done:
			require.ErrorIs(t, err, cq.ErrClosed)
		case <-time.After(waitLong):
			t.Fatal("Close did not wake SRead")
		}
	}
}

func (s *suite) testSingleThreaded(t *testing.T) {
	c := s.open(t, cq.Attr{SingleThreaded: true, WaitObj: cq.WaitFD, Format: cq.FormatContext})
	ep := s.endpoint(t, c, EndpointAttr{})
	for i := 0; i < 50; i++ {
		send(t, ep, i, []byte("x"), SendOpts{})
	}
	got := 0
	ents := make([]cq.Entry, 7)
	for got < 50 {
		n, err := c.SRead(context.Background(), ents, 0, waitLong)
		require.NoError(t, err)
		for _, e := range ents[:n] {
			require.Equal(t, got, e.Context)
			got++
		}
	}
}

// testConcurrent: readers and writers at once, no completion lost or
// duplicated (run it under -race).
func (s *suite) testConcurrent(t *testing.T) {
	const writers, readers, perWriter = 2, 4, 3000
	c := s.open(t, cq.Attr{Size: 4096, Format: cq.FormatMsg})
	eps := make([]Endpoint, writers)
	for i := range eps {
		eps[i] = s.endpoint(t, c, EndpointAttr{SendDepth: 256})
	}
	total := writers * perWriter
	seen := make([]atomic.Int32, total)
	var got atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, readers+writers)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			payload := []byte("concurrent")
			for i := 0; i < perWriter; i++ {
				for {
					err := eps[w].Send(w*perWriter+i, payload, SendOpts{})
					if err == nil {
						break
					}
					if !errors.Is(err, cq.ErrAgain) {
						errs <- err
						return
					}
					runtime.Gosched()
				}
			}
		}()
	}
	deadline := time.Now().Add(30 * time.Second)
	for r := 0; r < readers; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ents := make([]cq.Entry, 1+r*5)
			for got.Load() < int64(total) {
				if time.Now().After(deadline) {
					errs <- fmt.Errorf("reader %d timed out at %d of %d", r, got.Load(), total)
					return
				}
				n, err := c.Read(ents)
				if err != nil {
					if !errors.Is(err, cq.ErrAgain) {
						errs <- err
						return
					}
					runtime.Gosched()
					continue
				}
				for _, e := range ents[:n] {
					seen[e.Context.(int)].Add(1)
					if e.Flags != cq.FlagSend|cq.FlagMsg {
						errs <- fmt.Errorf("flags %v", e.Flags)
					}
				}
				got.Add(int64(n))
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for i := range seen {
		require.EqualValues(t, 1, seen[i].Load(), "completion %d", i)
	}
}

// testConcurrentSRead: several goroutines blocked in SRead at once share
// the wake-ups; every completion is read once.
func (s *suite) testConcurrentSRead(t *testing.T) {
	const total = 1000
	c := s.open(t, cq.Attr{Size: 2048, WaitObj: cq.WaitFD, Format: cq.FormatContext})
	ep := s.endpoint(t, c, EndpointAttr{SendDepth: 256})
	seen := make([]atomic.Int32, total)
	var got atomic.Int64
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for r := 0; r < 4; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ents := make([]cq.Entry, 4)
			for got.Load() < total && ctx.Err() == nil {
				n, err := c.SRead(ctx, ents, 0, 20*time.Millisecond)
				if err != nil {
					continue
				}
				for _, e := range ents[:n] {
					seen[e.Context.(int)].Add(1)
				}
				got.Add(int64(n))
			}
		}()
	}
	for i := 0; i < total; i++ {
		send(t, ep, i, []byte("x"), SendOpts{})
		if i%50 == 0 {
			time.Sleep(time.Millisecond) // let the readers park
		}
	}
	wg.Wait()
	require.NoError(t, ctx.Err())
	for i := range seen {
		require.EqualValues(t, 1, seen[i].Load(), "completion %d", i)
	}
}

// testNoAllocs: Read, ReadFrom and ReadErr allocate nothing, with the
// device producing meanwhile (testing.AllocsPerRun counts every goroutine's
// allocations, so the feeder and the device loop must not allocate either),
// and again on a CQ the device filled before.
func (s *suite) testNoAllocs(t *testing.T) {
	c := s.open(t, cq.Attr{Size: 4096, Format: cq.FormatTagged, WaitObj: cq.WaitFD})
	ep := s.endpoint(t, c, EndpointAttr{SendDepth: 1024})
	ctxs := make([]any, 1024)
	for i := range ctxs {
		ctxs[i] = i
	}
	payload := []byte("alloc-free")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the device keeps producing
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if ep.Send(ctxs[i%len(ctxs)], payload, SendOpts{}) != nil {
				runtime.Gosched()
			}
		}
	}()
	ents := make([]cq.Entry, 8)
	addrs := make([]cq.Addr, 8)
	// Each run polls until it gets completions, so every measured call
	// overlaps the device's production (empty polls allocate nothing
	// either).
	var read int
	readAllocs := testing.AllocsPerRun(1000, func() {
		for {
			n, _ := c.Read(ents)
			if n > 0 {
				read += n
				return
			}
		}
	})
	fromAllocs := testing.AllocsPerRun(1000, func() {
		for {
			n, _ := c.ReadFrom(ents, addrs)
			if n > 0 {
				read += n
				return
			}
		}
	})
	close(stop)
	wg.Wait()
	require.GreaterOrEqual(t, read, 2000, "the reads saw the device's completions")
	if raceEnabled {
		t.Logf("race build: %v allocs per Read, %v per ReadFrom with the device producing (not asserted)", readAllocs, fromAllocs)
	} else {
		require.Zero(t, readAllocs, "Read with the device producing")
		require.Zero(t, fromAllocs, "ReadFrom with the device producing")
	}

	// The same on completions the device wrote before: nothing else runs.
	// The feeder's last sends complete first, so that a device whose
	// send slots free only as completions are read has all of them.
	flush(t, ep)
	for {
		if _, err := c.Read(ents); err != nil {
			break
		}
	}
	queued := 1000
	if s.caps.MaxInFlight > 0 {
		queued = min(queued, s.caps.MaxInFlight)
	}
	for i := 0; i < queued; i++ {
		send(t, ep, ctxs[i], payload, SendOpts{})
	}
	flush(t, ep)
	require.Zero(t, testing.AllocsPerRun(50, func() { _, _ = c.Read(ents) }), "Read")
	require.Zero(t, testing.AllocsPerRun(50, func() { _, _ = c.ReadFrom(ents, addrs) }), "ReadFrom")
	for {
		if _, err := c.Read(ents); err != nil {
			break
		}
	}
	if s.caps.NoFailNext {
		t.Logf("ReadErr not measured: the device cannot fail an operation on demand (%s)", s.caps.Why["FailNext"])
		return
	}
	for i := 0; i < min(200, queued); i++ {
		require.NoError(t, ep.FailNext())
		send(t, ep, ctxs[i], payload, SendOpts{})
	}
	flush(t, ep)
	var ee cq.ErrEntry
	buf := make([]byte, 16)
	errAllocs := testing.AllocsPerRun(50, func() {
		ee.ErrData = buf
		_ = c.ReadErr(&ee)
		ee.ErrData = nil
		_ = c.ReadErr(&ee)
	})
	require.Zero(t, errAllocs, "ReadErr")
	require.Equal(t, cq.EIO, ee.Err, "ReadErr read error entries")
}

// testFaults: each injected fault gives an error completion or a clear
// error, with no panic and no good completion lost.
func (s *suite) testFaults(t *testing.T) {
	inj, ok := s.p.(Injector)
	s.skipUnless(t, ok, "Faults", "provider cannot inject faults")
	entryFaults := []struct {
		f       qpsim.FaultKind
		context bool // the error entry carries the operation's context
		prov    cq.ProvErrno
	}{
		{qpsim.FaultBadID, false, cq.ProvBadID},
		{qpsim.FaultDuplicateID, false, cq.ProvBadID},
		{qpsim.FaultBadLen, true, cq.ProvBadLen},
		{qpsim.FaultBadStatus, true, cq.ProvBadStatus},
		{qpsim.FaultBadOpcode, true, cq.ProvBadOpcode},
		{qpsim.FaultWrongOpcode, true, cq.ProvBadOp},
		{qpsim.FaultWrongPhase, false, cq.ProvBadPhase},
	}
	for _, tc := range entryFaults {
		t.Run(tc.f.String(), func(t *testing.T) {
			c := s.open(t, cq.Attr{Format: cq.FormatMsg, Size: 64})
			ep := s.endpoint(t, c, EndpointAttr{})
			send(t, ep, "before", []byte("x"), SendOpts{})
			require.Equal(t, "before", readN(t, c, 1)[0].Context)
			require.NoError(t, inj.Inject(c, tc.f))
			send(t, ep, "victim", []byte("x"), SendOpts{})
			send(t, ep, "after", []byte("x"), SendOpts{})
			flush(t, ep)
			good := map[any]int{}
			errs := 0
			ents := make([]cq.Entry, 4)
			deadline := time.Now().Add(waitLong)
			for len(good) < 2 && time.Now().Before(deadline) {
				n, err := c.Read(ents)
				switch {
				case err == nil:
					for _, e := range ents[:n] {
						good[e.Context]++
					}
				case errors.Is(err, cq.ErrAvail):
					var ee cq.ErrEntry
					require.NoError(t, c.ReadErr(&ee))
					require.Equal(t, tc.prov, ee.ProvErrno, "%v", tc.f)
					require.NotEmpty(t, c.StrError(ee.ProvErrno, ee.ErrData))
					if tc.context {
						require.Equal(t, "victim", ee.Context, "the error reports the operation")
						good["victim"] = 0
					} else {
						require.Nil(t, ee.Context, "a refused entry is tied to no operation")
					}
					errs++
				default:
					require.ErrorIs(t, err, cq.ErrAgain)
					time.Sleep(20 * time.Microsecond)
				}
			}
			require.Equal(t, 1, errs, "exactly one error completion")
			if tc.context {
				require.Equal(t, map[any]int{"victim": 0, "after": 1}, good)
			} else {
				require.Equal(t, map[any]int{"victim": 1, "after": 1}, good, "no good completion lost or doubled")
			}
			_, err := c.Read(ents)
			require.ErrorIs(t, err, cq.ErrAgain)
		})
	}

	t.Run("Overrun", func(t *testing.T) {
		c := s.open(t, cq.Attr{Format: cq.FormatContext, WaitObj: cq.WaitFD})
		ep := s.endpoint(t, c, EndpointAttr{})
		send(t, ep, "kept", []byte("x"), SendOpts{})
		flush(t, ep)
		require.NoError(t, inj.Inject(c, qpsim.FaultOverrun))
		send(t, ep, "dropped", []byte("x"), SendOpts{})
		flush(t, ep)
		require.Equal(t, "kept", readN(t, c, 1)[0].Context)
		_, err := c.Read(make([]cq.Entry, 1))
		require.ErrorIs(t, err, cq.ErrOverrun)
		_, err = c.SRead(context.Background(), make([]cq.Entry, 1), 0, time.Second)
		require.ErrorIs(t, err, cq.ErrOverrun)
	})

	t.Run("OverrunWakesSRead", func(t *testing.T) {
		c := s.open(t, cq.Attr{Format: cq.FormatContext, WaitObj: cq.WaitFD})
		s.endpoint(t, c, EndpointAttr{})
		go func() {
			time.Sleep(50 * time.Millisecond)
			_ = inj.Inject(c, qpsim.FaultOverrun)
		}()
		_, err := c.SRead(context.Background(), make([]cq.Entry, 1), 0, waitLong)
		require.ErrorIs(t, err, cq.ErrOverrun)
	})

	t.Run("LostIRQ", func(t *testing.T) {
		c := s.open(t, cq.Attr{Format: cq.FormatContext, WaitObj: cq.WaitFD})
		ep := s.endpoint(t, c, EndpointAttr{})
		require.NoError(t, inj.Inject(c, qpsim.FaultLostIRQ))
		go func() {
			time.Sleep(30 * time.Millisecond)
			_ = ep.Send("late", []byte("x"), SendOpts{})
		}()
		const timeout = 300 * time.Millisecond
		ents := make([]cq.Entry, 1)
		n, err := c.SRead(context.Background(), ents, 0, timeout)
		require.NoError(t, err, "the last poll at the timeout finds the entry")
		require.Equal(t, 1, n)
		require.Equal(t, "late", ents[0].Context)
	})

	t.Run("SpuriousIRQ", func(t *testing.T) {
		c := s.open(t, cq.Attr{WaitObj: cq.WaitFD})
		s.endpoint(t, c, EndpointAttr{})
		const timeout = 300 * time.Millisecond
		var el time.Duration
		for attempt := 0; attempt < 3; attempt++ {
			go func() {
				time.Sleep(100 * time.Millisecond)
				_ = inj.Inject(c, qpsim.FaultSpuriousIRQ)
			}()
			start := time.Now()
			_, err := c.SRead(context.Background(), make([]cq.Entry, 1), 0, timeout)
			el = time.Since(start)
			require.ErrorIs(t, err, cq.ErrTimeout, "a spurious wake-up is not a completion")
			require.GreaterOrEqual(t, el, timeout, "the timeout counts down across the wake-up, not restarted short")
			if el <= timeout*5/4 {
				return
			}
		}
		t.Fatalf("SRead(%v) with a spurious wake-up took %v: the timeout restarted", timeout, el)
	})
}
