package virtiovm

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/cq/ring"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/nic/virtio"
	"github.com/vfnic/vfnic/tests/conformance"
)

// TestGuestConformancePacked runs the fi_cq conformance suite on CQs fed
// by QEMU's virtio-net queues (packed rings): each endpoint is the
// transmit queue of NIC A and the receive queue of NIC B on one QEMU hub,
// both bound to the CQ under test (Device.BindCQ), so a send is a frame on
// the wire, its completion a used descriptor, and its MSI-X interrupt what
// wakes SRead. Behaviours a virtio device cannot produce are gated off
// through Caps, with the reason (see virtioCaps).
func TestGuestConformancePacked(t *testing.T) { guestOnly(t); runConformance(t, false) }

// TestGuestConformanceSplit is TestGuestConformancePacked on split rings
// (the same NICs, opened with virtio.Config.Split).
func TestGuestConformanceSplit(t *testing.T) { guestOnly(t); runConformance(t, true) }

func runConformance(t *testing.T, split bool) {
	p := newVirtioProvider(split)
	before := snapshot(t)
	start := time.Now()
	conformance.Run(t, p)
	t.Run("NoOverrun", func(t *testing.T) { testNoOverrun(t, p) })
	st := p.stats()
	t.Logf("%s: %d endpoints (%d device opens, each a reset at Open and at Close; opening and draining took %v in all), "+
		"%d stale frames drained, %d oversized frames; suite took %v",
		p.Name(), st.endpoints, 2*st.endpoints, st.opening.Round(time.Millisecond), st.stale, st.oversize,
		time.Since(start).Round(time.Millisecond))
	require.Zero(t, st.open, "every endpoint was closed")
	require.Equal(t, before, snapshot(t), "the suite returned every fd and mapping")
}

// testNoOverrun backs the Overrun gate: a CQ of one entry, bound to
// queues of 256, with 200 completions waiting, reads all of them and never
// reports an overrun (the entries stay in the used rings until read).
func testNoOverrun(t *testing.T, p *virtioProvider) {
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

// MaxInFlight: a virtio transmit descriptor is free again only once its
// completion is read, and QEMU's transmit rings hold 256 descriptors.
const confTxRing = 256

var (
	errSendFull   = fmt.Errorf("virtio provider: transmit ring full, read completions: %w", cq.ErrAgain)
	errNoCQData   = fmt.Errorf("virtio provider: %w: virtio-net frames carry no remote CQ data or tag", cq.ErrNotSupported)
	errNoFailNext = fmt.Errorf("virtio provider: %w: virtio transmit completions carry no status", cq.ErrNotSupported)
	errNoMulti    = fmt.Errorf("virtio provider: %w: one virtio receive buffer holds one frame", cq.ErrNotSupported)
	errNoSource   = fmt.Errorf("virtio provider: %w: raw Ethernet has no fabric source addresses", cq.ErrNotSupported)
)

// virtioCaps are the capabilities of CQs on virtio queues, and why the
// missing ones are missing.
func virtioCaps() conformance.Caps {
	return conformance.Caps{
		// A CQ allocates nothing by its size: it reads the used rings of
		// the queues bound to it.
		MaxSize:      65536,
		FrameHeader:  ethHdr,
		MaxEndpoints: len(confHubs),
		MaxInFlight:  confTxRing,
		NoFailNext:   true,
		Why: map[string]string{
			"RemoteData": "a virtio-net used descriptor reports only a buffer id and a length: there is no out-of-band data",
			"Tagged":     "no tag matching: the device fills receive buffers in posting order",
			"MultiRecv":  "a virtio receive buffer holds at most one frame; the device never packs several into one",
			"Source":     "raw Ethernet has no fabric address vector (the source MAC is in the frame)",
			"Overrun": "impossible by design: a virtio CQ is a view over the bound queues' used rings, which " +
				"hold exactly the buffers the driver posted, so the device has nowhere to write an excess " +
				"entry; a device writing one anyway is a bad id or index, which nic/virtio's misbehaving-" +
				"device tests cover",
			"Truncation": "fi_cq's ETRUNC with Len and OLen needs a buffer shorter than a frame, and virtio receive " +
				"buffers hold a whole MTU frame; a longer frame spans several buffers (MRG_RXBUF), each an " +
				"ETRUNC error completion: DeviceErrors runs that on the device",
			"FailNext": "virtio transmit completions carry no status, so a send cannot be made to fail; " +
				"DeviceErrors covers the device's own error condition (a frame longer than the buffer)",
			"Faults": "QEMU's device cannot be made to misbehave; nic/virtio's misbehaving-device tests inject " +
				"bad ids, lengths, phases and indexes into real rings",
		},
	}
}

// virtioProvider is a conformance.Provider over pairs of guest NICs on
// QEMU hubs (confHubs). An endpoint takes a free pair and opens both
// devices; closing it closes them, which is the only way to unbind a
// queue from its CQ. So every endpoint costs two device resets at open
// and two at close; the suite opens 33 (ManyOpen, whose 100 CQs would
// need 100 pairs, puts endpoints on as many as there are), about 45 ms
// each under TCG. Opening a CQ touches no device: OpenSizes' 1,200 CQs
// cost nothing.
type virtioProvider struct {
	split bool

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

func newVirtioProvider(split bool) *virtioProvider {
	return &virtioProvider{split: split, busy: make([]bool, len(confHubs)),
		limit: cq.Limits{DefaultSize: 2 * confTxRing, MaxSize: virtioCaps().MaxSize, DefaultFormat: cq.FormatData,
			Vectors: runtime.NumCPU()}}
}

func (p *virtioProvider) stats() providerStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.st
}

// Name implements conformance.Provider.
func (p *virtioProvider) Name() string {
	if p.split {
		return "virtio (split rings)"
	}
	return "virtio (packed rings)"
}

// Caps implements conformance.Provider.
func (p *virtioProvider) Caps() conformance.Caps { return virtioCaps() }

// OpenCQ implements conformance.Provider. The signaling vector of
// AttrAffinity is checked against the CPUs and not acted on: the guest
// kernel places the MSI-X vectors.
func (p *virtioProvider) OpenCQ(attr cq.Attr) (*cq.CQ, error) { return cq.New(attr, p.limit) }

// NewEndpoint implements conformance.Provider: a free NIC pair, opened,
// checked clear of frames queued for it (drain), and bound to c (B's
// receive queue and A's transmit queue).
func (p *virtioProvider) NewEndpoint(c *cq.CQ, attr conformance.EndpointAttr) (conformance.Endpoint, error) {
	if attr.Source {
		return nil, errNoSource
	}
	if _, err := c.Read(nil); errors.Is(err, cq.ErrClosed) {
		return nil, fmt.Errorf("virtio provider: endpoint on a closed CQ: %w", err)
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
		return nil, fmt.Errorf("virtio provider: all %d NIC pairs are in use: %w", len(p.busy), cq.ErrBusy)
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

func depth(asked, def int) int {
	if asked <= 0 {
		return def
	}
	return min(asked, confTxRing)
}

func (p *virtioProvider) open(pair int, c *cq.CQ, attr conformance.EndpointAttr) (*virtioEndpoint, int, error) {
	h := confHubs[pair]
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	e := &virtioEndpoint{p: p, pair: pair}
	var err error
	if e.a, err = virtio.Open(ctx, addrOf(h.slotA), virtio.Config{Split: p.split,
		Config: nic.Config{QueueSize: depth(attr.SendDepth, confTxRing)}}); err != nil {
		return nil, 0, err
	}
	if e.b, err = virtio.Open(ctx, addrOf(h.slotB), virtio.Config{Split: p.split,
		Config: nic.Config{QueueSize: depth(attr.RecvDepth, 64)}}); err != nil {
		_ = e.a.Close()
		return nil, 0, err
	}
	fail := func(err error) (*virtioEndpoint, int, error) {
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

// virtioEndpoint is one NIC pair bound to a CQ: sends go out of A's
// transmit queue to B's MAC, receives are posted on B's receive queue.
// B's transmit and A's receive queue stay unbound: the provider talks to
// the hub's host port through them (RecvOversize).
type virtioEndpoint struct {
	p        *virtioProvider
	pair     int
	a, b     *virtio.Device
	atx, btx *virtio.TxQueue
	arx, brx *virtio.RxQueue

	mu    sync.Mutex         // frame, for concurrent senders
	frame [nic.MaxFrame]byte // header filled at open, payload per send
	ctl   sync.Mutex         // the unbound queues (RecvOversize)
	once  sync.Once
	cerr  error
}

var (
	_ conformance.Endpoint  = (*virtioEndpoint)(nil)
	_ conformance.Oversizer = (*virtioEndpoint)(nil)
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
func (e *virtioEndpoint) drain(ctx context.Context) (int, error) {
	posted := min(32, e.brx.Size())
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
		return binary.BigEndian.AppendUint64(f, nonce)
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
			return stale, fmt.Errorf("virtio provider: draining %s: %w", e.b.Info().Address, err)
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
			return stale, fmt.Errorf("virtio provider: filling %d posted buffers of %s: %w", left, e.b.Info().Address, err)
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
			return stale, fmt.Errorf("virtio provider: %d sends of %s did not complete", e.atx.Outstanding(), e.a.Info().Address)
		}
		e.reclaim(e.atx)
	}
	return stale, nil
}

// sendRaw sends f on an unbound transmit queue, reclaiming completions
// when the ring is full.
func (e *virtioEndpoint) sendRaw(q *virtio.TxQueue, f []byte) error {
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
func (e *virtioEndpoint) reclaim(q *virtio.TxQueue) {
	var comps [32]nic.Completion
	for q.Poll(comps[:]) == len(comps) {
	}
}

// Addr implements conformance.Endpoint: A's MAC, which its frames carry.
func (e *virtioEndpoint) Addr() cq.Addr {
	var a [8]byte
	copy(a[2:], e.a.MAC())
	return cq.Addr(binary.BigEndian.Uint64(a[:]))
}

// Send implements conformance.Endpoint: payload, behind an Ethernet header
// to B, out of A's transmit queue. It allocates nothing.
func (e *virtioEndpoint) Send(ctx any, payload []byte, o conformance.SendOpts) error {
	if o.HasData || o.Tagged {
		return errNoCQData
	}
	if len(payload) > len(e.frame)-ethHdr {
		return fmt.Errorf("virtio provider: %w: %d-byte payload in a %d-byte frame", cq.ErrInvalid, len(payload), len(e.frame))
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
func (e *virtioEndpoint) PostRecv(ctx any, size int, o conformance.RecvOpts) ([]byte, error) {
	if o.MultiRecv {
		return nil, errNoMulti
	}
	if size <= 0 || size > e.brx.MaxFrame() {
		return nil, fmt.Errorf("virtio provider: %w: a %d-byte receive (buffers hold %d)", cq.ErrInvalid, size, e.brx.MaxFrame())
	}
	buf, err := e.brx.PostRecvBuf(ctx)
	if errors.Is(err, nic.ErrFull) {
		return nil, fmt.Errorf("virtio provider: %w", errors.Join(ring.ErrFull, err))
	}
	if err != nil {
		return nil, err
	}
	return buf, e.brx.Flush()
}

// FailNext implements conformance.Endpoint: not possible (Caps.NoFailNext).
func (e *virtioEndpoint) FailNext() error { return errNoFailNext }

// Flush implements conformance.Endpoint: it waits until the device has
// used every send posted so far, without reading their completions (QEMU
// hands a frame to the hub, and so to B, before it marks the send used).
func (e *virtioEndpoint) Flush(ctx context.Context) error {
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
// B has the frame (or holds it until enough buffers are posted). With
// MRG_RXBUF the device spreads the frame over several buffers, and the
// driver completes each of them with ErrMultiBuffer (cq.ETRUNC).
func (e *virtioEndpoint) RecvOversize(ctx context.Context) (int, error) {
	info := e.b.Info()
	if !slices.Contains(info.Features, "MRG_RXBUF") {
		// Without it QEMU drops a frame longer than a buffer, silently.
		return 0, fmt.Errorf("virtio provider: %w: %s did not negotiate MRG_RXBUF", cq.ErrNotSupported, info.Address)
	}
	// The first buffer holds the virtio-net header and MaxFrame bytes of
	// the frame, the others BufferSize bytes each.
	size := e.brx.MaxFrame() + 1000
	nbufs := 1 + (size-e.brx.MaxFrame()+info.BufferSize-1)/info.BufferSize
	nonce := rand.Uint32() | 1
	req := build(hostMAC, e.b.MAC(), msg{typ: msgOversizeReq, session: nonce, seq: uint32(size),
		args: macArgs(e.b.MAC(), e.a.MAC())}, minFrame)
	e.ctl.Lock()
	defer e.ctl.Unlock()
	if err := e.sendRaw(e.btx, req); err != nil {
		return 0, err
	}
	var comps [8]nic.Completion
	for {
		n, err := e.arx.SRead(ctx, comps[:], 1, -1)
		if err != nil {
			return 0, fmt.Errorf("virtio provider: waiting for the host's oversized frame: %w", err)
		}
		done := false
		for _, c := range comps[:n] {
			if c.Err != nil {
				continue
			}
			if m, ok := peek(c.Data); ok && m.typ == msgOversizeDone && m.session == nonce {
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
func (e *virtioEndpoint) Close() error {
	e.once.Do(func() {
		e.cerr = errors.Join(e.a.Close(), e.b.Close())
		e.p.mu.Lock()
		e.p.busy[e.pair] = false
		e.p.st.open--
		e.p.mu.Unlock()
	})
	return e.cerr
}
