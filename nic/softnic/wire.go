package softnic

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"net"
	"strings"
	"sync"

	"github.com/vfnic/vfnic/nic"
)

// Scheme is the name scheme the package registers with nic.Register:
// nic.Open(ctx, "softnic:NAME/0", cfg) opens end 0 of the wire NAME.
const Scheme = "softnic"

// Errors of opening an end.
var (
	// ErrInUse means the end of the wire is open already: each end is one
	// device, opened once at a time.
	ErrInUse = errors.New("softnic: wire end already open")
	// ErrBadName means a name that is not NAME/0 or NAME/1.
	ErrBadName = fmt.Errorf("%w: softnic: a device name is NAME/0 or NAME/1 (NAME of letters, digits, '.', '_', '-')", nic.ErrInvalid)
)

func init() {
	if err := nic.Register(nic.Driver{Name: "softnic", Scheme: Scheme, OpenName: openName}); err != nil {
		panic(err) // a second package registering the scheme: a build mistake
	}
}

// Options configure a wire.
type Options struct {
	// MTU is the largest payload the wire carries; 0 means 1500. Frames
	// of up to MTU+nic.FrameOverhead bytes are sent.
	MTU int
	// MaxQueuePairs is the most queue pairs an end offers; 0 means 16.
	MaxQueuePairs int
}

// Faults make the wire misbehave, for the frames one end sends. Each is a
// probability per frame, from 0 (never) to 1 (every frame); the draws
// come from a generator seeded with Seed (0 means 1), so a run is
// repeatable for the same sequence of frames.
type Faults struct {
	// Drop loses the frame.
	Drop float64
	// Corrupt flips one bit of the frame, at or after byte 34 (past the
	// Ethernet and IPv4 headers; a frame that short is left alone): the
	// wire has no frame check sequence, so the checksums above Ethernet
	// are what must catch it.
	Corrupt float64
	// Reorder holds the frame back and delivers it right after the next
	// frame sent the same way.
	Reorder float64
	// Duplicate delivers the frame twice.
	Duplicate float64
	// Seed seeds the generator.
	Seed uint64
}

// WireStats count what happened to the frames one end sent.
type WireStats struct {
	// Sent counts frames the end's transmit queues handed to the wire.
	Sent uint64
	// Delivered counts frames placed in the peer's receive buffers
	// (duplicates included).
	Delivered uint64
	// Dropped counts frames lost on purpose (Faults.Drop) or because the
	// link was down or the peer closed.
	Dropped uint64
	// NoBuffer counts frames the peer's receive queue had no posted
	// buffer for, as a NIC drops them.
	NoBuffer uint64
	// Corrupted, Reordered and Duplicated count the faults applied.
	Corrupted, Reordered, Duplicated uint64
	// Held is 1 while a reordered frame waits for the next one, 0
	// otherwise.
	Held uint64
}

// way is one direction of the wire: the frames end from sends to the
// other end.
type way struct {
	mu     sync.Mutex
	faults Faults
	rng    uint64
	held   []byte // a reordered frame, delivered after the next one
	buf    []byte // a corrupted frame's copy
	stats  WireStats
}

// draw returns true with probability p. Called with mu held.
func (w *way) draw(p float64) bool {
	if p <= 0 {
		return false
	}
	if p >= 1 {
		return true
	}
	return float64(w.next()>>11)/(1<<53) < p
}

// next is xorshift64. Called with mu held.
func (w *way) next() uint64 {
	if w.rng == 0 {
		w.rng = w.faults.Seed
		if w.rng == 0 {
			w.rng = 1
		}
	}
	w.rng ^= w.rng << 13
	w.rng ^= w.rng >> 7
	w.rng ^= w.rng << 17
	return w.rng
}

// Wire joins two software NICs, end 0 and end 1: a frame one end sends
// lands in a posted receive buffer of the other. Its methods are safe for
// concurrent use.
type Wire struct {
	name string
	opt  Options
	// named wires are reachable by nic.Open; implicit ones (made by the
	// first nic.Open of a name) go when both ends are closed.
	named, implicit bool
	seed            maphash.Seed

	mu   sync.Mutex
	ends [2]*Device // open ends
	down bool       // SetLink(false)

	ways [2]way // ways[i]: frames end i sends
}

var (
	regMu sync.Mutex
	wires = map[string]*Wire{}
)

// NewWire makes a wire. A wire with a name is reachable through nic.Open
// ("softnic:NAME/0" and "softnic:NAME/1") until Close; "" makes one only
// this handle reaches (Open its ends).
func NewWire(name string, opt Options) (*Wire, error) {
	if name != "" && !validName(name) {
		return nil, ErrBadName
	}
	w, err := newWire(name, opt)
	if err != nil || name == "" {
		return w, err
	}
	regMu.Lock()
	defer regMu.Unlock()
	if _, ok := wires[name]; ok {
		return nil, fmt.Errorf("%w: softnic: wire %q exists", nic.ErrInvalid, name)
	}
	w.named = true
	wires[name] = w
	return w, nil
}

func newWire(name string, opt Options) (*Wire, error) {
	if opt.MTU == 0 {
		opt.MTU = 1500
	}
	if opt.MaxQueuePairs == 0 {
		opt.MaxQueuePairs = 16
	}
	if opt.MTU < 68 || opt.MTU > 65535-nic.FrameOverhead || opt.MaxQueuePairs < 1 || opt.MaxQueuePairs > 256 {
		return nil, fmt.Errorf("%w: softnic: MTU %d (68 to %d), %d queue pairs (1 to 256)",
			nic.ErrInvalid, opt.MTU, 65535-nic.FrameOverhead, opt.MaxQueuePairs)
	}
	return &Wire{name: name, opt: opt, seed: maphash.MakeSeed()}, nil
}

// Pair opens both ends of a new unnamed wire with the wire's defaults
// (Options{}), each with cfg: the quickest way to two NICs that talk.
func Pair(cfg nic.Config) (*Device, *Device, error) {
	w, _ := newWire("", Options{}) // the defaults are valid
	a, err := w.Open(0, cfg)
	if err != nil {
		return nil, nil, err
	}
	b, err := w.Open(1, cfg)
	if err != nil {
		return nil, nil, errors.Join(err, a.Close())
	}
	return a, b, nil
}

// validName: letters, digits, '.', '_', '-'.
func validName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, c := range []byte(s) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

// openName is the driver's nic.Driver.OpenName: "NAME/0" or "NAME/1". A
// name no wire has yet makes one with the default Options, which lasts
// while one of its ends is open.
func openName(ctx context.Context, name string, cfg nic.Config) (nic.Device, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	wname, end, ok := strings.Cut(name, "/")
	if !ok || !validName(wname) || (end != "0" && end != "1") {
		return nil, fmt.Errorf("%w, not %q", ErrBadName, name)
	}
	// Held while the end opens, so that the other end closing meanwhile
	// cannot drop the wire from the registry under it.
	regMu.Lock()
	defer regMu.Unlock()
	w := wires[wname]
	if w == nil {
		w, _ = newWire(wname, Options{}) // the defaults are valid
		w.named, w.implicit = true, true
		wires[wname] = w
	}
	d, err := w.Open(int(end[0]-'0'), cfg)
	if err != nil {
		w.forgetLocked()
		return nil, err
	}
	return d, nil
}

// forget drops an implicit wire from the registry once no end is open.
func (w *Wire) forget() {
	if !w.implicit {
		return
	}
	regMu.Lock()
	defer regMu.Unlock()
	w.forgetLocked()
}

// forgetLocked is forget with regMu held.
func (w *Wire) forgetLocked() {
	if !w.implicit {
		return
	}
	w.mu.Lock()
	idle := w.ends[0] == nil && w.ends[1] == nil
	w.mu.Unlock()
	if idle && wires[w.name] == w {
		delete(wires, w.name)
	}
}

// Close makes a named wire unreachable through nic.Open (open ends stay
// open). Idempotent.
func (w *Wire) Close() error {
	regMu.Lock()
	defer regMu.Unlock()
	if w.named && wires[w.name] == w {
		delete(wires, w.name)
	}
	return nil
}

// Name is the wire's name ("" for an unnamed one).
func (w *Wire) Name() string { return w.name }

// Open opens end 0 or 1 as a NIC with cfg (see Device).
func (w *Wire) Open(end int, cfg nic.Config) (*Device, error) {
	if end != 0 && end != 1 {
		return nil, fmt.Errorf("%w: softnic: end %d (0 or 1)", nic.ErrInvalid, end)
	}
	w.mu.Lock()
	busy := w.ends[end] != nil
	w.mu.Unlock()
	if busy {
		return nil, fmt.Errorf("%w: %s", ErrInUse, w.address(end))
	}
	d, err := newDevice(w, end, cfg)
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	if w.ends[end] != nil {
		w.mu.Unlock()
		_ = d.Close()
		return nil, fmt.Errorf("%w: %s", ErrInUse, w.address(end))
	}
	w.ends[end] = d
	peer := w.ends[1-end]
	w.mu.Unlock()
	if peer != nil {
		peer.linkChanged()
	}
	return d, nil
}

// address names an end as nic.Open takes it.
func (w *Wire) address(end int) string {
	if w.name == "" {
		return fmt.Sprintf("%s:(unnamed %p)/%d", Scheme, w, end)
	}
	return fmt.Sprintf("%s:%s/%d", Scheme, w.name, end)
}

// closed takes an end off the wire. A device that never made it onto the
// wire (two opens of one end at once) changes nothing.
func (w *Wire) closed(d *Device) {
	w.mu.Lock()
	on := w.ends[d.end] == d
	if on {
		w.ends[d.end] = nil
	}
	peer := w.ends[1-d.end]
	w.mu.Unlock()
	if !on {
		return
	}
	if peer != nil {
		peer.linkChanged()
	}
	w.forget()
}

// SetFaults sets the faults of the frames both ends send.
func (w *Wire) SetFaults(f Faults) {
	w.SetFaultsFrom(0, f)
	w.SetFaultsFrom(1, f)
}

// SetFaultsFrom sets the faults of the frames end sends (0 or 1; others
// are ignored). A frame held back for reordering is delivered when the
// next one passes, whatever the new faults.
func (w *Wire) SetFaultsFrom(end int, f Faults) {
	if end != 0 && end != 1 {
		return
	}
	wy := &w.ways[end]
	wy.mu.Lock()
	wy.faults, wy.rng = f, 0
	wy.mu.Unlock()
}

// SetLink takes the link down (false: every frame is dropped, and both
// ends report the link down) or up again.
func (w *Wire) SetLink(up bool) {
	w.mu.Lock()
	changed := w.down == up
	w.down = !up
	ends := w.ends
	w.mu.Unlock()
	if changed {
		for _, d := range ends {
			if d != nil {
				d.linkChanged()
			}
		}
	}
}

// up reports whether frames from end can reach an open peer.
func (w *Wire) up(end int) (*Device, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	peer := w.ends[1-end]
	return peer, peer != nil && !w.down
}

// Stats returns what happened to the frames end sent.
func (w *Wire) Stats(end int) WireStats {
	if end != 0 && end != 1 {
		return WireStats{}
	}
	wy := &w.ways[end]
	wy.mu.Lock()
	defer wy.mu.Unlock()
	s := wy.stats
	if wy.held != nil {
		s.Held = 1
	}
	return s
}

// carry takes a frame that end's transmit queue txq sent to the peer,
// with the faults of that way. Called with the transmit ring's lock held;
// frame is only read during the call.
func (w *Wire) carry(end, txq int, frame []byte) {
	wy := &w.ways[end]
	wy.mu.Lock()
	defer wy.mu.Unlock()
	wy.stats.Sent++
	peer, up := w.up(end)
	if !up {
		wy.stats.Dropped++
		return
	}
	f := &wy.faults
	if wy.draw(f.Drop) {
		wy.stats.Dropped++
		return
	}
	if wy.draw(f.Corrupt) && len(frame) > 34 {
		wy.buf = append(wy.buf[:0], frame...)
		frame = wy.buf
		at := 34 + int(wy.next()%uint64(len(frame)-34))
		frame[at] ^= 1 << (wy.next() % 8)
		wy.stats.Corrupted++
	}
	held := wy.held
	if wy.draw(f.Reorder) && held == nil {
		wy.held = append(wy.held[:0:0], frame...)
		wy.stats.Reordered++
		return
	}
	copies := 1
	if wy.draw(f.Duplicate) {
		copies = 2
		wy.stats.Duplicated++
	}
	q := peer.steer(frame, txq)
	for range copies {
		w.deliver(wy, peer, q, frame)
	}
	if held != nil {
		wy.held = nil
		w.deliver(wy, peer, peer.steer(held, txq), held)
	}
}

// deliver hands a frame to the peer's receive queue q. Called with the
// way's lock held.
func (w *Wire) deliver(wy *way, peer *Device, q int, frame []byte) {
	switch peer.rx[q].receive(frame) {
	case received:
		wy.stats.Delivered++
	case noBuffer:
		wy.stats.NoBuffer++
	default:
		wy.stats.Dropped++
	}
}

// steer picks the receive queue for a frame, as RSS does: a hash of the
// IPv4 or IPv6 addresses and, for TCP and UDP, the ports (so a flow stays
// on one queue, in order); other frames go to the queue with the sending
// queue's index, modulo the queue pairs.
func (d *Device) steer(frame []byte, txq int) int {
	n := len(d.rx)
	if n == 1 {
		return 0
	}
	var key []byte
	var buf [36]byte
	if len(frame) >= 14 {
		l3 := frame[14:]
		switch binary.BigEndian.Uint16(frame[12:]) {
		case 0x0800: // IPv4
			if len(l3) >= 20 && l3[0]>>4 == 4 {
				ihl := int(l3[0]&15) * 4
				key = l3[12:20]
				if p := l3[9]; (p == 6 || p == 17) && len(l3) >= ihl+4 && ihl >= 20 &&
					binary.BigEndian.Uint16(l3[6:])&0x3fff == 0 { // not a fragment
					key = append(append(buf[:0], key...), l3[ihl:ihl+4]...)
				}
			}
		case 0x86dd: // IPv6
			if len(l3) >= 40 {
				key = l3[8:40]
				if p := l3[6]; (p == 6 || p == 17) && len(l3) >= 44 {
					key = append(append(buf[:0], key...), l3[40:44]...)
				}
			}
		}
	}
	if key == nil {
		return txq % n
	}
	return int(maphash.Bytes(d.wire.seed, key) % uint64(n))
}

// mac is the MAC of end on wire w: locally administered, unicast,
// from the wire's name (or its address, unnamed), the last byte the end.
func (w *Wire) mac(end int) net.HardwareAddr {
	var h uint64
	if w.name != "" {
		h = maphash.String(fixedSeed, w.name)
	} else {
		h = maphash.Comparable(w.seed, w)
	}
	return net.HardwareAddr{0x02, byte(h >> 24), byte(h >> 16), byte(h >> 8), byte(h), byte(1 + end)}
}

// fixedSeed makes a named wire's MACs the same for every open in a process.
var fixedSeed = maphash.MakeSeed()
