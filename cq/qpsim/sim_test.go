package qpsim

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/dma"
)

func newDev(t *testing.T) *Device {
	d, err := New(Config{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, d.Close()) })
	return d
}

func readN(t *testing.T, c *cq.CQ, n int) []cq.Entry {
	t.Helper()
	var out []cq.Entry
	ents := make([]cq.Entry, n)
	deadline := time.Now().Add(5 * time.Second)
	for len(out) < n {
		k, err := c.Read(ents[:n-len(out)])
		if err == nil {
			out = append(out, ents[:k]...)
			continue
		}
		require.ErrorIs(t, err, cq.ErrAgain)
		require.True(t, time.Now().Before(deadline), "got %d of %d completions", len(out), n)
		time.Sleep(50 * time.Microsecond)
	}
	return out
}

func TestLoopback(t *testing.T) {
	d := newDev(t)
	c, err := d.OpenCQ(cq.Attr{Format: cq.FormatTagged, Size: 64})
	require.NoError(t, err)
	q, err := d.NewQP(QPConfig{SendCQ: c, RecvCQ: c, Source: true})
	require.NoError(t, err)
	mem, err := d.Alloc(4096)
	require.NoError(t, err)
	buf := mem.Bytes()[:1024]
	require.NoError(t, q.PostRecv("rx", buf, RecvOpts{}))
	require.NoError(t, q.Send(q.Addr(), "tx", []byte("hello"), SendOpts{HasData: true, Data: 7, Tagged: true, Tag: 9}))
	ents := readN(t, c, 2)
	require.Equal(t, "rx", ents[0].Context, "the device writes the receive first")
	require.Equal(t, cq.FlagRecv|cq.FlagTagged|cq.FlagRemoteCQData, ents[0].Flags)
	require.Equal(t, 5, ents[0].Len)
	require.EqualValues(t, 7, ents[0].Data)
	require.EqualValues(t, 9, ents[0].Tag)
	require.Equal(t, "hello", string(buf[:5]))
	require.Equal(t, "tx", ents[1].Context)
	require.Equal(t, cq.FlagSend|cq.FlagTagged, ents[1].Flags)
	require.EqualValues(t, 1, d.Stats().Delivered)
	require.ErrorIs(t, c.Close(), cq.ErrBusy)
	require.NoError(t, q.Close())
	require.NoError(t, c.Close())
}

func TestCQELayoutInMemory(t *testing.T) {
	// The entry the device writes is the documented 64-byte layout.
	d := newDev(t)
	c, err := d.OpenCQ(cq.Attr{Size: 4})
	require.NoError(t, err)
	q, err := d.NewQP(QPConfig{SendCQ: c, RecvCQ: c})
	require.NoError(t, err)
	defer q.Close()
	require.NoError(t, q.Send(99, "x", make([]byte, 33), SendOpts{}))
	require.NoError(t, q.Flush(context.Background()))
	d.mu.Lock()
	dc := d.cqs[c]
	e := append([]byte(nil), dc.ring[:64]...)
	d.mu.Unlock()
	require.EqualValues(t, 2*q.num, binary.LittleEndian.Uint16(e[4:]))
	require.EqualValues(t, OpSend, e[6])
	require.EqualValues(t, StatusOK, e[7])
	require.EqualValues(t, 33, binary.LittleEndian.Uint32(e[8:]))
	require.EqualValues(t, uint32(1)<<31, binary.LittleEndian.Uint32(e[60:]), "phase 1 on the first lap")
	require.Equal(t, make([]byte, 12), e[48:60])
	require.EqualValues(t, 1, d.Stats().RxDropped, "no QP at address 99")
}

func countFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents)
}

// lockedKB is the process's locked memory: the device's DMA memory is
// locked 4K pages, so a leaked mapping shows here (the runtime's own new
// thread stacks do not).
func lockedKB(t *testing.T) string {
	b, err := os.ReadFile("/proc/self/status")
	require.NoError(t, err)
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmLck:") {
			return strings.TrimSpace(strings.TrimPrefix(l, "VmLck:"))
		}
	}
	t.Fatal("no VmLck in /proc/self/status")
	return ""
}

func TestCloseReleasesEverything(t *testing.T) {
	// A first device makes the runtime start the OS threads it keeps (their
	// stacks are mappings), so the baseline is taken after it.
	warm, err := New(Config{})
	require.NoError(t, err)
	require.NoError(t, warm.Close())
	fds, locked, gs := countFDs(t), lockedKB(t), runtime.NumGoroutine()
	for i := 0; i < 3; i++ {
		d, err := New(Config{})
		require.NoError(t, err)
		c1, err := d.OpenCQ(cq.Attr{WaitObj: cq.WaitFD, Size: 4096})
		require.NoError(t, err)
		c2, err := d.OpenCQ(cq.Attr{})
		require.NoError(t, err)
		q, err := d.NewQP(QPConfig{SendCQ: c1, RecvCQ: c2})
		require.NoError(t, err)
		mem, err := d.Alloc(1 << 16)
		require.NoError(t, err)
		require.NoError(t, q.PostRecv(nil, mem.Bytes()[:128], RecvOpts{}))
		require.NoError(t, q.Send(q.Addr(), nil, []byte("x"), SendOpts{}))
		go func() { _, _ = c1.SRead(context.Background(), make([]cq.Entry, 1), 0, -1) }()
		time.Sleep(10 * time.Millisecond)
		require.NoError(t, d.Close()) // closes the QP, both CQs and the memory
		require.NoError(t, d.Close(), "idempotent")
		_, err = c1.Read(make([]cq.Entry, 1))
		require.ErrorIs(t, err, cq.ErrClosed)
		require.ErrorIs(t, q.Send(q.Addr(), nil, nil, SendOpts{}), ErrClosed)
		_, err = d.OpenCQ(cq.Attr{})
		require.ErrorIs(t, err, ErrClosed)
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > gs && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > gs {
		buf := make([]byte, 1<<16)
		t.Fatalf("%d goroutines left, %d before:\n%s", n, gs, buf[:runtime.Stack(buf, true)])
	}
	require.Equal(t, fds, countFDs(t), "no leaked descriptors")
	require.Equal(t, locked, lockedKB(t), "no leaked DMA mappings")
}

func TestDriverSideErrors(t *testing.T) {
	d := newDev(t)
	c, err := d.OpenCQ(cq.Attr{Size: 8})
	require.NoError(t, err)
	_, err = d.NewQP(QPConfig{SendCQ: c})
	require.ErrorIs(t, err, cq.ErrInvalid)
	_, err = d.NewQP(QPConfig{SendCQ: c, RecvCQ: c, SendSize: MaxQueueSize + 1})
	require.ErrorIs(t, err, cq.ErrInvalid)
	other, err := cq.New(cq.Attr{}, Limits())
	require.NoError(t, err)
	defer other.Close()
	_, err = d.NewQP(QPConfig{SendCQ: c, RecvCQ: other})
	require.ErrorIs(t, err, ErrUnknownCQ)
	require.ErrorIs(t, d.Inject(other, Fault{Kind: FaultOverrun}), ErrUnknownCQ)

	q, err := d.NewQP(QPConfig{SendCQ: c, RecvCQ: c, SendSize: 2, RecvSize: 1})
	require.NoError(t, err)
	defer q.Close()
	require.ErrorIs(t, q.Send(q.Addr(), nil, make([]byte, MaxFrame+1), SendOpts{}), ErrTooBig)
	require.ErrorIs(t, q.PostRecv(nil, make([]byte, 64), RecvOpts{}), ErrBadBuffer, "Go heap memory is not device memory")
	require.ErrorIs(t, q.PostRecv(nil, nil, RecvOpts{}), cq.ErrInvalid)
	mem, err := d.Alloc(4096)
	require.NoError(t, err)
	require.NoError(t, q.PostRecv(1, mem.Bytes()[:64], RecvOpts{}))
	require.ErrorIs(t, q.PostRecv(2, mem.Bytes()[64:128], RecvOpts{}), ErrQueueFull)
	// The send queue holds 2; the table frees an id only when its
	// completion is read.
	require.NoError(t, q.Send(99, 1, nil, SendOpts{}))
	require.NoError(t, q.Send(99, 2, nil, SendOpts{}))
	err = q.Send(99, 3, nil, SendOpts{})
	require.ErrorIs(t, err, ErrQueueFull)
	require.ErrorIs(t, err, cq.ErrAgain)
	readN(t, c, 2)
	require.NoError(t, q.Flush(context.Background()))
	require.NoError(t, q.Send(99, 3, nil, SendOpts{}))
	require.NoError(t, mem.Close())
	require.NoError(t, mem.Close())
}

func TestSourceAddressAndUnknownDestination(t *testing.T) {
	d := newDev(t)
	c, err := d.OpenCQ(cq.Attr{Format: cq.FormatData})
	require.NoError(t, err)
	a, err := d.NewQP(QPConfig{SendCQ: c, RecvCQ: c})
	require.NoError(t, err)
	b, err := d.NewQP(QPConfig{SendCQ: c, RecvCQ: c, Source: true})
	require.NoError(t, err)
	defer a.Close()
	defer b.Close()
	mem, err := d.Alloc(4096)
	require.NoError(t, err)
	require.NoError(t, b.PostRecv("b-rx", mem.Bytes()[:256], RecvOpts{}))
	require.NoError(t, a.Send(b.Addr(), "a-tx", []byte("ab"), SendOpts{}))
	require.NoError(t, a.Send(12345, "lost", []byte("ab"), SendOpts{}))
	require.NoError(t, a.Flush(context.Background()))
	ents := make([]cq.Entry, 4)
	addrs := make([]cq.Addr, 4)
	n, err := c.ReadFrom(ents, addrs)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	require.Equal(t, "b-rx", ents[0].Context)
	require.Equal(t, a.Addr(), addrs[0])
	require.EqualValues(t, b.RecvQueue(), ents[0].Queue)
	require.EqualValues(t, a.SendQueue(), ents[1].Queue)
	require.Equal(t, cq.AddrNotAvail, addrs[1])
	require.EqualValues(t, 1, d.Stats().RxDropped)
}

func TestSolicitedArm(t *testing.T) {
	// The verbs layer's req_notify(solicited_only) reaches the device
	// through cq.Source.Arm: only a solicited or error completion fires.
	d := newDev(t)
	c, err := d.OpenCQ(cq.Attr{WaitObj: cq.WaitFD})
	require.NoError(t, err)
	q, err := d.NewQP(QPConfig{SendCQ: c, RecvCQ: c})
	require.NoError(t, err)
	defer q.Close()
	mem, err := d.Alloc(4096)
	require.NoError(t, err)
	d.mu.Lock()
	src := d.cqs[c].src
	d.mu.Unlock()
	irqs := func() uint64 {
		st, err := d.CQStats(c)
		require.NoError(t, err)
		return st.Interrupts
	}
	require.NoError(t, src.Arm(true, 1))
	require.NoError(t, q.PostRecv(1, mem.Bytes()[:128], RecvOpts{}))
	require.NoError(t, q.Send(q.Addr(), 2, []byte("plain"), SendOpts{}))
	require.NoError(t, q.Flush(context.Background()))
	require.NoError(t, d.Sync(context.Background()))
	require.Zero(t, irqs(), "no interrupt for unsolicited completions")
	require.NoError(t, q.PostRecv(3, mem.Bytes()[128:256], RecvOpts{}))
	require.NoError(t, q.Send(q.Addr(), 4, []byte("urgent"), SendOpts{Solicited: true}))
	require.NoError(t, q.Flush(context.Background()))
	require.NoError(t, d.Sync(context.Background()))
	require.EqualValues(t, 1, irqs(), "a solicited receive fires")
	require.NoError(t, q.Send(q.Addr(), 5, []byte("again"), SendOpts{Solicited: true}))
	require.NoError(t, q.Flush(context.Background()))
	require.NoError(t, d.Sync(context.Background()))
	require.EqualValues(t, 1, irqs(), "one interrupt per arm")

	// An arm with entries already beyond the consumer index fires at once
	// (the arm race closed by the device).
	require.NoError(t, src.Arm(false, 1))
	require.NoError(t, d.Sync(context.Background()))
	require.EqualValues(t, 2, irqs())
	require.NoError(t, src.Arm(false, 10)) // threshold not reached
	require.NoError(t, d.Sync(context.Background()))
	require.EqualValues(t, 2, irqs())
}

func TestOverrunStopsTheDevice(t *testing.T) {
	d := newDev(t)
	c, err := d.OpenCQ(cq.Attr{Size: 4, Format: cq.FormatContext})
	require.NoError(t, err)
	q, err := d.NewQP(QPConfig{SendCQ: c, RecvCQ: c, SendSize: 16})
	require.NoError(t, err)
	defer q.Close()
	for i := 0; i < 10; i++ {
		require.NoError(t, q.Send(99, i, nil, SendOpts{}))
	}
	require.NoError(t, q.Flush(context.Background()))
	st, err := d.CQStats(c)
	require.NoError(t, err)
	require.EqualValues(t, 4, st.Written, "never overwrites an unconsumed entry")
	require.EqualValues(t, 6, st.Dropped)
	require.EqualValues(t, 1, st.Overruns)
	ents := readN(t, c, 4)
	for i, e := range ents {
		require.Equal(t, i, e.Context)
	}
	_, err = c.Read(ents)
	require.ErrorIs(t, err, cq.ErrOverrun)
}

func TestDeviceSleepsWhenIdle(t *testing.T) {
	// A long idle sleep makes the kick's effect unmistakable on a loaded
	// machine: without it the send would wait up to 2 s.
	d, err := New(Config{IdleSleep: 2 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, d.Close()) })
	require.Eventually(t, func() bool { return d.sleeping.Load() == 1 }, 5*time.Second, time.Millisecond,
		"an idle device sleeps instead of spinning")
	asleep := 0
	for i := 0; i < 100; i++ {
		if d.sleeping.Load() == 1 {
			asleep++
		}
		time.Sleep(500 * time.Microsecond)
	}
	require.Greater(t, asleep, 80, "idle, the device sleeps most of the time")
	c, err := d.OpenCQ(cq.Attr{})
	require.NoError(t, err)
	q, err := d.NewQP(QPConfig{SendCQ: c, RecvCQ: c})
	require.NoError(t, err)
	defer q.Close()
	start := time.Now()
	require.NoError(t, q.Send(99, 1, nil, SendOpts{}))
	readN(t, c, 1)
	require.Less(t, time.Since(start), 500*time.Millisecond, "a send kicks the sleeping device")
}

func TestReceiveBuffersFromPool(t *testing.T) {
	d := newDev(t)
	c, err := d.OpenCQ(cq.Attr{Format: cq.FormatData, Size: 64})
	require.NoError(t, err)
	q, err := d.NewQP(QPConfig{SendCQ: c, RecvCQ: c})
	require.NoError(t, err)
	defer q.Close()
	mem, err := d.Alloc(64 << 10)
	require.NoError(t, err)
	pool, err := dma.NewPool(mem.Region(), 16, 2048)
	require.NoError(t, err)
	bufs := map[uintptr]uint32{}
	for i := 0; i < 4; i++ {
		idx, ok := pool.Get()
		require.True(t, ok)
		b := pool.Buf(idx)
		bufs[uintptr(unsafe.Pointer(&b[0]))] = idx
		require.NoError(t, q.PostRecv(idx, b, RecvOpts{}))
	}
	for i := 0; i < 4; i++ {
		require.NoError(t, q.Send(q.Addr(), nil, []byte{byte(i), 1, 2, 3}, SendOpts{}))
	}
	got := 0
	for _, e := range readN(t, c, 8) {
		if e.Flags&cq.FlagRecv == 0 {
			continue
		}
		idx := e.Context.(uint32)
		require.Equal(t, idx, bufs[e.Buf], "Buf is the posted buffer")
		require.Equal(t, []byte{byte(got), 1, 2, 3}, pool.Buf(idx)[:4], "in order")
		require.NoError(t, pool.Put(idx))
		got++
	}
	require.Equal(t, 4, got)
}

// A wrong-phase entry (a hole) is consumed by writing the lap's not-ready
// value back: left as it was, its phase is the next lap's "ready" value and
// the reader, one lap later, would take the stale slot and run ahead of
// the device.
func TestWrongPhaseHoleIsConsumed(t *testing.T) {
	d := newDev(t)
	c, err := d.OpenCQ(cq.Attr{Size: 16, Format: cq.FormatContext})
	require.NoError(t, err)
	q, err := d.NewQP(QPConfig{SendCQ: c, RecvCQ: c, SendSize: 16})
	require.NoError(t, err)
	defer q.Close()
	require.NoError(t, d.Inject(c, Fault{Kind: FaultWrongPhase}))
	const sends, window = 48, 15
	got, errs := 0, 0
	ents := make([]cq.Entry, 16)
	var ee cq.ErrEntry
	for i := 0; i < sends; {
		// Each window leaves the reader exactly where the device will
		// write next, with every entry of the ring read: the slot it then
		// looks at holds the previous lap's entry, the hole among them.
		for ; i < sends && i-got < window; i++ {
			require.NoError(t, q.Send(99, i, nil, SendOpts{}))
		}
		require.NoError(t, q.Flush(context.Background()))
		for {
			n, err := c.Read(ents)
			if errors.Is(err, cq.ErrAvail) {
				require.NoError(t, c.ReadErr(&ee))
				require.Equal(t, cq.ProvBadPhase, ee.ProvErrno, "error %d after %d completions", errs, got)
				errs++
				continue
			}
			if errors.Is(err, cq.ErrAgain) {
				break
			}
			require.NoError(t, err)
			for _, e := range ents[:n] {
				require.Equal(t, got, e.Context, "every completion once, in order")
				got++
			}
		}
		require.Equal(t, i, got, "the reader neither stalls nor runs ahead of the device")
	}
	require.Equal(t, 1, errs, "the hole is reported once, not again a lap later")
	st, err := d.CQStats(c)
	require.NoError(t, err)
	require.Zero(t, st.Overruns)
	require.Zero(t, st.Dropped)
}

// A consumer count ahead of the producer is the driver's error, which the
// device reports as such, not as an overrun.
func TestConsumerAheadIsADriverError(t *testing.T) {
	d := newDev(t)
	c, err := d.OpenCQ(cq.Attr{Size: 4, Format: cq.FormatContext})
	require.NoError(t, err)
	q, err := d.NewQP(QPConfig{SendCQ: c, RecvCQ: c, SendSize: 16})
	require.NoError(t, err)
	defer q.Close()
	for i := 0; i < 4; i++ {
		require.NoError(t, q.Send(99, i, nil, SendOpts{}))
	}
	require.NoError(t, q.Flush(context.Background()))
	d.mu.Lock()
	d.cqs[c].cons.Write(9) // a driver that consumed 9 of the 4 entries written
	d.mu.Unlock()
	require.NoError(t, q.Send(99, 4, nil, SendOpts{}))
	require.NoError(t, q.Flush(context.Background()))
	st, err := d.CQStats(c)
	require.NoError(t, err)
	require.EqualValues(t, 1, st.DriverErrors)
	require.Zero(t, st.Overruns, "not reported as an overrun")
	require.EqualValues(t, 4, st.Written)
	require.EqualValues(t, 1, st.Dropped)
}

// TestCQTakesItsLoop: a CQ of the software device reads its ring with the
// loop made for its entry (cq/ring's gen_fast.go copies Layout's geometry
// as constants), in the CQ's format; a change to CQE or Layout that this
// test catches needs that shape updated.
func TestCQTakesItsLoop(t *testing.T) {
	d := newDev(t)
	for f, name := range map[cq.Format]string{cq.FormatContext: "Context", cq.FormatMsg: "Msg", cq.FormatData: "Data", cq.FormatTagged: "Tagged"} {
		c, err := d.OpenCQ(cq.Attr{Size: 64, Format: f})
		require.NoError(t, err)
		d.mu.Lock()
		loop := d.cqs[c].src.Loop()
		d.mu.Unlock()
		require.Equal(t, "readPhase"+name+"Sim", loop)
		require.NoError(t, c.Close())
	}
}
