package qpsim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/dma"
	"github.com/vfnic/vfnic/doorbell"
	"github.com/vfnic/vfnic/eventfd"
	"github.com/vfnic/vfnic/hugepage"
)

// Errors returned by the software device.
var (
	// ErrClosed means the device, queue pair or memory is closed. It is
	// os.ErrClosed.
	ErrClosed = os.ErrClosed
	// ErrQueueFull means a send or receive queue (or its table of posted
	// operations) has no room; it matches cq.ErrAgain, like fi_send's
	// -FI_EAGAIN.
	ErrQueueFull = fmt.Errorf("sim: queue full: %w", cq.ErrAgain)
	// ErrBadBuffer means a buffer is not in the device's DMA memory.
	ErrBadBuffer = errors.New("sim: buffer outside device memory")
	// ErrUnknownCQ means a CQ was not opened on this device.
	ErrUnknownCQ = errors.New("sim: CQ not opened on this device")
	// ErrTooBig means a frame longer than MaxFrame.
	ErrTooBig = errors.New("sim: frame too long")
)

// MaxFrame is the longest frame a send may carry.
const MaxFrame = 2048

// Config tunes the device.
type Config struct {
	// PageSize backs the device's DMA memory; 0 means 4 KiB pages (the
	// software device needs no hugepages).
	PageSize hugepage.Size
	// IdleSpin is how long the device keeps polling after its last work
	// before it sleeps; 0 means 50µs.
	IdleSpin time.Duration
	// IdleSleep bounds one sleep, a safety net for a missed kick; 0 means
	// 20ms.
	IdleSleep time.Duration
}

type region struct {
	iova uint64
	b    []byte
}

// Device is a software NIC. Its methods are safe for concurrent use.
type Device struct {
	cfg   Config
	space *dma.Space
	kick  *eventfd.FD
	epoch time.Time

	mu      sync.Mutex // held by the device loop for each step, and by control operations
	closed  bool
	cqs     map[*cq.CQ]*devCQ
	cqList  []*devCQ // the same, for the loop: no map iteration per pass
	now     time.Duration
	nowOK   bool
	fired   bool // an interrupt was raised in this pass
	qps     []*QP
	byAddr  map[cq.Addr]*QP
	nextQP  uint32
	mems    map[*Memory]struct{}
	stats   Stats
	regions atomic.Pointer[[]region] // sorted by iova; copied on write under mu

	sleeping atomic.Uint32
	stop     atomic.Bool
	steps    atomic.Uint64
	done     chan struct{}
}

// Stats count the device's traffic.
type Stats struct {
	Frames    uint64 // frames sent
	Delivered uint64 // frames placed in a receive buffer
	RxDropped uint64 // frames dropped: no receive buffer, or no such destination
}

// New starts a software device.
func New(cfg Config) (*Device, error) {
	if cfg.PageSize == 0 {
		cfg.PageSize = hugepage.Size4K
	}
	if cfg.IdleSpin <= 0 {
		cfg.IdleSpin = 50 * time.Microsecond
	}
	if cfg.IdleSleep <= 0 {
		cfg.IdleSleep = 20 * time.Millisecond
	}
	kick, err := eventfd.New()
	if err != nil {
		return nil, fmt.Errorf("sim: kick: %w", err)
	}
	d := &Device{
		cfg: cfg, space: dma.NewIdentitySpace(), kick: kick, epoch: time.Now(),
		cqs: map[*cq.CQ]*devCQ{}, byAddr: map[cq.Addr]*QP{}, mems: map[*Memory]struct{}{},
		done: make(chan struct{}),
	}
	empty := []region{}
	d.regions.Store(&empty)
	go d.loop()
	return d, nil
}

// Now returns the device clock: the time since the device started. CQ
// statistics stamp entries with it.
func (d *Device) Now() time.Duration { return time.Since(d.epoch) }

// Stats returns the traffic counters.
func (d *Device) Stats() Stats {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stats
}

// alloc maps device memory and makes it reachable by the device. Called
// with d.mu held.
func (d *Device) alloc(size int) (*dma.Region, error) {
	if d.closed {
		return nil, ErrClosed
	}
	r, err := d.space.Alloc(size, hugepage.Options{PageSize: d.cfg.PageSize, AllowFallback: true})
	if err != nil {
		return nil, fmt.Errorf("sim: allocate %d bytes: %w", size, err)
	}
	old := *d.regions.Load()
	rs := make([]region, 0, len(old)+1)
	rs = append(rs, old...)
	rs = append(rs, region{iova: r.IOVA(), b: r.Bytes()})
	sort.Slice(rs, func(i, j int) bool { return rs[i].iova < rs[j].iova })
	d.regions.Store(&rs)
	return r, nil
}

// free makes a region unreachable, then unmaps it. Called with d.mu held,
// so the device loop is not inside a step that could use it.
func (d *Device) free(r *dma.Region) error {
	old := *d.regions.Load()
	rs := make([]region, 0, len(old))
	for _, x := range old {
		if x.iova != r.IOVA() {
			rs = append(rs, x)
		}
	}
	d.regions.Store(&rs)
	return r.Close()
}

// translate returns the n bytes at iova, or nil when they are not all
// inside one region of device memory: the device's IOMMU.
func (d *Device) translate(iova uint64, n uint32) []byte {
	rs := *d.regions.Load()
	lo, hi := 0, len(rs) // find the last region starting at or below iova
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if rs[m].iova <= iova {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo == 0 {
		return nil
	}
	r := rs[lo-1]
	off := iova - r.iova
	if off > uint64(len(r.b)) || uint64(len(r.b))-off < uint64(n) {
		return nil
	}
	return r.b[off : off+uint64(n) : off+uint64(n)]
}

// Memory is device-reachable memory for buffers, such as receive buffers.
type Memory struct {
	d *Device
	r *dma.Region
}

// Alloc maps size bytes of buffer memory the device can reach; Close (or
// the device's Close) frees it.
func (d *Device) Alloc(size int) (*Memory, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	r, err := d.alloc(size)
	if err != nil {
		return nil, err
	}
	m := &Memory{d: d, r: r}
	d.mems[m] = struct{}{}
	return m, nil
}

// Region returns the dma region, to carve buffers or make a dma.Pool.
func (m *Memory) Region() *dma.Region { return m.r }

// Bytes returns the memory (nil after Close).
func (m *Memory) Bytes() []byte { return m.r.Bytes() }

// Close frees the memory once the device can no longer reach it.
func (m *Memory) Close() error {
	m.d.mu.Lock()
	defer m.d.mu.Unlock()
	if _, ok := m.d.mems[m]; !ok {
		return nil
	}
	delete(m.d.mems, m)
	return m.d.free(m.r)
}

// kickDevice wakes the device loop if it said it is asleep. Called by the
// driver side after a doorbell write.
func (d *Device) kickDevice() {
	// The doorbell store must be visible before the flag is read, and the
	// device sets the flag before its last look at the doorbells
	// (Dekker): a full fence on each side.
	doorbell.Mb()
	if d.sleeping.Load() != 0 {
		_ = d.kick.Add(1)
	}
}

// loop is the device: it runs on its own OS thread until Close.
func (d *Device) loop() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer close(d.done)
	lastWork := time.Now()
	spins := 0
	for !d.stop.Load() {
		if d.step() {
			spins = 0
			lastWork = time.Time{}
			continue
		}
		spins++
		if spins&63 != 0 {
			continue
		}
		now := time.Now()
		if lastWork.IsZero() {
			lastWork = now
		}
		if now.Sub(lastWork) < d.cfg.IdleSpin {
			continue
		}
		// Idle: announce the sleep, look once more, then block until a
		// driver kicks or the safety timeout passes.
		d.sleeping.Store(1)
		if d.step() || d.stop.Load() {
			d.sleeping.Store(0)
			lastWork = time.Time{}
			continue
		}
		_, _ = d.kick.Wait(context.Background(), time.Now().Add(d.cfg.IdleSleep))
		d.sleeping.Store(0)
		lastWork = time.Time{}
	}
}

// step does one pass over every queue and CQ; it reports whether there was
// work.
func (d *Device) step() bool {
	d.mu.Lock()
	work := false
	for _, q := range d.qps {
		if d.stepQP(q) {
			work = true
		}
	}
	for _, c := range d.cqList {
		if d.stepCQ(c) {
			work = true
		}
	}
	d.nowOK = false
	fired := d.fired
	d.fired = false
	d.mu.Unlock()
	d.steps.Add(1)
	if fired {
		// The goroutine the interrupt readies is found by the runtime's
		// network poller, which no thread may be running: this locked,
		// spinning goroutine took the P of the thread that was, when a kick
		// woke it. Yielding runs the scheduler, which polls, so the reader
		// wakes now rather than when the device next sleeps.
		runtime.Gosched()
	}
	return work
}

// stamp returns the device clock for an entry written in this pass: read
// once per pass, as the clock costs more than writing an entry.
func (d *Device) stamp() time.Duration {
	if !d.nowOK {
		d.now, d.nowOK = d.Now(), true
	}
	return d.now
}

// Sync waits until the device has made two full passes over its queues,
// so everything posted before the call has been processed.
func (d *Device) Sync(ctx context.Context) error {
	if ctx == nil {
		return fmt.Errorf("%w: nil context", cq.ErrInvalid)
	}
	start := d.steps.Load()
	for d.steps.Load() < start+2 {
		if d.stop.Load() {
			return ErrClosed
		}
		_ = d.kick.Add(1)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Microsecond):
		}
	}
	return nil
}

// Close stops the device loop, closes every queue pair and CQ opened on it
// and frees all its memory. It is idempotent.
func (d *Device) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	d.mu.Unlock()
	d.stop.Store(true)
	_ = d.kick.Add(1)
	<-d.done

	d.mu.Lock()
	qps := append([]*QP(nil), d.qps...)
	cqs := make([]*cq.CQ, 0, len(d.cqs))
	for c := range d.cqs {
		cqs = append(cqs, c)
	}
	mems := make([]*Memory, 0, len(d.mems))
	for m := range d.mems {
		mems = append(mems, m)
	}
	d.mu.Unlock()

	var errs []error
	for _, q := range qps {
		errs = append(errs, q.Close())
	}
	for _, c := range cqs {
		errs = append(errs, c.Close())
	}
	for _, m := range mems {
		errs = append(errs, m.Close())
	}
	errs = append(errs, d.space.Close(), d.kick.Close())
	return errors.Join(errs...)
}
