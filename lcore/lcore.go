package lcore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vfnic/vfnic/eventfd"
	"github.com/vfnic/vfnic/nic"
	"golang.org/x/sys/unix"
)

// Mode says what a core does when its queues are empty.
type Mode uint8

// Modes. The zero Mode is Adaptive: a Go server's core should not burn a
// CPU while its queues are idle.
const (
	// Adaptive polls while work arrives and sleeps on the queues'
	// interrupts after Config.IdleInterval without any.
	Adaptive Mode = iota
	// Busy polls without pause.
	Busy
	// Interrupt sleeps on the queues' interrupts as soon as a round of
	// polls finds nothing (SRead's semantics).
	Interrupt
)

var modeNames = [...]string{Adaptive: "adaptive", Busy: "busy", Interrupt: "interrupt"}

// String returns the mode's name as ParseMode reads it.
func (m Mode) String() string {
	if int(m) < len(modeNames) {
		return modeNames[m]
	}
	return fmt.Sprintf("Mode(%d)", m)
}

// ParseMode reads a mode name: "busy", "adaptive" or "interrupt".
func ParseMode(s string) (Mode, error) {
	for m, name := range modeNames {
		if s == name {
			return Mode(m), nil
		}
	}
	return 0, fmt.Errorf("%w: mode %q (want busy, adaptive or interrupt)", os.ErrInvalid, s)
}

// Defaults of Config's zero fields.
const (
	// DefaultBatch is DPDK's usual burst size: enough to amortise a
	// doorbell and a lock per batch, small enough to stay in L1.
	DefaultBatch = 32
	// DefaultIdleInterval is how long an adaptive core polls empty queues
	// before it sleeps: DPDK l3fwd-power's 300 polls of 1 µs pauses
	// (SUSPEND_THRESHOLD). A loaded queue's frames can come in bursts
	// hundreds of microseconds apart (a host's socket batches, a guest's
	// timer tick); at 100 µs the core slept in those gaps 1,100-1,400
	// times in 5 s of full-load receive on virtio and paid a wake-up for
	// each, at 300 µs 250-430 times (bench/vm). A trickle of frames costs
	// at most 300 µs of polling per burst.
	DefaultIdleInterval = 300 * time.Microsecond
	// MaxBatch is the largest Batch: the largest ring a driver makes
	// (virtio's 32768 descriptors). A poll cannot return more than a
	// ring holds, and the core allocates its buffer for Batch.
	MaxBatch = 32768
)

// Errors.
var (
	// ErrCPU means Config.CPU names a CPU the process may not run on, or
	// no CPU at all. It matches os.ErrInvalid.
	ErrCPU = fmt.Errorf("lcore: bad CPU: %w", os.ErrInvalid)
	// ErrStarted means the core was already started (Run, Start), or
	// that a queue or function was added to a started core.
	ErrStarted = errors.New("lcore: core already started")
	// ErrNotStarted means Wait was called on a core that was never
	// started (Run, Start).
	ErrNotStarted = errors.New("lcore: core not started")
	// ErrSelfWait means Wait was called from a Handler or Func of the core
	// it waits for: the core cannot stop while its own thread waits.
	ErrSelfWait = errors.New("lcore: Wait called on the core's own thread")
)

// Config says how a core runs. The zero Config pins the core to CPU 0,
// in Adaptive mode, with the default batch and idle interval.
type Config struct {
	// CPU is the CPU the core's thread is pinned to; AnyCPU locks the
	// core to a thread without pinning it. It must be among the process's
	// allowed CPUs (AllowedCPUs).
	CPU int
	// Mode is Adaptive (the zero value), Busy or Interrupt.
	Mode Mode
	// Batch is the most completions read from one queue per poll, up to
	// MaxBatch; 0 means DefaultBatch.
	Batch int
	// IdleInterval is how long an Adaptive core polls without finding
	// work before it sleeps; 0 means DefaultIdleInterval. While a
	// transmit queue has sends outstanding it polls up to 32 intervals,
	// since their completions are on the way.
	IdleInterval time.Duration
	// KeepIRQAffinity leaves the queues' interrupts on the CPUs the
	// system chose. By default a pinned Adaptive or Interrupt core
	// directs the interrupt of each queue that can be steered
	// (nic.InterruptSteerer) to its CPU when it starts, so that the
	// interrupt wakes its thread where it sleeps (see Core.Steered).
	KeepIRQAffinity bool
	// KeepSlice leaves the scheduler slice of the core's thread as it
	// is. By default a pinned Adaptive or Interrupt core asks Linux for
	// a short one (WakeSlice; Linux 6.12 and later honour it), so that
	// the interrupt that wakes it preempts the task running on its CPU
	// rather than waiting for that task to sleep or use up its slice
	// (see Core.Slice). The thread's share of the CPU is unchanged; on a
	// CPU it shares with busy tasks it runs in shorter turns.
	KeepSlice bool
}

// A Handler is given each batch of completions the core reads from q, on
// the core's thread. It hands received buffers back (Repost, Release) and
// may post (Send, PostRecv); the core flushes every queue once after the
// round. The batch is reused by the next poll: copy what must outlive the
// call. An error stops the core, and Run (or Wait, Close) returns it.
type Handler func(q nic.Queue, batch []nic.Completion) error

// A Func is called once per round, after the queues are polled, for work
// that completions do not drive (generating frames to send, timers,
// rings filled by other goroutines). It returns how much it did: a round
// in which every queue is empty and every Func returns 0 counts as idle.
// An error stops the core. A sleeping core does not call its Funcs: a
// Func whose work comes from another goroutine needs that goroutine to
// call Wake.
type Func func() (work int, err error)

// Stats are a core's counters. They are published by the core's thread
// every 1024 rounds, before it sleeps and when it stops.
type Stats struct {
	// Polls counts rounds (one poll of every queue and a call of every
	// Func); EmptyPolls those that found no work.
	Polls, EmptyPolls uint64
	// Completions counts completions read from the queues.
	Completions uint64
	// Sleeps counts the times the core slept on its queues' interrupts;
	// Wakeups the times it was woken (interrupt, Wake, Close, context).
	Sleeps, Wakeups uint64
}

type queueEntry struct {
	q nic.Queue
	h Handler
	// tx: a transmit queue (and not also a receive one), whose
	// outstanding operations the device owes completions for.
	tx bool
	// irqs counts the interrupts the core took from q's eventfd (a
	// pointer: entries are copied as the slice grows).
	irqs *atomic.Uint64
}

// Core is a polling core. Create it with New, add queues and functions,
// then Start it (or Run it on the calling goroutine); Close stops it.
type Core struct {
	cfg    Config
	queues []queueEntry
	funcs  []Func
	buf    []nic.Completion
	wake   *eventfd.FD // Wake, Close and the context write it

	stop atomic.Bool
	tid  atomic.Int64

	mu       sync.Mutex
	steered  int           // queues whose interrupt was steered to the CPU
	steerErr error         // why the others were not
	slice    time.Duration // the slice the thread asked for, 0 if none
	sliceErr error         // why it could not
	started  bool
	closed   bool
	done     chan struct{} // closed when the loop has ended
	err      error         // the loop's result, set before done closes

	st  Stats // the loop's counters, owned by its thread
	pub struct{ polls, empty, comps, sleeps, wakeups atomic.Uint64 }
}

// New returns a core that is not started yet. It checks cfg, including
// that CPU is one the process may run on (ErrCPU otherwise).
func New(cfg Config) (*Core, error) {
	switch {
	case cfg.Mode > Interrupt:
		return nil, fmt.Errorf("%w: lcore: mode %d", os.ErrInvalid, cfg.Mode)
	case cfg.Batch < 0 || cfg.Batch > MaxBatch:
		return nil, fmt.Errorf("%w: lcore: batch %d (0 to %d)", os.ErrInvalid, cfg.Batch, MaxBatch)
	case cfg.IdleInterval < 0:
		return nil, fmt.Errorf("%w: lcore: idle interval %v", os.ErrInvalid, cfg.IdleInterval)
	}
	if err := checkCPU(cfg.CPU); err != nil {
		return nil, err
	}
	if cfg.Batch == 0 {
		cfg.Batch = DefaultBatch
	}
	if cfg.IdleInterval == 0 {
		cfg.IdleInterval = DefaultIdleInterval
	}
	wake, err := eventfd.New()
	if err != nil {
		return nil, fmt.Errorf("lcore: %w", err)
	}
	return &Core{cfg: cfg, buf: make([]nic.Completion, cfg.Batch), wake: wake, done: make(chan struct{})}, nil
}

// Interrupts returns how many interrupts the core has taken from q's
// eventfd (0 for a queue it does not own): the count the queue's own
// Stats().Interrupts would have had, since the core reads the eventfd
// itself.
func (c *Core) Interrupts(q nic.Queue) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.queues {
		if e.q == q {
			return e.irqs.Load()
		}
	}
	return 0
}

// Config returns the core's configuration, defaults filled in.
func (c *Core) Config() Config { return c.cfg }

// AddQueue makes the core poll q and give its completions to h (nil
// discards them: a transmit queue whose completions need no action). In
// Adaptive and Interrupt modes q must have an interrupt (q.Interrupt() not
// nil). A queue belongs to one core: nothing else may read it, or wait on
// its interrupt, while the core runs. The core reads the interrupt eventfd
// itself, so the queue's Stats().Interrupts does not count them:
// Core.Interrupts does.
func (c *Core) AddQueue(q nic.Queue, h Handler) error {
	if q == nil {
		return fmt.Errorf("%w: lcore: nil queue", os.ErrInvalid)
	}
	if c.cfg.Mode != Busy && q.Interrupt() == nil {
		return fmt.Errorf("%w: lcore: queue %d has no interrupt to sleep on (use Busy mode)", nic.ErrNotSupported, q.Index())
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.usableLocked(); err != nil {
		return err
	}
	_, isTx := q.(nic.TxQueue)
	_, isRx := q.(nic.RxQueue)
	c.queues = append(c.queues, queueEntry{q: q, h: h, irqs: new(atomic.Uint64), tx: isTx && !isRx})
	return nil
}

// AddFunc makes the core call f once per round.
func (c *Core) AddFunc(f Func) error {
	if f == nil {
		return fmt.Errorf("%w: lcore: nil Func", os.ErrInvalid)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.usableLocked(); err != nil {
		return err
	}
	c.funcs = append(c.funcs, f)
	return nil
}

func (c *Core) usableLocked() error {
	switch {
	case c.closed:
		return fmt.Errorf("lcore: %w", os.ErrClosed)
	case c.started:
		return ErrStarted
	}
	return nil
}

// begin marks the core started.
func (c *Core) begin(ctx context.Context) error {
	if ctx == nil {
		return fmt.Errorf("%w: lcore: nil context", os.ErrInvalid)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.usableLocked(); err != nil {
		return err
	}
	c.started = true
	return nil
}

// end records the loop's result.
func (c *Core) end(err error) {
	c.err = err
	c.tid.Store(0)
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		// A Close from a Handler or Func could not wait to release the
		// wake eventfd. eventfd's Close is idempotent: a Close that
		// waited may release it again.
		_ = c.wake.Close()
	}
	close(c.done)
}

// onCore reports whether the caller runs on the core's thread, that is,
// in one of its Handlers or Funcs: the thread is locked to the core's
// goroutine while the core runs.
func (c *Core) onCore() bool {
	tid := c.tid.Load()
	return tid != 0 && tid == int64(unix.Gettid())
}

// Run runs the core on the calling goroutine until ctx ends, Close is
// called (both return nil), or a Handler or Func fails (its error). The
// goroutine is locked to its thread, which is pinned to Config.CPU while
// Run lasts; Run restores the thread's affinity and unlocks it before it
// returns.
//
// A Handler or Func that panics stops the core too: Run restores and
// unlocks the thread, and the panic goes on to Run's caller, which may
// recover it. The core is then stopped like one that failed: Wait and
// Close return an error that names the panic. One that calls
// runtime.Goexit stops the core the same way.
func (c *Core) Run(ctx context.Context) (err error) {
	if err := c.begin(ctx); err != nil {
		return err
	}
	runtime.LockOSThread()
	p, err := pin(c.cfg.CPU)
	if err != nil {
		runtime.UnlockOSThread()
		c.end(err)
		return err
	}
	sl := c.shortenSlice()
	// Deferred, so that a Handler's panic does not leave the caller's
	// thread locked and pinned, nor Close and Wait waiting for ever.
	returned := false
	defer func() {
		var r any
		if !returned {
			r = recover()
			err = abortErr(r)
		}
		if rerr := errors.Join(sl.restore(), p.restore(c.cfg.CPU)); rerr != nil {
			// Keep the thread locked: the goroutine's exit will discard it
			// rather than hand a pinned (or re-sliced) thread to other
			// goroutines.
			err = errors.Join(err, rerr)
		} else {
			runtime.UnlockOSThread()
		}
		c.end(err)
		if r != nil {
			panic(r) // the caller's to recover, with its original stack
		}
	}()
	c.steerInterrupts()
	err = c.loop(ctx, p)
	returned = true
	return err
}

// abortErr is the core's result when its loop did not return: r is what
// recover returned, nil for runtime.Goexit.
func abortErr(r any) error {
	if r == nil {
		return errors.New("lcore: a Handler or Func called runtime.Goexit")
	}
	return fmt.Errorf("lcore: a Handler or Func panicked: %v", r)
}

// Start runs the core on a goroutine of its own and returns once its
// thread is pinned (or with the pinning error). The core runs until ctx
// ends, Close is called or a Handler or Func fails; Wait returns the
// result. The thread is never given back to the scheduler: it ends with
// the core (or, if it is the process's main thread, Go parks it for good).
//
// A Handler or Func that panics on a started core ends the program, as a
// panic on any goroutine does: nothing can recover it. One that calls
// runtime.Goexit (a test's t.FailNow) stops the core, and Wait and Close
// return an error that says so.
func (c *Core) Start(ctx context.Context) error {
	if err := c.begin(ctx); err != nil {
		return err
	}
	ready := make(chan error, 1)
	go func() {
		// Never unlocked: the runtime ends a thread whose locked goroutine
		// exits, so the pinned thread does not outlive the core.
		runtime.LockOSThread()
		p, err := pin(c.cfg.CPU)
		var sl slice
		if err == nil {
			c.tid.Store(int64(p.tid)) // ThreadID works once Start returns
			c.steerInterrupts()       // and Steered
			sl = c.shortenSlice()     // and Slice
		}
		ready <- err
		if err != nil {
			c.end(err)
			return
		}
		// The thread usually ends with the goroutine, but Go parks the
		// main thread instead of ending it, and that one's affinity is
		// the process's: restore it either way. Deferred for Goexit, which
		// would otherwise leave Close and Wait waiting for ever (a panic
		// ends the process).
		returned := false
		defer func() {
			if !returned {
				err = errors.New("lcore: a Handler or Func panicked or called runtime.Goexit")
			}
			c.end(errors.Join(err, sl.restore(), p.restore(c.cfg.CPU)))
		}()
		err = c.loop(ctx, p)
		returned = true
	}()
	return <-ready
}

// steerInterrupts directs the interrupts of the core's queues to its CPU
// when it is pinned and sleeps on them (Config.KeepIRQAffinity).
func (c *Core) steerInterrupts() {
	if c.cfg.CPU == AnyCPU || c.cfg.Mode == Busy || c.cfg.KeepIRQAffinity {
		return
	}
	n := 0
	var errs []error
	for _, e := range c.queues { // fixed once started
		s, ok := e.q.(nic.InterruptSteerer)
		if !ok {
			continue
		}
		if err := s.SteerInterrupt(c.cfg.CPU); err != nil {
			errs = append(errs, err)
			continue
		}
		n++
	}
	c.mu.Lock()
	c.steered, c.steerErr = n, errors.Join(errs...)
	c.mu.Unlock()
}

// shortenSlice asks for a short scheduler slice on the core's thread when
// it is pinned and sleeps on interrupts (Config.KeepSlice), and records
// the outcome for Slice.
func (c *Core) shortenSlice() slice {
	if c.cfg.CPU == AnyCPU || c.cfg.Mode == Busy || c.cfg.KeepSlice {
		return slice{}
	}
	sl, err := shortenSlice()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sliceErr = err
	if sl.set {
		c.slice = WakeSlice
	}
	return sl
}

// Slice reports, once the core has started, the scheduler slice its
// thread asked for (WakeSlice), or 0 when it asked for none: a busy or
// unpinned core, Config.KeepSlice, a thread that is not SCHED_OTHER, or a
// failure, whose error it returns (the core runs on regardless). The
// thread gets its old slice back when the core stops.
func (c *Core) Slice() (time.Duration, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.slice, c.sliceErr
}

// Steered reports, once the core has started, how many of its queues had
// their interrupt directed to its CPU, and why the others that can be
// steered were not (nil when none failed). A core steers when it is
// pinned, sleeps on interrupts (Adaptive, Interrupt) and
// Config.KeepIRQAffinity is false; a failure (not root, a CPU the kernel
// refuses) does not stop it.
func (c *Core) Steered() (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.steered, c.steerErr
}

// Wait waits until the core stops and returns why: nil when its context
// ended or Close stopped it, else the error of a Handler, a Func or a
// queue. It returns ctx.Err() if ctx ends first (the core keeps running),
// and ErrNotStarted at once when the core was never started. Called from
// one of the core's own Handlers or Funcs, it returns ErrSelfWait at once.
func (c *Core) Wait(ctx context.Context) error {
	if ctx == nil {
		return fmt.Errorf("%w: lcore: nil context", os.ErrInvalid)
	}
	if c.onCore() {
		return ErrSelfWait
	}
	c.mu.Lock()
	started := c.started
	c.mu.Unlock()
	if !started {
		return ErrNotStarted
	}
	select {
	case <-c.done:
		return c.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Wake makes a sleeping core run a round of polls; a Wake sent while the
// core polls makes its next sleep return at once. It is safe from any
// goroutine. It returns an error matching os.ErrClosed once the core is
// closed.
func (c *Core) Wake() error {
	if err := c.wake.Add(1); err != nil {
		return fmt.Errorf("lcore: wake: %w", closedErr(err))
	}
	return nil
}

// Close stops the core, waits for its loop to end (its thread with it),
// and releases its resources. It returns the loop's error, as Wait does.
// The queues stay open: close the core before the device. Close is safe
// to call more than once.
//
// Called from one of the core's own Handlers or Funcs, Close only asks the
// core to stop, and returns nil: the core stops once the current round
// ends (nil to Run and Wait, unless the round fails), and releases its
// resources then.
func (c *Core) Close() error {
	c.mu.Lock()
	first := !c.closed
	c.closed = true
	started := c.started
	c.mu.Unlock()
	c.requestStop()
	if c.onCore() {
		return nil // waiting would wait for the loop this call runs in
	}
	var err error
	if started {
		<-c.done
		err = c.err
	}
	if first {
		_ = c.wake.Close()
	}
	return err
}

func (c *Core) requestStop() {
	c.stop.Store(true)
	_ = c.wake.Add(1)
}

// ThreadID returns the Linux thread id of the core's thread while the
// core runs, 0 otherwise.
func (c *Core) ThreadID() int { return int(c.tid.Load()) }

// Stats returns the core's counters as last published.
func (c *Core) Stats() Stats {
	return Stats{
		Polls: c.pub.polls.Load(), EmptyPolls: c.pub.empty.Load(), Completions: c.pub.comps.Load(),
		Sleeps: c.pub.sleeps.Load(), Wakeups: c.pub.wakeups.Load(),
	}
}

func (c *Core) publish() {
	c.pub.polls.Store(c.st.Polls)
	c.pub.empty.Store(c.st.EmptyPolls)
	c.pub.comps.Store(c.st.Completions)
	c.pub.sleeps.Store(c.st.Sleeps)
	c.pub.wakeups.Store(c.st.Wakeups)
}

// loop is the core's run loop, on its locked and pinned thread.
func (c *Core) loop(ctx context.Context, p pinned) (err error) {
	c.tid.Store(int64(p.tid))
	stopOnCancel := context.AfterFunc(ctx, c.requestStop)
	defer stopOnCancel()
	defer c.publish()
	var ep *epoller
	if c.cfg.Mode != Busy {
		defer c.takeInterrupts()
		if ep, err = newEpoller(c.wake, c.queues); err != nil {
			return err
		}
		defer ep.close()
	}
	idle := 0
	var idleSince time.Time
	for !c.stop.Load() {
		work, err := c.round()
		if err != nil {
			return err
		}
		if c.st.Polls&1023 == 0 {
			c.publish()
		}
		if work > 0 {
			idle = 0
			continue
		}
		switch c.cfg.Mode {
		case Busy:
			continue
		case Adaptive:
			// Reading the clock on every empty poll would cost more than
			// the poll: look every 16.
			idle++
			if idle == 1 {
				idleSince = time.Now()
				continue
			}
			if idle&15 != 0 {
				continue
			}
			if d := time.Since(idleSince); d < c.cfg.IdleInterval || d < owedWait*c.cfg.IdleInterval && c.sendsOwed() {
				continue
			}
		}
		if err := c.sleep(ep); err != nil {
			return err
		}
		idle = 0
	}
	return nil
}

// owedWait is how many idle intervals an adaptive core keeps polling while
// a transmit queue has sends outstanding: the device owes their
// completions, so the core is waiting for it, not idle, and a sleep would
// add a wake-up (over a millisecond in a QEMU guest) to the time the ring
// stays full. A device that stalls longer than this still lets it sleep.
const owedWait = 32

// sendsOwed reports whether a transmit queue has sends the device has not
// completed.
func (c *Core) sendsOwed() bool {
	for i := range c.queues {
		if e := &c.queues[i]; e.tx && e.q.Outstanding() > 0 {
			return true
		}
	}
	return false
}

// round polls every queue once, gives what it read to the handlers, calls
// the Funcs, and flushes the queues if anything happened. It returns the
// work done.
func (c *Core) round() (int, error) {
	work := 0
	for i := range c.queues {
		e := &c.queues[i]
		n := e.q.Poll(c.buf)
		if n == 0 {
			continue
		}
		work += n
		c.st.Completions += uint64(n)
		if e.h != nil {
			if err := e.h(e.q, c.buf[:n]); err != nil {
				return work, err
			}
		}
	}
	for _, f := range c.funcs {
		w, err := f()
		if err != nil {
			return work, err
		}
		work += w
	}
	c.st.Polls++
	if work == 0 {
		c.st.EmptyPolls++
		return 0, nil
	}
	// One doorbell per queue per round for everything posted in it.
	for i := range c.queues {
		if err := c.queues[i].q.Flush(); err != nil {
			return work, fmt.Errorf("lcore: flush queue %d: %w", c.queues[i].q.Index(), err)
		}
	}
	return work, nil
}

// sleep arms every queue's interrupt, polls once more, and sleeps until an
// interrupt or a Wake when that round found nothing.
func (c *Core) sleep(ep *epoller) error {
	for i := range c.queues {
		q := c.queues[i].q
		// An interrupt left from an earlier arm (fired while the core was
		// polling) would end the sleep at once for nothing.
		n, err := q.Interrupt().Take()
		if err != nil {
			return fmt.Errorf("lcore: queue %d interrupt: %w", q.Index(), closedErr(err))
		}
		c.queues[i].irqs.Add(n)
		if err := q.Arm(1); err != nil {
			return fmt.Errorf("lcore: arm queue %d: %w", q.Index(), err)
		}
	}
	// A completion written between the last empty poll and the arm raises
	// no interrupt: this round is what finds it.
	work, err := c.round()
	if err != nil || work > 0 || c.stop.Load() {
		return err
	}
	c.st.Sleeps++
	c.publish()
	if err := ep.wait(); err != nil {
		return err
	}
	c.st.Wakeups++
	return nil
}

// takeInterrupts counts the interrupts left on the queues' eventfds when
// the core stops (taken otherwise at the next sleep).
func (c *Core) takeInterrupts() {
	for i := range c.queues {
		if efd := c.queues[i].q.Interrupt(); efd != nil {
			if n, err := efd.Take(); err == nil {
				c.queues[i].irqs.Add(n)
			}
		}
	}
}

// closedErr maps eventfd's closed error onto os.ErrClosed.
func closedErr(err error) error {
	if errors.Is(err, eventfd.ErrClosed) && !errors.Is(err, os.ErrClosed) {
		return fmt.Errorf("%w (%v)", os.ErrClosed, err)
	}
	return err
}
