package igbvm

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/cq/ring"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/nic/igb"
	"github.com/vfnic/vfnic/tests/conformance"
	"github.com/vfnic/vfnic/tests/leakcheck"
)

// TestGuestConformance runs the fi_cq conformance suite on CQs fed by
// QEMU's igb queues: each endpoint is the transmit queue of NIC A and the
// receive queue of NIC B on one QEMU hub, both bound to the CQ under test
// (Device.BindCQ), so a send is a frame on the wire, its completion a
// descriptor written back with DD, and its MSI-X interrupt what wakes
// SRead. Behaviours the device cannot produce are gated off through Caps,
// with the reason (see igbCaps).
func TestGuestConformance(t *testing.T) { guestOnly(t); runConformance(t) }

func runConformance(t *testing.T) {
	p := newIGBProvider()
	before, err := leakcheck.Snapshot()
	require.NoError(t, err)
	start := time.Now()
	conformance.Run(t, p)
	t.Run("NoOverrun", func(t *testing.T) { testNoOverrun(t, p) })
	st := p.stats()
	t.Logf("%s: %d endpoints (%d device opens, each a reset at Open and at Close; opening and draining took %v in all), "+
		"%d stale frames drained, %d oversized frames; suite took %v",
		p.Name(), st.endpoints, 2*st.endpoints, st.opening.Round(time.Millisecond), st.stale, st.oversize,
		time.Since(start).Round(time.Millisecond))
	require.Zero(t, st.open, "every endpoint was closed")
	after, err := leakcheck.Snapshot()
	require.NoError(t, err)
	require.Equal(t, before, after, "the suite returned every fd and mapping")
}

// testNoOverrun backs the Overrun gate: a CQ of one entry, bound to
// queues of 256, with 200 completions waiting, reads all of them and never
// reports an overrun (the entries stay in the descriptor rings until read).
func testNoOverrun(t *testing.T, p *igbProvider) {
	c, err := p.OpenCQ(cq.Attr{Size: 1, Format: cq.FormatContext})
	require.NoError(t, err)
	defer func() { require.NoError(t, c.Close()) }()
	ep, err := p.NewEndpoint(c, conformance.EndpointAttr{SendDepth: confTxRing})
	require.NoError(t, err)
	defer func() { require.NoError(t, ep.Close()) }()
	const sends = 200
	for i := range sends {
		require.NoError(t, ep.Send(i, []byte("x"), conformance.SendOpts{}))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, ep.Flush(ctx))
	ents := make([]cq.Entry, 7)
	got := 0
	for got < sends {
		n, err := c.Read(ents)
		require.NoError(t, err, "after %d of %d entries in a CQ of %d", got, sends, c.Attr().Size)
		for _, e := range ents[:n] {
			require.Equal(t, got, e.Context)
			got++
		}
	}
	_, err = c.Read(ents)
	require.ErrorIs(t, err, cq.ErrAgain)
}

// Framing of the provider's messages: an Ethernet header (B's MAC, A's
// MAC, a local experimental EtherType other than the host protocol's, so
// the hub's host port ignores them) before the payload.
const (
	ethHdr        = 14
	confEtherType = 0x88b6
)

// MaxInFlight: an igb transmit descriptor is free again only once its
// completion is read, and a ring of 256 holds 255 (one stays empty).
const (
	confTxRing  = 256
	maxInFlight = confTxRing - 1
)

// The conformance NICs: two pairs of igb NICs on hubs with a dgram port
// to the host for the frames no vfnic queue sends (longer than a buffer).
// Hub 0 is also the wire of the host tests' NIC (slot 4), which is B of
// the first pair; QEMU's igb takes two slots for its VFs, so there is room
// for no more igb NICs.
var confHubs = []struct{ hub, slotA, slotB int }{{0, 2, slotIGB}, {2, 10, 12}}

func addrOf(slot int) string { return fmt.Sprintf("0000:00:%02x.0", slot) }

var (
	errSendFull   = fmt.Errorf("igb provider: transmit ring full, read completions: %w", cq.ErrAgain)
	errNoCQData   = fmt.Errorf("igb provider: %w: Ethernet frames carry no remote CQ data or tag", cq.ErrNotSupported)
	errNoFailNext = fmt.Errorf("igb provider: %w: a send cannot be made to fail on demand", cq.ErrNotSupported)
	errNoMulti    = fmt.Errorf("igb provider: %w: one igb receive buffer holds one frame", cq.ErrNotSupported)
	errNoSource   = fmt.Errorf("igb provider: %w: raw Ethernet has no fabric source addresses", cq.ErrNotSupported)
)

// igbCaps are the capabilities of CQs on igb queues, and why the missing
// ones are missing.
func igbCaps() conformance.Caps {
	return conformance.Caps{
		MaxSize:      65536,
		FrameHeader:  ethHdr,
		MaxEndpoints: len(confHubs),
		MaxInFlight:  maxInFlight,
		NoFailNext:   true,
		Why: map[string]string{
			"RemoteData": "an igb write-back reports length, status and offload bits: there is no out-of-band data",
			"Tagged":     "no tag matching: the device fills receive buffers in posting order",
			"MultiRecv":  "an igb receive descriptor takes one buffer for at most one frame (or part of one)",
			"Source":     "raw Ethernet has no fabric address vector (the source MAC is in the frame)",
			"Overrun": "impossible by design: the CQ reads the bound queues' descriptor rings, which hold " +
				"exactly the descriptors the driver posted, so the device has nowhere to write an excess " +
				"entry; DD on a descriptor never posted is nic/igb's misbehaving-device test",
			"Truncation": "fi_cq's ETRUNC with Len and OLen needs a buffer shorter than a frame; igb spreads a " +
				"longer frame over several buffers (no EOP on all but the last), each an ETRUNC error " +
				"completion: DeviceErrors runs that on the device",
			"FailNext": "igb transmit write-backs carry only DD, so a send cannot be made to fail; " +
				"DeviceErrors covers the device's own error condition (a frame longer than the buffer)",
			"Faults": "QEMU's device cannot be made to misbehave; nic/igb's misbehaving-device tests write " +
				"bad lengths, holes, DD without EOP and DD on never-posted descriptors into real rings",
		},
	}
}

// igbProvider is a conformance.Provider over pairs of guest NICs on
// QEMU hubs (confHubs). An endpoint takes a free pair and opens both
// devices; closing it closes them, which is the only way to unbind a
// queue from its CQ. So every endpoint costs two device resets at open
// and two at close; the suite opens 33 (ManyOpen, whose 100 CQs would
// need 100 pairs, puts endpoints on as many as there are), about 45 ms
// each under TCG. Opening a CQ touches no device: OpenSizes' 1,200 CQs
// cost nothing.
type igbProvider struct {
	mu    sync.Mutex
	busy  []bool // per confHubs entry
	st    providerStats
	limit cq.Limits
}

// providerStats count what the provider did, for the log.
type providerStats struct {
	endpoints, open int           // opened in all, and open now
	stale, oversize int           // frames drained, oversized frames asked for
	opening         time.Duration // spent opening and draining devices
}

func newIGBProvider() *igbProvider {
	return &igbProvider{busy: make([]bool, len(confHubs)),
		limit: cq.Limits{DefaultSize: 2 * confTxRing, MaxSize: igbCaps().MaxSize, DefaultFormat: cq.FormatData,
			Vectors: runtime.NumCPU()}}
}

func (p *igbProvider) stats() providerStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.st
}

// Name implements conformance.Provider.
func (p *igbProvider) Name() string { return "igb (QEMU 82576)" }

// Caps implements conformance.Provider.
func (p *igbProvider) Caps() conformance.Caps { return igbCaps() }

// OpenCQ implements conformance.Provider. The signaling vector of
// AttrAffinity is checked against the CPUs and not acted on: the guest
// kernel places the MSI-X vectors.
func (p *igbProvider) OpenCQ(attr cq.Attr) (*cq.CQ, error) { return cq.New(attr, p.limit) }

// NewEndpoint implements conformance.Provider: a free NIC pair, opened,
// checked clear of frames queued for it (drain), and bound to c (B's
// receive queue and A's transmit queue).
func (p *igbProvider) NewEndpoint(c *cq.CQ, attr conformance.EndpointAttr) (conformance.Endpoint, error) {
	if attr.Source {
		return nil, errNoSource
	}
	if _, err := c.Read(nil); errors.Is(err, cq.ErrClosed) {
		return nil, fmt.Errorf("igb provider: endpoint on a closed CQ: %w", err)
	}
	p.mu.Lock()
	pair := -1
	for i, b := range p.busy {
		if !b {
			pair = i
			break
		}
	}
	if pair < 0 {
		p.mu.Unlock()
		return nil, fmt.Errorf("igb provider: all %d NIC pairs are in use: %w", len(p.busy), cq.ErrBusy)
	}
	p.busy[pair] = true
	p.mu.Unlock()
	start := time.Now()
	e, stale, err := p.open(pair, c, attr)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.busy[pair] = false
		return nil, err
	}
	p.st.endpoints++
	p.st.open++
	p.st.stale += stale
	p.st.opening += time.Since(start)
	return e, nil
}

// depth is a ring that holds asked operations: igb rings are powers of
// two with one descriptor always empty.
func depth(asked, def int) int {
	if asked <= 0 {
		return def
	}
	n := 8
	for n < asked+1 && n < confTxRing {
		n *= 2
	}
	return n
}

func (p *igbProvider) open(pair int, c *cq.CQ, attr conformance.EndpointAttr) (*igbEndpoint, int, error) {
	h := confHubs[pair]
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	e := &igbEndpoint{p: p, pair: pair}
	var err error
	if e.a, err = igb.Open(ctx, addrOf(h.slotA), igb.Config{
		Config: nic.Config{QueueSize: depth(attr.SendDepth, confTxRing)}}); err != nil {
		return nil, 0, err
	}
	if e.b, err = igb.Open(ctx, addrOf(h.slotB), igb.Config{LongFrames: true,
		Config: nic.Config{QueueSize: depth(attr.RecvDepth, 64)}}); err != nil {
		_ = e.a.Close()
		return nil, 0, err
	}
	fail := func(err error) (*igbEndpoint, int, error) {
		return nil, 0, errors.Join(err, e.a.Close(), e.b.Close())
	}
	if e.atx, err = e.a.TxQueue(0); err != nil {
		return fail(err)
	}
	if e.arx, err = e.a.RxQueue(0); err != nil {
		return fail(err)
	}
	if e.brx, err = e.b.RxQueue(0); err != nil {
		return fail(err)
	}
	if e.btx, err = e.b.TxQueue(0); err != nil {
		return fail(err)
	}
	copy(e.frame[0:6], e.b.MAC())
	copy(e.frame[6:12], e.a.MAC())
	binary.BigEndian.PutUint16(e.frame[12:], confEtherType)
	stale, err := e.drain(ctx)
	if err != nil {
		return fail(err)
	}
	// A's receive queue, which the endpoint does not use, takes the host's
	// answers to RecvOversize.
	for e.arx.PostRecv(nil) == nil {
	}
	if err := e.arx.Flush(); err != nil {
		return fail(err)
	}
	if err := e.b.BindCQ(c, 0, nic.Recv); err != nil {
		return fail(err)
	}
	if err := e.a.BindCQ(c, 0, nic.Send); err != nil {
		return fail(err)
	}
	return e, stale, nil
}

// igbEndpoint is one NIC pair bound to a CQ: sends go out of A's
// transmit queue to B's MAC, receives are posted on B's receive queue.
// B's transmit and A's receive queue stay unbound: the provider talks to
// the hub's host port through them (RecvOversize).
type igbEndpoint struct {
	p        *igbProvider
	pair     int
	a, b     *igb.Device
	atx, btx *igb.TxQueue
	arx, brx *igb.RxQueue

	mu    sync.Mutex         // frame, for concurrent senders
	frame [nic.MaxFrame]byte // header filled at open, payload per send
	ctl   sync.Mutex         // the unbound queues (RecvOversize)
	once  sync.Once
	cerr  error
}

var (
	_ conformance.Endpoint  = (*igbEndpoint)(nil)
	_ conformance.Oversizer = (*igbEndpoint)(nil)
)

// drain makes sure no frame is queued for B before the endpoint starts:
// QEMU holds the frames a NIC without posted buffers cannot take and
// delivers them once buffers are posted, so a frame left on the hub would
// fill the first receive a test posts. (QEMU 10.0 drops them when the NIC
// resets, so this finds none between endpoints; it is the check that
// stays true when that changes.) B takes frames until a marker from A
// arrives behind them; A then fills B's still-posted buffers so that none
// stays posted, and every buffer goes back to the pool. It returns how
// many stale frames it dropped.
func (e *igbEndpoint) drain(ctx context.Context) (int, error) {
	posted := min(32, e.brx.Size()-1) // one descriptor stays empty
	for range posted {
		if err := e.brx.PostRecv(nil); err != nil {
			return 0, err
		}
	}
	if err := e.brx.Flush(); err != nil {
		return 0, err
	}
	marker := func(kind byte, nonce uint64) []byte {
		f := append([]byte(nil), e.frame[:ethHdr]...)
		f = append(append(f, "drain"...), kind)
		f = binary.BigEndian.AppendUint64(f, nonce)
		return append(f, make([]byte, 60-len(f))...) // the device pads shorter frames to 60 bytes
	}
	nonce := rand.Uint64()
	if err := e.sendRaw(e.atx, marker('m', nonce)); err != nil {
		return 0, err
	}
	stale, seen := 0, false
	lastProgress := time.Now()
	var comps [32]nic.Completion
	for !seen {
		if err := ctx.Err(); err != nil {
			return stale, fmt.Errorf("igb provider: draining %s: %w", e.b.Info().Address, err)
		}
		n, err := e.brx.SRead(ctx, comps[:], 1, 200*time.Millisecond)
		if errors.Is(err, nic.ErrTimeout) {
			if time.Since(lastProgress) > time.Second {
				// The marker was dropped (QEMU's queue for B was full):
				// a new one, behind whatever is queued now.
				nonce++
				if err := e.sendRaw(e.atx, marker('m', nonce)); err != nil {
					return stale, err
				}
				lastProgress = time.Now()
			}
			continue
		}
		if err != nil {
			return stale, err
		}
		lastProgress = time.Now()
		for _, c := range comps[:n] {
			if c.Err != nil {
				continue // its buffer went back to the pool
			}
			if bytes.Equal(c.Data, marker('m', nonce)) {
				seen = true
			} else {
				stale++
			}
			if err := e.brx.Release(c.Buf); err != nil {
				return stale, err
			}
		}
		if !seen {
			for e.brx.Outstanding() < posted && e.brx.PostRecv(nil) == nil {
			}
			if err := e.brx.Flush(); err != nil {
				return stale, err
			}
		}
		e.reclaim(e.atx)
	}
	// Nothing is queued for B any more: fill what is still posted.
	left := e.brx.Outstanding()
	for i := range left {
		if err := e.sendRaw(e.atx, marker('f', uint64(i))); err != nil {
			return stale, err
		}
	}
	for e.brx.Outstanding() > 0 {
		n, err := e.brx.SRead(ctx, comps[:], 1, 5*time.Second)
		if err != nil {
			return stale, fmt.Errorf("igb provider: filling %d posted buffers of %s: %w", left, e.b.Info().Address, err)
		}
		for _, c := range comps[:n] {
			if c.Err == nil {
				if err := e.brx.Release(c.Buf); err != nil {
					return stale, err
				}
			}
		}
	}
	for deadline := time.Now().Add(5 * time.Second); e.atx.Outstanding() > 0; {
		if time.Now().After(deadline) {
			return stale, fmt.Errorf("igb provider: %d sends of %s did not complete", e.atx.Outstanding(), e.a.Info().Address)
		}
		e.reclaim(e.atx)
	}
	return stale, nil
}

// sendRaw sends f on an unbound transmit queue, reclaiming completions
// when the ring is full.
func (e *igbEndpoint) sendRaw(q *igb.TxQueue, f []byte) error {
	for deadline := time.Now().Add(5 * time.Second); ; {
		err := q.Send(f, nil)
		if err == nil {
			return q.Flush()
		}
		if !errors.Is(err, nic.ErrFull) || time.Now().After(deadline) {
			return err
		}
		if err := q.Flush(); err != nil {
			return err
		}
		e.reclaim(q)
	}
}

// reclaim reads the completions of an unbound transmit queue.
func (e *igbEndpoint) reclaim(q *igb.TxQueue) {
	var comps [32]nic.Completion
	for q.Poll(comps[:]) == len(comps) {
	}
}

// Addr implements conformance.Endpoint: A's MAC, which its frames carry.
func (e *igbEndpoint) Addr() cq.Addr {
	var a [8]byte
	copy(a[2:], e.a.MAC())
	return cq.Addr(binary.BigEndian.Uint64(a[:]))
}

// Send implements conformance.Endpoint: payload, behind an Ethernet header
// to B, out of A's transmit queue. It allocates nothing.
func (e *igbEndpoint) Send(ctx any, payload []byte, o conformance.SendOpts) error {
	if o.HasData || o.Tagged {
		return errNoCQData
	}
	if len(payload) > len(e.frame)-ethHdr {
		return fmt.Errorf("igb provider: %w: %d-byte payload in a %d-byte frame", cq.ErrInvalid, len(payload), len(e.frame))
	}
	e.mu.Lock()
	n := copy(e.frame[ethHdr:], payload)
	err := e.atx.Send(e.frame[:ethHdr+n], ctx)
	if err == nil {
		err = e.atx.Flush()
	}
	e.mu.Unlock()
	if errors.Is(err, nic.ErrFull) {
		return errSendFull
	}
	return err
}

// PostRecv implements conformance.Endpoint with one of B's receive buffers,
// whose frame area it returns: a virtio buffer holds a whole frame, so it
// is at least size bytes (sizes beyond that are refused).
func (e *igbEndpoint) PostRecv(ctx any, size int, o conformance.RecvOpts) ([]byte, error) {
	if o.MultiRecv {
		return nil, errNoMulti
	}
	if size <= 0 || size > e.brx.MaxFrame() {
		return nil, fmt.Errorf("igb provider: %w: a %d-byte receive (buffers hold %d)", cq.ErrInvalid, size, e.brx.MaxFrame())
	}
	buf, err := e.brx.PostRecvBuf(ctx)
	if errors.Is(err, nic.ErrFull) {
		return nil, fmt.Errorf("igb provider: %w", errors.Join(ring.ErrFull, err))
	}
	if err != nil {
		return nil, err
	}
	return buf, e.brx.Flush()
}

// FailNext implements conformance.Endpoint: not possible (Caps.NoFailNext).
func (e *igbEndpoint) FailNext() error { return errNoFailNext }

// Flush implements conformance.Endpoint: it waits until the device has
// used every send posted so far, without reading their completions (QEMU
// hands a frame to the hub, and so to B, before it marks the send used).
func (e *igbEndpoint) Flush(ctx context.Context) error {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		// Outstanding first: whatever the CQ reads meanwhile only makes
		// Ready smaller, never makes an unfinished send look finished.
		out := e.atx.Outstanding()
		if e.atx.Ready(e.atx.Size()) >= out {
			return nil
		}
		t.Reset(50 * time.Microsecond)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// RecvOversize implements conformance.Oversizer: B's transmit queue asks
// the hub's host port for a frame 1000 bytes longer than B's buffers hold,
// to B's MAC; the host sends it, then an answer to A's receive queue. QEMU
// delivers the datagrams of its socket in order, so when the answer is in,
// B has the frame. B takes long frames (LongFrames): the device spreads the
// frame over buffers, no EOP on the first, and the driver completes each
// buffer with ErrMultiBuffer (cq.ETRUNC).
func (e *igbEndpoint) RecvOversize(ctx context.Context) (int, error) {
	size := e.brx.MaxFrame() + 1000
	nbufs := (size + e.brx.MaxFrame() - 1) / e.brx.MaxFrame()
	nonce := rand.Uint32() | 1
	req := build(hostMAC, e.b.MAC(), msgOversize, nonce, uint32(size), 60)
	copy(req[hdrLen:], e.a.MAC())
	e.ctl.Lock()
	defer e.ctl.Unlock()
	if err := e.sendRaw(e.btx, req); err != nil {
		return 0, err
	}
	var comps [8]nic.Completion
	for {
		n, err := e.arx.SRead(ctx, comps[:], 1, -1)
		if err != nil {
			return 0, fmt.Errorf("igb provider: waiting for the host's oversized frame: %w", err)
		}
		done := false
		for _, c := range comps[:n] {
			if c.Err != nil {
				continue
			}
			if m, err := parse(c.Data); err == nil && m.typ == msgOversizeDone && m.session == nonce {
				done = true
			}
			if err := e.arx.Repost(c.Buf, nil); err != nil {
				return 0, err
			}
		}
		if err := e.arx.Flush(); err != nil {
			return 0, err
		}
		e.reclaim(e.btx)
		if done {
			e.p.mu.Lock()
			e.p.st.oversize++
			e.p.mu.Unlock()
			return nbufs, nil
		}
	}
}

// Close implements conformance.Endpoint: closing both devices resets them,
// which unbinds their queues from the CQ. Idempotent.
func (e *igbEndpoint) Close() error {
	e.once.Do(func() {
		e.cerr = errors.Join(e.a.Close(), e.b.Close())
		e.p.mu.Lock()
		e.p.busy[e.pair] = false
		e.p.st.open--
		e.p.mu.Unlock()
	})
	return e.cerr
}
