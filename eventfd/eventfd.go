// Package eventfd wraps a Linux eventfd so that a goroutine can sleep on it
// without spinning: parked on Go's runtime poller, or, on a thread pinned to
// one CPU, with that thread asleep in the kernel. vfnic uses
// eventfds for MSI-X interrupts (VFIO writes them), for the software device's
// interrupts and for completion-queue wait objects. An FD made by Readable
// or Writable stands for another descriptor's readiness instead (an AF_XDP
// socket, readable while its receive ring holds entries, made writable
// as the kernel completes its sends), so that one wait path serves both
// kinds of interrupt.
package eventfd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ErrTimeout is returned by Wait when its deadline passes with no event. It
// is os.ErrDeadlineExceeded, as for Go's own deadlines.
var ErrTimeout = os.ErrDeadlineExceeded

// ErrClosed is returned by operations on a closed FD. It is os.ErrClosed.
var ErrClosed = os.ErrClosed

// errNotMade is returned by the methods of an FD that New did not make.
var errNotMade = fmt.Errorf("eventfd: FD not made by New: %w", os.ErrInvalid)

// FD is an eventfd counter. Add and Take may be called from any goroutine.
// Any number of goroutines may Wait at once, each with its own deadline and
// context; on the runtime poller they take turns, one sleeping on the
// descriptor at a time, so an event wakes one of them.
//
// Only New makes an FD. Any other (the zero FD, a struct field never set)
// owns no descriptor: its methods return an error matching os.ErrInvalid,
// Fd returns -1 and Close does nothing, so that none of them uses fd 0,
// which belongs to someone else.
type FD struct {
	fd int
	// level: the FD is another descriptor's readiness (Readable,
	// Writable), with no counter to read: a wait returns when it is ready,
	// and what made it so is consumed elsewhere (the ring it reports on).
	// out: the readiness is for writing (POLLOUT), not reading.
	level, out bool

	// turn is held by the one goroutine that sleeps on the runtime poller:
	// a read deadline belongs to the os.File, not to the goroutine, and the
	// file's read lock would queue the others where neither their deadline
	// nor their context reaches them (expiring it would wake the sleeper
	// instead, and a zero deadline would clear the sleeper's).
	turn chan struct{}

	// users counts the calls using fd (Add, Take, a thread's Wait), with
	// closedBit set by Close, which waits on drained for them to end:
	// the kernel could hand a closed descriptor's number to another file.
	// No lock is held across a system call: a reader that Add wakes on
	// the writer's CPU must not then wait for the writer to let go.
	users   atomic.Uint64
	drained chan struct{} // nil in an FD that New did not make
	// left says an Await returned on the count and left it (TakeLeft).
	left atomic.Bool

	mu sync.Mutex
	// f is the descriptor as an os.File on the runtime poller, made by
	// the first wait there. Until then the poller does not know the fd:
	// registered (edge-triggered), every Add would also wake a thread
	// blocked in the runtime's netpoll, usually on another CPU, for no
	// goroutine at all, which is a wasted wake-up per interrupt for a
	// polling core that sleeps on the fd with its own epoll.
	f *os.File
	// rc and look serve the poller's wait on a readiness FD, made with
	// f so that a wait allocates nothing; the one sleeper on the poller
	// (turn) sets cond for look and reads lookErr.
	rc      syscall.RawConn
	look    func(fd uintptr) bool
	cond    func() bool
	lookErr error
	closing bool     // Close has kicked the sleepers: no new ones
	wakers  []int    // each thread sleeper's cancel eventfd, which Close kicks
	spare   int      // a cancel eventfd for the next thread sleeper, or -1
	watches []*watch // registrations of the sleepers' contexts (watch.go)
	// signals are the eventfds a Close signals (SignalOnClose), for
	// sleepers that wait on the descriptor in an epoll set of their own:
	// closing a descriptor takes it out of the set without waking them.
	signals []*FD
}

// closedBit marks a closed FD in users; the bits below count calls.
const closedBit = 1 << 63

// New creates a non-blocking, close-on-exec eventfd with a zero counter.
func New() (*FD, error) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("eventfd: eventfd2: %w", err)
	}
	return &FD{fd: fd, drained: make(chan struct{}), spare: -1, turn: make(chan struct{}, 1)}, nil
}

// Readable returns an FD for the readiness of fd (POLLIN), a descriptor
// that is not an eventfd: an AF_XDP socket, whose receive ring holding
// entries makes it readable. It holds a duplicate of fd, closed by Close;
// the caller keeps fd. Wait and Await return once fd is readable, with a
// count of 1 from Wait and Await alike and no read of fd: the readiness
// lasts until the caller consumes what caused it. Take and TakeLeft
// return 0, and Add fails (nobody but fd's owner signals it).
func Readable(fd int) (*FD, error) { return readiness(fd, false) }

// Writable is Readable for the write readiness of fd (POLLOUT): an
// AF_XDP socket's, which the kernel raises as it frees the buffers of
// the sends it completed in copy mode (sock_wfree), so that a transmit
// queue sleeps until its completions are written. Waits on it are
// Readable's, on POLLOUT: a descriptor that stays writable with nothing
// new (a socket whose send buffer has room) wants WaitFor.
func Writable(fd int) (*FD, error) { return readiness(fd, true) }

// readiness is Readable (out false) and Writable (out true).
func readiness(fd int, out bool) (*FD, error) {
	d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("eventfd: dup of fd %d: %w", fd, err)
	}
	if err := unix.SetNonblock(d, true); err != nil {
		_ = unix.Close(d)
		return nil, fmt.Errorf("eventfd: non-blocking fd %d: %w", fd, err)
	}
	return &FD{fd: d, level: true, out: out, drained: make(chan struct{}), spare: -1, turn: make(chan struct{}, 1)}, nil
}

// Readiness reports whether the FD stands for another descriptor's
// readiness (Readable): no counter, and a readiness that can last with
// nothing new to read. A sleeper on Fd in an epoll set of its own
// registers such an FD edge-triggered (EPOLLET) and looks at what it
// reports on after each wake-up, as WaitFor does on the runtime poller.
func (e *FD) Readiness() bool { return e.level }

// WriteReadiness reports whether the FD stands for another descriptor's
// write readiness (Writable): a sleeper on Fd in an epoll set of its own
// waits for EPOLLOUT instead of EPOLLIN (edge-triggered, as for any
// readiness).
func (e *FD) WriteReadiness() bool { return e.out }

// events is the poll(2) event the FD waits for.
func (e *FD) events() int16 {
	if e.out {
		return unix.POLLOUT
	}
	return unix.POLLIN
}

// errLevelAdd is Add on an FD made by Readable.
var errLevelAdd = fmt.Errorf("eventfd: Add on a readiness FD (Readable): %w", os.ErrInvalid)

// acquire counts a call that uses the descriptor; ErrClosed once closed.
func (e *FD) acquire() error {
	if e.drained == nil {
		return errNotMade
	}
	for {
		s := e.users.Load()
		if s&closedBit != 0 {
			return ErrClosed
		}
		if e.users.CompareAndSwap(s, s+1) {
			return nil
		}
	}
}

// release ends a call; the last one out of a closed FD lets Close go on.
func (e *FD) release() {
	if e.users.Add(^uint64(0)) == closedBit {
		close(e.drained)
	}
}

// Fd returns the descriptor, for epoll/poll or for VFIO's SET_IRQS. It stays
// owned by the FD: do not close it. It is -1 after Close.
func (e *FD) Fd() int {
	if e.drained == nil || e.users.Load()&closedBit != 0 {
		return -1
	}
	return e.fd
}

// Add adds n to the counter, waking a waiter. It never blocks: a counter
// that would overflow reports unix.EAGAIN.
func (e *FD) Add(n uint64) error {
	if e.level {
		return errLevelAdd
	}
	var b [8]byte
	putU64(b[:], n)
	if err := e.acquire(); err != nil {
		return err
	}
	defer e.release()
	if _, err := unix.Write(e.fd, b[:]); err != nil {
		return fmt.Errorf("eventfd: write: %w", err)
	}
	return nil
}

// Take reads and resets the counter without blocking; it returns 0 when no
// event is pending.
func (e *FD) Take() (uint64, error) {
	if err := e.acquire(); err != nil {
		return 0, err
	}
	defer e.release()
	e.left.Store(false)
	if e.level {
		return 0, nil
	}
	return take(e.fd)
}

// TakeLeft is Take when an Await returned and left the count, and 0
// without a system call otherwise: what a consumer calls before it asks
// for the next event.
func (e *FD) TakeLeft() (uint64, error) {
	if !e.left.Load() {
		return 0, nil
	}
	return e.Take()
}

// take reads and resets the counter of fd; 0 when it is zero.
func take(fd int) (uint64, error) {
	var b [8]byte
	n, err := unix.Read(fd, b[:])
	if err == unix.EAGAIN {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("eventfd: read: %w", err)
	}
	if n != 8 {
		return 0, fmt.Errorf("eventfd: short read of %d bytes", n)
	}
	return getU64(b[:]), nil
}

// Wait sleeps until the counter is non-zero, then reads and resets it. It
// returns ErrTimeout when deadline (if not zero) passes first, ctx.Err() when
// ctx is cancelled, and ErrClosed when the FD is closed, including by a Close
// that happens while it waits.
//
// On a thread that may run on one CPU only (a polling core's pinned thread,
// or any thread of a process confined to one CPU), Wait sleeps that thread
// in the kernel (ppoll), and the event wakes it where it slept, as it wakes
// a C thread in epoll_wait. Elsewhere it parks the goroutine on Go's
// runtime poller and holds no thread. Measured in bench/wakeup: a pinned
// reader parked on the poller waits for the poller's thread to wake and
// hand it the goroutine; an unpinned one wakes faster through the poller,
// which may run it on a CPU that is already awake.
//
// The FD registers the end of a context that can end the first time a
// wait uses it (context.AfterFunc) and keeps the registration for the
// waits that follow with the same context, so that they allocate nothing.
func (e *FD) Wait(ctx context.Context, deadline time.Time) (uint64, error) {
	return e.wait(ctx, deadline, true)
}

// Await is Wait for a caller that takes the count itself before it asks
// for the next event (an interrupt's consumer: TakeLeft, arm the device,
// poll, Await). On a thread that may run on one CPU only it returns as
// soon as the counter is non-zero and leaves it there (n is 0): reading
// it would put a second system call on the wake-up path, which measured
// 1.5-3 us of a 7 us wake-up in bench/wakeup. Elsewhere it is Wait, and
// returns the count it took. Its errors are Wait's.
func (e *FD) Await(ctx context.Context, deadline time.Time) (n uint64, err error) {
	return e.wait(ctx, deadline, false)
}

// wait is Wait (takeIt) and Await.
func (e *FD) wait(ctx context.Context, deadline time.Time, takeIt bool) (uint64, error) {
	if ctx == nil {
		return 0, fmt.Errorf("eventfd: nil context: %w", os.ErrInvalid)
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if onOneCPU() {
		return e.waitThread(ctx, deadline, takeIt)
	}
	return e.waitPoller(ctx, deadline, nil)
}

// WaitFor sleeps until ready reports true, the caller's own look at what
// the FD's events announce (a ring holding entries), asked at once and
// again after each event; it returns nil as soon as ready says true.
// Its errors are Wait's. ready runs on the waiting goroutine, for a
// readiness FD with the descriptor's read lock held (its write lock for
// Writable's): it must not block,
// nor wait for anything a caller of Close may hold (Close waits for it
// to return).
//
// On a readiness FD (Readable) it tells a new readiness from a stale
// one, which Wait cannot: a descriptor can stay readable with nothing
// new to read (an AF_PACKET socket while the slot before the kernel's
// position is still lent to the caller), and Wait would then return at
// once, again and again. WaitFor parks on the runtime poller, whose
// registration is edge-triggered (EPOLLET): each event the descriptor
// raises (the kernel's wake-up for a frame it wrote) leaves the sleeper
// one token, and a look that finds nothing ready sleeps until the next.
// No wake-up is lost: the token is consumed before ready looks, so an
// event after the look leaves a new token, and the sleep that follows
// returns at once. It does so on a pinned thread too, where Wait sleeps
// in ppoll: level-triggered, ppoll would return at once for as long as
// the stale readiness lasts.
//
// On an eventfd (New) the counter is the token: each look after the
// first follows a wait that took it (Wait), and an Add after a look
// leaves it non-zero for the wait that follows.
func (e *FD) WaitFor(ctx context.Context, deadline time.Time, ready func() bool) error {
	if ctx == nil || ready == nil {
		return fmt.Errorf("eventfd: nil context or condition: %w", os.ErrInvalid)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if e.level {
		_, err := e.waitPoller(ctx, deadline, ready)
		return err
	}
	for !ready() {
		if _, err := e.wait(ctx, deadline, true); err != nil {
			return err
		}
	}
	return nil
}

// onOneCPU reports whether the calling thread may run on one CPU only.
func onOneCPU() bool {
	var set unix.CPUSet
	return unix.SchedGetaffinity(0, &set) == nil && set.Count() == 1
}

// pollerFile returns the descriptor as an os.File, registered with the
// runtime poller (which is what lets Wait park a goroutine without holding
// a thread: the fd is non-blocking), making it on the first call.
func (e *FD) pollerFile() (*os.File, error) {
	if e.drained == nil {
		return nil, errNotMade // no descriptor to wrap
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closing {
		return nil, ErrClosed
	}
	if e.f == nil {
		f := os.NewFile(uintptr(e.fd), "eventfd")
		if e.level {
			rc, err := f.SyscallConn()
			if err != nil {
				_ = f.Close() // not reached: an os.File always has one
				return nil, fmt.Errorf("eventfd: %w", err)
			}
			e.rc = rc
			e.look = func(fd uintptr) bool {
				if e.cond != nil {
					return e.cond()
				}
				ready, err := pollReady(int(fd), e.events())
				e.lookErr = err
				return ready || err != nil
			}
		}
		e.f = f
	}
	return e.f, nil
}

// waitPoller is Wait parked on the runtime poller, one goroutine at a time
// (turn); on a readiness FD, with ready not nil, it is WaitFor's.
func (e *FD) waitPoller(ctx context.Context, deadline time.Time, ready func() bool) (uint64, error) {
	f, err := e.pollerFile()
	if err != nil {
		return 0, err
	}
	select {
	case e.turn <- struct{}{}: // no other sleeper: nothing more to do
	default:
		if err := e.awaitTurn(ctx, deadline); err != nil {
			return 0, err
		}
	}
	defer e.endTurn()
	if ctx.Done() != nil {
		// The context's end expires the read deadline, which wakes the
		// poller; so may the end of a context registered for an earlier
		// wait: look again then.
		w := e.watchCtx(ctx)
		defer e.unwatch(w)
	}
	var b [8]byte
	for {
		if err := e.setDeadline(f, deadline); err != nil {
			return 0, e.mapErr(ctx, err)
		}
		// After the deadline is set: a context that ends from here on
		// expires it again.
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		n, err := 8, error(nil)
		if e.level {
			err = e.awaitReady(ready)
			putU64(b[:], 1)
		} else {
			n, err = f.Read(b[:])
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) && ctx.Err() == nil &&
				(deadline.IsZero() || time.Now().Before(deadline)) {
				continue // expired for another sleeper's context
			}
			return 0, e.mapErr(ctx, err)
		}
		if n != 8 {
			return 0, fmt.Errorf("eventfd: short read of %d bytes", n)
		}
		return getU64(b[:]), nil
	}
}

// setDeadline sets the deadline of the poller's wait on f: the read
// deadline, or the write deadline of a write readiness (Writable), whose
// wait is the file's write.
func (e *FD) setDeadline(f *os.File, t time.Time) error {
	if e.out {
		return f.SetWriteDeadline(t)
	}
	return f.SetReadDeadline(t)
}

// awaitReady parks on the runtime poller until the descriptor of a
// readiness FD is readable (writable: Writable), or ready (not nil) says
// so, or the file's deadline passes: the poller's wait without a read or
// write, which a socket would not answer as an eventfd does. RawConn.Read
// and Write reset the poller's token, then look, then sleep for the next
// token (WaitFor relies on that order). Called by the sleeper on the
// poller.
func (e *FD) awaitReady(ready func() bool) error {
	e.cond, e.lookErr = ready, nil
	var err error
	if e.out {
		err = e.rc.Write(e.look)
	} else {
		err = e.rc.Read(e.look)
	}
	perr := e.lookErr
	e.cond, e.lookErr = nil, nil
	if err != nil {
		return err
	}
	return perr
}

// pollReady polls fd once for events without sleeping: ready when it has
// them (or an error or hang-up to report, which the caller's next
// operation returns).
func pollReady(fd int, events int16) (bool, error) {
	p := [1]unix.PollFd{{Fd: int32(fd), Events: events}}
	for {
		n, err := unix.Poll(p[:], 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("eventfd: poll: %w", err)
		}
		return n > 0 && p[0].Revents != 0, nil
	}
}

// awaitTurn waits for the sleeper on the poller to leave, until the
// deadline (zero: none) or ctx. A Close ends the sleeper's wait, and then
// that of each waiting its turn in the call it makes on the closed file.
func (e *FD) awaitTurn(ctx context.Context, deadline time.Time) error {
	var expiry <-chan time.Time
	if !deadline.IsZero() {
		d := time.Until(deadline)
		if d <= 0 {
			return ErrTimeout
		}
		t := time.NewTimer(d)
		defer t.Stop()
		expiry = t.C
	}
	select {
	case e.turn <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-expiry:
		return ErrTimeout
	}
}

// endTurn lets the next sleeper on the poller in.
func (e *FD) endTurn() { <-e.turn }

func (e *FD) mapErr(ctx context.Context, err error) error {
	switch {
	case e.users.Load()&closedBit != 0:
		// The os.File reports a Close as poll's "use of closed file"
		// from SetReadDeadline, which does not match os.ErrClosed.
		return ErrClosed
	case errors.Is(err, os.ErrDeadlineExceeded):
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return ErrTimeout
	case errors.Is(err, os.ErrClosed):
		return ErrClosed
	}
	return fmt.Errorf("eventfd: wait: %w", err)
}

// Close releases the descriptor and wakes the goroutines blocked in Wait,
// waiting for those that use it to let go of it. It is safe to call
// more than once. Close of an FD that New did not make does nothing.
func (e *FD) Close() error {
	if e.drained == nil {
		return nil
	}
	old := e.users.Or(closedBit)
	if old&closedBit != 0 {
		return nil
	}
	e.mu.Lock()
	e.closing = true
	e.kickSleepers()
	watches, signals := e.watches, e.signals
	e.watches, e.signals = nil, nil
	e.mu.Unlock()
	for _, w := range watches {
		w.stop()
	}
	if old != 0 {
		<-e.drained
	}
	if e.spare >= 0 {
		_ = unix.Close(e.spare)
	}
	// Signalled once the descriptor is gone: a woken sleeper that looks
	// at it finds it closed.
	defer func() {
		for _, s := range signals {
			_ = s.Add(1) // a closed s has no sleeper left to wake
		}
	}()
	// No new os.File after closing was set; without one, no Wait used
	// the poller and the users have let go of the fd.
	if e.f != nil {
		return e.f.Close() // wakes Wait, which holds the os.File's own reference
	}
	if err := unix.Close(e.fd); err != nil {
		return fmt.Errorf("eventfd: close: %w", err)
	}
	return nil
}

// SignalOnClose makes Close add 1 to s once the descriptor is closed,
// for a sleeper that waits on Fd in an epoll set of its own (a polling
// core): closing a descriptor only takes it out of the epoll sets it is
// in, which wakes nobody. With s in the same set, the sleeper wakes when
// e closes and finds it closed. cancel undoes the registration. An FD
// closed already signals s at once; one that New did not make never
// closes, and never signals.
func (e *FD) SignalOnClose(s *FD) (cancel func()) {
	if e.drained == nil {
		return func() {}
	}
	e.mu.Lock()
	if e.closing {
		e.mu.Unlock()
		_ = s.Add(1)
		return func() {}
	}
	e.signals = append(e.signals, s)
	e.mu.Unlock()
	return func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		if i := slices.Index(e.signals, s); i >= 0 {
			e.signals = slices.Delete(e.signals, i, i+1)
		}
	}
}

// waitThread is Wait (take) or Await with the calling thread asleep in
// ppoll on the eventfd and a cancel eventfd that the context and Close
// write. Several may sleep at once: all wake on an event and, with takeIt,
// one takes it and the others sleep on.
func (e *FD) waitThread(ctx context.Context, deadline time.Time, takeIt bool) (uint64, error) {
	if err := e.acquire(); err != nil {
		return 0, err
	}
	defer e.release()
	cancel, err := e.enter()
	if err != nil {
		return 0, err
	}
	defer e.leave(cancel)
	if ctx.Done() != nil {
		// The context's end kicks every sleeper's cancel eventfd, this
		// one's since enter registered it; a context that ended before
		// that is seen here.
		w := e.watchCtx(ctx)
		defer e.unwatch(w)
		if err := ctx.Err(); err != nil {
			return 0, err
		}
	}
	fds := [2]unix.PollFd{{Fd: int32(e.fd), Events: e.events()}, {Fd: int32(cancel), Events: unix.POLLIN}}
	for {
		var ts *unix.Timespec
		if !deadline.IsZero() {
			d := time.Until(deadline)
			if d <= 0 {
				return 0, ErrTimeout
			}
			t := unix.NsecToTimespec(int64(d))
			ts = &t
		}
		if _, err := unix.Ppoll(fds[:], ts, nil); err != nil && err != unix.EINTR {
			return 0, fmt.Errorf("eventfd: ppoll: %w", err)
		}
		if fds[1].Revents != 0 {
			if _, err := take(cancel); err != nil {
				return 0, err
			}
			if err := ctx.Err(); err != nil {
				return 0, err
			}
			if e.users.Load()&closedBit != 0 {
				return 0, ErrClosed
			}
		}
		if fds[0].Revents != 0 {
			if e.level {
				return 1, nil // readiness, not a count: nothing to leave or take
			}
			if !takeIt {
				e.left.Store(true)
				return 0, nil
			}
			// Another sleeper may have taken the count: then sleep again.
			if n, err := take(e.fd); n != 0 || err != nil {
				return n, err
			}
		}
	}
}

// enter registers a sleeper and gives it a cancel eventfd for Close and
// its context to kick.
func (e *FD) enter() (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closing {
		return -1, ErrClosed
	}
	c := e.spare
	if c >= 0 {
		e.spare = -1
	} else {
		var err error
		if c, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); err != nil {
			return -1, fmt.Errorf("eventfd: eventfd2: %w", err)
		}
	}
	e.wakers = append(e.wakers, c)
	return c, nil
}

// leave unregisters a sleeper and keeps its cancel eventfd for the next
// one (a kick left in it only makes that one look again).
func (e *FD) leave(c int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, w := range e.wakers {
		if w == c {
			e.wakers[i] = e.wakers[len(e.wakers)-1]
			e.wakers = e.wakers[:len(e.wakers)-1]
			break
		}
	}
	if e.spare < 0 {
		e.spare = c
	} else {
		_ = unix.Close(c)
	}
}

// kickSleepers wakes every thread sleeper through its cancel eventfd.
// Called with e.mu held.
func (e *FD) kickSleepers() {
	for _, c := range e.wakers {
		kick(c)
	}
}

// kick adds one to the eventfd fd, waking whoever polls it.
func kick(fd int) {
	var b [8]byte
	putU64(b[:], 1)
	_, _ = unix.Write(fd, b[:])
}

func putU64(b []byte, v uint64) {
	for i := 0; i < 8; i++ {
		b[i] = byte(v >> (8 * i))
	}
}

func getU64(b []byte) uint64 {
	var v uint64
	for i := 0; i < 8; i++ {
		v |= uint64(b[i]) << (8 * i)
	}
	return v
}
