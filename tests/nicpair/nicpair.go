// Package nicpair runs the fi_cq conformance suite on a NIC driver in a
// guest: a conformance.Provider whose endpoints are pairs of the driver's
// NICs on one QEMU hub. Each endpoint is the transmit queue of NIC A and
// the receive queue of NIC B, both bound to the CQ under test
// (nic.Device.BindCQ), so a send is a frame on the wire, its completion an
// entry the device wrote, and its MSI-X interrupt what wakes SRead. What
// differs between drivers (opening a NIC, ring sizes, padding, the host's
// oversized frame) is a Driver; the rest is the same for all. Send and
// Reclaim are the drivers' guest tests' shared transmit helpers.
package nicpair

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
	"github.com/vfnic/vfnic/tests/conformance"
	"github.com/vfnic/vfnic/tests/leakcheck"
)

// Framing of the provider's messages: an Ethernet header (B's MAC, A's
// MAC, a local experimental EtherType other than the host protocols', so
// the hub's host port ignores them) before the payload.
const (
	EthHdr    = 14
	EtherType = 0x88b6
)

// RxQueue is a receive queue as the provider uses it: the drivers' queues
// also lend the buffer they post, for PostRecv's frame area.
type RxQueue interface {
	nic.RxQueue
	// PostRecvBuf is PostRecv returning the buffer's frame area.
	PostRecvBuf(ctx any) ([]byte, error)
}

// TxQueue is a transmit queue as the provider uses it.
type TxQueue interface {
	nic.TxQueue
	// Ready counts, up to max, the completions the device has written
	// and no reader has taken.
	Ready(max int) int
}

// Driver is what differs between the drivers' providers.
type Driver struct {
	// Name names the provider in the suite's output.
	Name string
	// Caps are the capabilities of CQs on the driver's queues, with the
	// reasons for the missing ones.
	Caps conformance.Caps
	// Pairs are the PCI addresses of the NIC pairs, A (sends) then B
	// (receives), each pair on a hub with a port to the host.
	Pairs [][2]string
	// Open opens the NIC at addr with rings of size descriptors; recv is
	// true for B.
	Open func(ctx context.Context, addr string, size int, recv bool) (nic.Device, error)
	// Depth is the ring size that holds asked operations (asked > 0).
	Depth func(asked int) int
	// TxRing is the size of A's transmit ring when the suite asks for no
	// depth.
	TxRing int
	// Reserved is the number of descriptors a full ring keeps empty.
	Reserved int
	// PadTo is the length the device pads shorter frames to (0: none).
	PadTo int
	// Oversize is RecvOversize's request (nil: the driver has no way to
	// make a frame longer than a buffer reach B, and its endpoints are no
	// conformance.Oversizer): the frame B sends the hub's
	// host port for a frame of size bytes to B (the host answers A), the
	// number of B's buffers that frame fills, and whether a frame A
	// received is the host's answer.
	Oversize func(ep *Endpoint, size int) (req []byte, nbufs int, answer func(frame []byte) bool, err error)
}

// Stats count what a provider did, for the log.
type Stats struct {
	Endpoints, Open int           // opened in all, and open now
	Stale, Oversize int           // frames drained, oversized frames asked for
	Opening         time.Duration // spent opening and draining devices
}

// Provider is a conformance.Provider over pairs of guest NICs. An endpoint
// takes a free pair and opens both devices; closing it closes them, which
// is the only way to unbind a queue from its CQ. So every endpoint costs
// two device resets at open and two at close (tens of ms each under TCG).
// Opening a CQ touches no device.
type Provider struct {
	d     Driver
	limit cq.Limits

	mu   sync.Mutex
	busy []bool // per Driver.Pairs entry
	st   Stats
}

var _ conformance.Provider = (*Provider)(nil)

// New returns the provider of d.
func New(d Driver) *Provider {
	return &Provider{d: d, busy: make([]bool, len(d.Pairs)),
		limit: cq.Limits{DefaultSize: 2 * d.TxRing, MaxSize: d.Caps.MaxSize, DefaultFormat: cq.FormatData,
			Vectors: runtime.NumCPU()}}
}

// Run runs the conformance suite and NoOverrun on p, logs p's statistics
// and checks that every endpoint was closed and every fd and mapping
// returned.
func Run(t *testing.T, p *Provider) {
	before, err := leakcheck.Snapshot()
	require.NoError(t, err)
	start := time.Now()
	conformance.Run(t, p)
	t.Run("NoOverrun", func(t *testing.T) { testNoOverrun(t, p) })
	st := p.Stats()
	t.Logf("%s: %d endpoints (%d device opens, each a reset at Open and at Close; opening and draining took %v in all), "+
		"%d stale frames drained, %d oversized frames; suite took %v",
		p.Name(), st.Endpoints, 2*st.Endpoints, st.Opening.Round(time.Millisecond), st.Stale, st.Oversize,
		time.Since(start).Round(time.Millisecond))
	require.Zero(t, st.Open, "every endpoint was closed")
	after, err := leakcheck.Snapshot()
	require.NoError(t, err)
	require.Equal(t, before, after, "the suite returned every fd and mapping")
}

// testNoOverrun backs the Overrun gate: a CQ of one entry, bound to
// queues of 256, with 200 completions waiting, reads all of them and never
// reports an overrun (the entries stay in the device's rings until read).
func testNoOverrun(t *testing.T, p *Provider) {
	c, err := p.OpenCQ(cq.Attr{Size: 1, Format: cq.FormatContext})
	require.NoError(t, err)
	defer func() { require.NoError(t, c.Close()) }()
	ep, err := p.NewEndpoint(c, conformance.EndpointAttr{SendDepth: 256})
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

// Stats returns what p did so far.
func (p *Provider) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.st
}

// Name implements conformance.Provider.
func (p *Provider) Name() string { return p.d.Name }

// Caps implements conformance.Provider.
func (p *Provider) Caps() conformance.Caps { return p.d.Caps }

// OpenCQ implements conformance.Provider. The signaling vector of
// AttrAffinity is checked against the CPUs and not acted on: the guest
// kernel places the MSI-X vectors.
func (p *Provider) OpenCQ(attr cq.Attr) (*cq.CQ, error) { return cq.New(attr, p.limit) }

// errorf prefixes the provider's name to an error.
func (p *Provider) errorf(format string, args ...any) error {
	return fmt.Errorf(p.d.Name+" provider: "+format, args...)
}

// NewEndpoint implements conformance.Provider: a free NIC pair, opened,
// checked clear of frames queued for it (drain), and bound to c (B's
// receive queue and A's transmit queue).
func (p *Provider) NewEndpoint(c *cq.CQ, attr conformance.EndpointAttr) (conformance.Endpoint, error) {
	if attr.Source {
		return nil, p.errorf("%w: raw Ethernet has no fabric source addresses", cq.ErrNotSupported)
	}
	if _, err := c.Read(nil); errors.Is(err, cq.ErrClosed) {
		return nil, p.errorf("endpoint on a closed CQ: %w", err)
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
		return nil, p.errorf("all %d NIC pairs are in use: %w", len(p.busy), cq.ErrBusy)
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
	p.st.Endpoints++
	p.st.Open++
	p.st.Stale += stale
	p.st.Opening += time.Since(start)
	if p.d.Oversize == nil {
		return plainEndpoint{e}, nil
	}
	return e, nil
}

// plainEndpoint is an Endpoint without RecvOversize, for a driver without
// Driver.Oversize: the suite then skips what needs it, with Caps.Why's
// "Oversizer".
type plainEndpoint struct{ conformance.Endpoint }

func (p *Provider) depth(asked, def int) int {
	if asked <= 0 {
		return def
	}
	return p.d.Depth(asked)
}

func (p *Provider) open(pair int, c *cq.CQ, attr conformance.EndpointAttr) (*Endpoint, int, error) {
	addrs := p.d.Pairs[pair]
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	e := &Endpoint{p: p, pair: pair}
	var err error
	if e.a, err = p.d.Open(ctx, addrs[0], p.depth(attr.SendDepth, p.d.TxRing), false); err != nil {
		return nil, 0, err
	}
	if e.b, err = p.d.Open(ctx, addrs[1], p.depth(attr.RecvDepth, 64), true); err != nil {
		_ = e.a.Close()
		return nil, 0, err
	}
	fail := func(err error) (*Endpoint, int, error) {
		return nil, 0, errors.Join(err, e.a.Close(), e.b.Close())
	}
	if e.atx, err = as[TxQueue](e.a.Tx(0)); err != nil {
		return fail(err)
	}
	if e.btx, err = as[TxQueue](e.b.Tx(0)); err != nil {
		return fail(err)
	}
	if e.arx, err = as[RxQueue](e.a.Rx(0)); err != nil {
		return fail(err)
	}
	if e.brx, err = as[RxQueue](e.b.Rx(0)); err != nil {
		return fail(err)
	}
	copy(e.frame[0:6], e.b.MAC())
	copy(e.frame[6:12], e.a.MAC())
	binary.BigEndian.PutUint16(e.frame[12:], EtherType)
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

// as gives a driver's queue q (with the error of the call that returned
// it) as the provider's interface Q.
func as[Q any](q any, err error) (Q, error) {
	v, ok := q.(Q)
	if err == nil && !ok {
		err = fmt.Errorf("%w: %T lacks what the provider uses", nic.ErrNotSupported, q)
	}
	return v, err
}

// Endpoint is one NIC pair bound to a CQ: sends go out of A's transmit
// queue to B's MAC, receives are posted on B's receive queue. B's transmit
// and A's receive queue stay unbound: the provider talks to the hub's host
// port through them (RecvOversize).
type Endpoint struct {
	p        *Provider
	pair     int
	a, b     nic.Device
	atx, btx TxQueue
	arx, brx RxQueue

	mu    sync.Mutex         // frame, for concurrent senders
	frame [nic.MaxFrame]byte // header filled at open, payload per send
	ctl   sync.Mutex         // the unbound queues (RecvOversize)
	once  sync.Once
	cerr  error
}

var (
	_ conformance.Endpoint  = (*Endpoint)(nil)
	_ conformance.Oversizer = (*Endpoint)(nil)
)

// A returns the sending NIC.
func (e *Endpoint) A() nic.Device { return e.a }

// B returns the receiving NIC.
func (e *Endpoint) B() nic.Device { return e.b }

// BRx returns B's receive queue, which the CQ reads.
func (e *Endpoint) BRx() RxQueue { return e.brx }

// drain makes sure no frame is queued for B before the endpoint starts:
// QEMU holds the frames a NIC without posted buffers cannot take and
// delivers them once buffers are posted, so a frame left on the hub would
// fill the first receive a test posts. (QEMU 10.0 drops them when the NIC
// resets, so this finds none between endpoints; it is the check that
// stays true when that changes.) B takes frames until a marker from A
// arrives behind them; A then fills B's still-posted buffers so that none
// stays posted, and every buffer goes back to the pool. It returns how
// many stale frames it dropped.
func (e *Endpoint) drain(ctx context.Context) (int, error) {
	posted := min(32, e.brx.Size()-e.p.d.Reserved)
	for range posted {
		if err := e.brx.PostRecv(nil); err != nil {
			return 0, err
		}
	}
	if err := e.brx.Flush(); err != nil {
		return 0, err
	}
	marker := func(kind byte, nonce uint64) []byte {
		f := append([]byte(nil), e.frame[:EthHdr]...)
		f = append(append(f, "drain"...), kind)
		f = binary.BigEndian.AppendUint64(f, nonce)
		return append(f, make([]byte, max(0, e.p.d.PadTo-len(f)))...) // as the device pads it
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
			return stale, e.p.errorf("draining %s: %w", e.b.Info().Address, err)
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
		reclaim(e.atx)
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
			return stale, e.p.errorf("filling %d posted buffers of %s: %w", left, e.b.Info().Address, err)
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
			return stale, e.p.errorf("%d sends of %s did not complete", e.atx.Outstanding(), e.a.Info().Address)
		}
		reclaim(e.atx)
	}
	return stale, nil
}

// sendRaw sends f on an unbound transmit queue, reclaiming completions
// when the ring is full.
func (e *Endpoint) sendRaw(q TxQueue, f []byte) error {
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
		reclaim(q)
	}
}

// reclaim reads the completions of an unbound transmit queue.
func reclaim(q TxQueue) {
	var comps [32]nic.Completion
	for q.Poll(comps[:]) == len(comps) {
	}
}

// Addr implements conformance.Endpoint: A's MAC, which its frames carry.
func (e *Endpoint) Addr() cq.Addr {
	var a [8]byte
	copy(a[2:], e.a.MAC())
	return cq.Addr(binary.BigEndian.Uint64(a[:]))
}

// Send implements conformance.Endpoint: payload, behind an Ethernet header
// to B, out of A's transmit queue. It allocates nothing.
func (e *Endpoint) Send(ctx any, payload []byte, o conformance.SendOpts) error {
	if o.HasData || o.Tagged {
		return e.p.errorf("%w: Ethernet frames carry no remote CQ data or tag", cq.ErrNotSupported)
	}
	if len(payload) > len(e.frame)-EthHdr {
		return e.p.errorf("%w: %d-byte payload in a %d-byte frame", cq.ErrInvalid, len(payload), len(e.frame))
	}
	e.mu.Lock()
	n := copy(e.frame[EthHdr:], payload)
	err := e.atx.Send(e.frame[:EthHdr+n], ctx)
	if err == nil {
		err = e.atx.Flush()
	}
	e.mu.Unlock()
	if errors.Is(err, nic.ErrFull) {
		return e.p.errorf("transmit ring full, read completions: %w", cq.ErrAgain)
	}
	return err
}

// PostRecv implements conformance.Endpoint with one of B's receive buffers,
// whose frame area it returns: a buffer holds a whole frame, so it is at
// least size bytes (sizes beyond that are refused).
func (e *Endpoint) PostRecv(ctx any, size int, o conformance.RecvOpts) ([]byte, error) {
	if o.MultiRecv {
		return nil, e.p.errorf("%w: one receive buffer holds one frame", cq.ErrNotSupported)
	}
	if size <= 0 || size > e.brx.MaxFrame() {
		return nil, e.p.errorf("%w: a %d-byte receive (buffers hold %d)", cq.ErrInvalid, size, e.brx.MaxFrame())
	}
	buf, err := e.brx.PostRecvBuf(ctx)
	if errors.Is(err, nic.ErrFull) {
		return nil, e.p.errorf("%w", errors.Join(ring.ErrFull, err))
	}
	if err != nil {
		return nil, err
	}
	return buf, e.brx.Flush()
}

// FailNext implements conformance.Endpoint: not possible (Caps.NoFailNext):
// neither driver's transmit completions carry a status.
func (e *Endpoint) FailNext() error {
	return e.p.errorf("%w: a send cannot be made to fail on demand", cq.ErrNotSupported)
}

// Flush implements conformance.Endpoint: it waits until the device has
// completed every send posted so far, without reading their completions
// (QEMU hands a frame to the hub, and so to B, before it completes the
// send).
func (e *Endpoint) Flush(ctx context.Context) error {
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
// the hub's host port (Driver.Oversize) for a frame 1000 bytes longer than
// B's buffers hold, to B's MAC; the host sends it, then an answer to A's
// receive queue. QEMU delivers the datagrams of its socket in order, so
// when the answer is in, B has the frame (or holds it until enough buffers
// are posted). The device spreads the frame over several buffers, and the
// driver completes each of them with cq.ProvMultiBuffer (cq.ETRUNC).
func (e *Endpoint) RecvOversize(ctx context.Context) (int, error) {
	req, nbufs, answer, err := e.p.d.Oversize(e, e.brx.MaxFrame()+1000)
	if err != nil {
		return 0, err
	}
	e.ctl.Lock()
	defer e.ctl.Unlock()
	if err := e.sendRaw(e.btx, req); err != nil {
		return 0, err
	}
	var comps [8]nic.Completion
	for {
		n, err := e.arx.SRead(ctx, comps[:], 1, -1)
		if err != nil {
			return 0, e.p.errorf("waiting for the host's oversized frame: %w", err)
		}
		done := false
		for _, c := range comps[:n] {
			if c.Err != nil {
				continue
			}
			if answer(c.Data) {
				done = true
			}
			if err := e.arx.Repost(c.Buf, nil); err != nil {
				return 0, err
			}
		}
		if err := e.arx.Flush(); err != nil {
			return 0, err
		}
		reclaim(e.btx)
		if done {
			e.p.mu.Lock()
			e.p.st.Oversize++
			e.p.mu.Unlock()
			return nbufs, nil
		}
	}
}

// Close implements conformance.Endpoint: closing both devices resets them,
// which unbinds their queues from the CQ. Idempotent.
func (e *Endpoint) Close() error {
	e.once.Do(func() {
		e.cerr = errors.Join(e.a.Close(), e.b.Close())
		e.p.mu.Lock()
		e.p.busy[e.pair] = false
		e.p.st.Open--
		e.p.mu.Unlock()
	})
	return e.cerr
}
