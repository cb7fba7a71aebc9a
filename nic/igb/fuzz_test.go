package igb

import (
	"context"
	"errors"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/dma"
	"github.com/vfnic/vfnic/hugepage"
	"github.com/vfnic/vfnic/nic"
)

// fuzzRing is the ring size of the fuzzed queues: small, so that arbitrary
// input covers whole rings, wraps and the full-ring case.
const fuzzRing = 8

// wbEvent is one completion as either API reports it: the posted
// context, the length, and the nic sentinel of an error (-1 for a
// success).
type wbEvent struct {
	ctx   any
	len   int
	class int
}

// wbClasses are the sentinels a refused completion can match; an event
// records the first one its error matches.
var wbClasses = []error{cq.ProvBadID, cq.ProvBadLen, cq.ProvBadPhase, cq.ProvBadIndex,
	cq.ProvMultiBuffer, nic.ErrDeviceFailed, nic.ErrDeviceStatus}

// classOf is the index in wbClasses of the first sentinel err matches, -1
// for nil and len(wbClasses) for an error that matches none.
func classOf(err error) int {
	if err == nil {
		return -1
	}
	for i, s := range wbClasses {
		if errors.Is(err, s) {
			return i
		}
	}
	return len(wbClasses)
}

// wbInput is a fuzz input decoded: buffers to post, the device head
// position they start at, which good receive completions the reader
// keeps lent (bit k%8 for the k-th), and the bytes written over the ring
// from the head on (wrapping).
type wbInput struct {
	posts, head int
	keep        byte
	body        []byte
}

func decodeWB(data []byte) (wbInput, bool) {
	if len(data) < 3 {
		return wbInput{}, false
	}
	return wbInput{posts: int(data[0]) % fuzzRing, head: int(data[1]) % fuzzRing, keep: data[2], body: data[3:]}, true
}

// fuzzSide is one device of a fuzzed pair, read through its queue API or
// through a bound CQ.
type fuzzSide struct {
	d    *Device
	q    *queue
	c    *cq.CQ
	got  []wbEvent
	lent []uintptr // receive buffers the reader kept
	good int       // good completions read
}

// fuzzMAC is the 82576 without the reset's settle delays: the fake
// register file clears CTRL.RST at once, and the 2 ms per reset would be
// most of an exec's time (two devices, each brought up and closed).
var fuzzMAC = func() mac { m := macs[0]; m.rstDelayMs = 0; return m }()

// newFuzzDevice is newFakeDevice with fuzzMAC and the fuzzed queue sizes.
func newFuzzDevice(t *testing.T) (*Device, *fakeRegs) {
	f := newFakeRegs(t)
	cfg := Config{Config: nic.Config{QueueSize: fuzzRing, RxBuffers: 2 * fuzzRing}}
	cfg.Memory = hugepage.Options{PageSize: hugepage.Size4K}
	require.NoError(t, normalize(&cfg))
	d := &Device{name: "fuzz", mac: &fuzzMAC, regs: f, win: f.w, space: dma.NewIdentitySpace(), nVectors: 10}
	if err := d.start(context.Background(), cfg); err != nil {
		_ = d.core.Teardown(nic.ErrClosed, d.hw)
		require.NoError(t, err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d, f
}

// newFuzzSide brings a device up, moves the ring's head to in.head with
// well-behaved traffic read through Poll (so the fuzzed bytes land on a
// ring that has wrapped), binds a CQ if viaCQ, posts in.posts operations
// (receive buffers, or frames to send when tx) and writes in.body over the
// descriptors from the head on.
func newFuzzSide(t *testing.T, in wbInput, tx, viaCQ bool) *fuzzSide {
	d, f := newFuzzDevice(t)
	n := newFakeNIC(t, d, f)
	rx, txq := d.rx[0], d.tx[0]
	s := &fuzzSide{d: d, q: &rx.queue}
	if tx {
		s.q = &txq.queue
	}
	frame := make([]byte, 60)
	out := make([]nic.Completion, fuzzRing)
	if in.head > 0 {
		for i := range in.head {
			if tx {
				require.NoError(t, txq.Send(frame, -1-i))
			} else {
				require.NoError(t, rx.PostRecv(-1-i))
			}
		}
		require.NoError(t, s.q.Flush())
		if tx {
			require.Len(t, n.transmit(), in.head)
		} else {
			for range in.head {
				n.receive(frame)
			}
		}
		require.Equal(t, in.head, s.q.Poll(out))
		for _, c := range out[:in.head] {
			require.NoError(t, c.Err)
			if !tx {
				require.NoError(t, rx.Release(c.Buf))
			}
		}
	}
	if viaCQ {
		c, err := cq.New(cq.Attr{Format: cq.FormatData}, cq.Limits{})
		require.NoError(t, err)
		dir := nic.Recv
		if tx {
			dir = nic.Send
		}
		require.NoError(t, d.BindCQ(c, 0, dir))
		s.c = c
		t.Cleanup(func() { _ = c.Close() })
	}
	for i := range in.posts {
		if tx {
			require.NoError(t, txq.Send(frame, i))
		} else {
			require.NoError(t, rx.PostRecv(i))
		}
	}
	require.NoError(t, s.q.Flush())
	ring := unsafe.Slice((*byte)(unsafe.Pointer(&s.q.desc[0])), len(s.q.desc))
	start := in.head * descSize
	for i, b := range in.body[:min(len(in.body), len(ring))] {
		ring[(start+i)%len(ring)] = b
	}
	return s
}

// keepOrRelease records a good receive completion's buffer as lent, or
// gives it back, as the input says.
func (s *fuzzSide) keepOrRelease(t *testing.T, in wbInput, buf uintptr) {
	rx := (*RxQueue)(unsafe.Pointer(s.q))
	if in.keep>>(s.good%8)&1 != 0 {
		s.lent = append(s.lent, buf)
	} else {
		require.NoError(t, rx.Release(buf))
	}
	s.good++
}

// readPoll reads the side through the queue API until it stays empty.
func (s *fuzzSide) readPoll(t *testing.T, in wbInput) {
	out := make([]nic.Completion, 3)
	for range 4 * fuzzRing {
		n := s.q.Poll(out)
		for _, c := range out[:n] {
			e := wbEvent{ctx: c.Context, len: c.Len, class: classOf(c.Err)}
			s.got = append(s.got, e)
			switch {
			case c.Err != nil:
				require.Nil(t, c.Data, "a refused completion lends no buffer")
				require.Zero(t, c.Buf)
			case s.q.rx:
				require.Len(t, c.Data, c.Len)
				s.keepOrRelease(t, in, c.Buf)
			}
		}
	}
}

// readCQ reads the side through its CQ until it stays empty.
func (s *fuzzSide) readCQ(t *testing.T, in wbInput) {
	ents := make([]cq.Entry, 3)
	var ee cq.ErrEntry
	for range 4 * fuzzRing {
		n, err := s.c.Read(ents)
		for _, e := range ents[:n] {
			s.got = append(s.got, wbEvent{ctx: e.Context, len: e.Len, class: -1})
			if s.q.rx {
				rx := (*RxQueue)(unsafe.Pointer(s.q))
				f, err := rx.Frame(e.Buf, e.Len)
				require.NoError(t, err)
				require.Len(t, f, e.Len)
				s.keepOrRelease(t, in, e.Buf)
			}
		}
		switch {
		case errors.Is(err, cq.ErrAvail):
			require.NoError(t, s.c.ReadErr(&ee))
			cerr := errOf(ee.ProvErrno)
			if code := ee.ProvErrno.Refusal(); code != nil {
				require.ErrorIs(t, cerr, code, "igb's prepared error matches the CQ's code %d", ee.ProvErrno)
			}
			s.got = append(s.got, wbEvent{ctx: ee.Context, len: ee.Len, class: classOf(cerr)})
		case err == nil, errors.Is(err, cq.ErrAgain):
		default:
			require.NoError(t, err)
		}
	}
}

// accounted checks that every operation is in exactly one place: for a
// receive queue each pool buffer free, posted or lent to the reader (and
// the lent ones exactly those the reader kept), and the posted-operation
// table, the queue's count and the posted buffers agreeing.
func (s *fuzzSide) accounted(t *testing.T, posts int) {
	q := s.q
	out := q.Outstanding()
	require.LessOrEqual(t, out, posts)
	q.Mu.Lock()
	defer q.Mu.Unlock()
	require.Equal(t, out, q.r.tab.Outstanding(), "the table holds exactly the operations outstanding")
	if !q.rx {
		return
	}
	posted, lent := q.bufs.Counts()
	require.Equal(t, out, posted, "one posted buffer per outstanding descriptor")
	require.Equal(t, len(s.lent), lent, "lent buffers are those the reader kept")
	require.Equal(t, q.bufs.Cap(), q.bufs.Free()+posted+lent, "free + posted + lent == capacity")
	for _, b := range s.lent {
		_, err := q.bufs.Lent(b)
		require.NoError(t, err, "kept buffer %#x is lent", b)
	}
}

// readFuzzedWriteBack is the body of FuzzWriteBack (tx false) and
// FuzzTxWriteBack: the same input on two devices, one read through Poll
// and one through a bound CQ. It returns what was read.
func readFuzzedWriteBack(t *testing.T, data []byte, tx bool) []wbEvent {
	in, ok := decodeWB(data)
	if !ok {
		return nil
	}
	direct, viaCQ := newFuzzSide(t, in, tx, false), newFuzzSide(t, in, tx, true)
	direct.readPoll(t, in)
	viaCQ.readCQ(t, in)
	require.Equal(t, direct.got, viaCQ.got, "the queue API and the CQ report the same completions and codes")
	for _, s := range []*fuzzSide{direct, viaCQ} {
		s.accounted(t, in.posts)
	}
	require.Equal(t, direct.q.Outstanding(), viaCQ.q.Outstanding())
	direct.q.Mu.Lock()
	broken := direct.q.broken
	direct.q.Mu.Unlock()
	viaCQ.q.Mu.Lock()
	require.Equal(t, broken, viaCQ.q.broken, "both queues broken, or neither")
	viaCQ.q.Mu.Unlock()
	// Kept buffers go back exactly once.
	for _, s := range []*fuzzSide{direct, viaCQ} {
		rx := (*RxQueue)(unsafe.Pointer(s.q))
		for _, b := range s.lent {
			require.NoError(t, rx.Release(b))
			require.ErrorIs(t, rx.Release(b), nic.ErrBadBuffer)
		}
		s.lent = nil
		s.accounted(t, in.posts)
	}
	return direct.got
}

// wbSeeds are write-back rings for FuzzWriteBack: a well-behaved device's
// (4 frames into 7 posted buffers, head at 0 and after a wrap), then the
// same with bytes flipped, DD without EOP, a length beyond the buffer, DD
// beyond what was posted, and a hole.
func wbSeeds() []wbSeed {
	good := make([]byte, 3+fuzzRing*descSize)
	good[0], good[1], good[2] = 7, 0, 0x05
	for i := range 4 {
		d := good[3+i*descSize:]
		d[8] = byte(rxdStatusDD | rxdStatusEOP)
		d[12] = byte(60 + i)
	}
	with := func(f func(b []byte)) []byte {
		b := append([]byte(nil), good...)
		f(b)
		return b
	}
	return []wbSeed{
		{"good", good},
		{"wrapped", with(func(b []byte) { b[1] = 6 })},
		{"flipped", with(func(b []byte) {
			for i := 5; i < len(b); i += 5 {
				b[i] ^= 0xa5
			}
		})},
		// The frame continues in the next buffer.
		{"noEOP", with(func(b []byte) { b[3+8] = byte(rxdStatusDD) })},
		{"noEOPx2", with(func(b []byte) { b[3+8], b[3+descSize+8] = byte(rxdStatusDD), byte(rxdStatusDD) })},
		// 2049 bytes in a 2048-byte buffer.
		{"long", with(func(b []byte) { b[3+descSize+12], b[3+descSize+13] = 0x01, 0x08 })},
		// DD on descriptors never posted (beyond the tail).
		{"beyond", with(func(b []byte) { b[0] = 2 })},
		{"beyondWrapped", with(func(b []byte) { b[0], b[1] = 2, 7 })},
		// No DD before one with DD.
		{"hole", with(func(b []byte) { b[3+descSize+8] = 0 })},
	}
}

// wbSeed is a named seed input.
type wbSeed struct {
	name string
	data []byte
}

// txSeeds are transmit rings for FuzzTxWriteBack: DD on 3 of 5 frames sent,
// head at 0 and after a wrap, DD beyond what was sent, and a hole.
func txSeeds() []wbSeed {
	good := make([]byte, 3+fuzzRing*descSize)
	good[0] = 5
	for i := range 3 {
		good[3+i*descSize+12] = byte(txdStatusDD)
	}
	with := func(f func(b []byte)) []byte {
		b := append([]byte(nil), good...)
		f(b)
		return b
	}
	return []wbSeed{
		{"good", good},
		{"wrapped", with(func(b []byte) { b[1] = 6 })},
		{"beyond", with(func(b []byte) { b[0] = 2 })},
		{"hole", with(func(b []byte) { b[3+descSize+12] = 0 })},
	}
}

// FuzzWriteBack writes arbitrary bytes over igb's receive descriptor ring
// after buffers were posted (so DD, EOP, lengths and the offload words are
// whatever the input says) and reads the ring through the queue API
// (Poll, nic.Completion) on one device and through a CQ (cq.Entry,
// ReadErr) on a twin with the same bytes. Both must report the same
// completions (context, length, error sentinel), nothing may panic, and
// both must account for every buffer afterwards (free, posted or lent
// to the reader), with the posted-operation table holding exactly the
// outstanding descriptors.
//
// Input: byte 0 the buffers posted (up to the ring's 7), byte 1 the device
// head they start at, byte 2 which good completions the reader keeps lent,
// the rest written over the ring from the head on.
func FuzzWriteBack(f *testing.F) {
	for _, s := range wbSeeds() {
		f.Add(s.data)
	}
	f.Fuzz(func(t *testing.T, data []byte) { readFuzzedWriteBack(t, data, false) })
}

// FuzzTxWriteBack is FuzzWriteBack for the transmit ring, whose write-back
// carries DD only: the input's bytes over the transmit descriptors after
// frames were sent (byte 0 how many, byte 1 the head, byte 2 unused).
func FuzzTxWriteBack(f *testing.F) {
	for _, s := range txSeeds() {
		f.Add(s.data)
	}
	f.Fuzz(func(t *testing.T, data []byte) { readFuzzedWriteBack(t, data, true) })
}

// TestWriteBackSeeds checks that the seeds of FuzzWriteBack and
// FuzzTxWriteBack reach what they are named for, so the corpora keep
// covering the success and refusal paths.
func TestWriteBackSeeds(t *testing.T) {
	count := func(evs []wbEvent, class error) int {
		n := 0
		for _, e := range evs {
			if class == nil && e.class == -1 || class != nil && e.class == classOf(class) {
				n++
			}
		}
		return n
	}
	type want struct {
		good, refused int
		class         error // of the refused
	}
	rx := map[string]want{
		"good": {4, 0, nil}, "wrapped": {4, 0, nil},
		"noEOP":   {2, 2, cq.ProvMultiBuffer}, // the part without EOP and the rest
		"noEOPx2": {1, 3, cq.ProvMultiBuffer},
		"long":    {3, 1, cq.ProvBadLen},
		"beyond":  {2, 1, cq.ProvBadID}, "beyondWrapped": {2, 1, cq.ProvBadID},
		"hole": {1, 1, cq.ProvBadPhase},
	}
	tx := map[string]want{
		"good": {3, 0, nil}, "wrapped": {3, 0, nil},
		"beyond": {2, 1, cq.ProvBadID},
		"hole":   {1, 1, cq.ProvBadPhase},
	}
	check := func(seeds []wbSeed, wants map[string]want, isTx bool) {
		for _, s := range seeds {
			evs := readFuzzedWriteBack(t, s.data, isTx)
			w, ok := wants[s.name]
			if !ok { // garbled: some refusal, whichever
				require.Positive(t, len(evs)-count(evs, nil), "tx=%v %s", isTx, s.name)
				continue
			}
			require.Len(t, evs, w.good+w.refused, "tx=%v %s: %v", isTx, s.name, evs)
			require.Equal(t, w.good, count(evs, nil), "tx=%v %s", isTx, s.name)
			if w.class != nil {
				require.Equal(t, w.refused, count(evs, w.class), "tx=%v %s", isTx, s.name)
			}
			for i, e := range evs[:w.good] {
				if s.name == "good" || s.name == "wrapped" {
					l := 60
					if !isTx {
						l += i
					}
					require.Equal(t, wbEvent{ctx: i, len: l, class: -1}, e, "tx=%v %s", isTx, s.name)
				}
			}
		}
	}
	check(wbSeeds(), rx, false)
	check(txSeeds(), tx, true)
}
