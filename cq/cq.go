package cq

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/vfnic/vfnic/eventfd"
)

// CQ is a completion queue with the semantics of libfabric's fi_cq(3)
// over one or more device completion rings (Sources). It is safe for
// concurrent use unless opened SingleThreaded.
type CQ struct {
	attr   Attr
	single bool

	mu sync.Mutex // readers; also guards closed, fatal, bound, and changes to srcs
	// srcs are the sources, published copy-on-write: a change (under mu)
	// stores a new slice, never altering one published, so that readers
	// of a SingleThreaded CQ, which take no lock, read them while a
	// driver adds one (verbs creates QPs on a CQ that others poll).
	// Never nil after New, so that a read loads it and nothing more.
	srcs   atomic.Pointer[[]Source]
	closed bool
	fatal  bool
	bound  int

	wait   *eventfd.FD // nil without an eventfd wait object
	signal atomic.Bool // a Signal not yet consumed by SRead

	wmu     sync.Mutex // SRead leader/follower state
	leading bool
	wakeCh  chan struct{}
	// wakeTaken says a follower sleeps on wakeCh (guarded by wmu).
	wakeTaken bool
	wakeGen   uint64
	done      chan struct{} // closed by Close
}

// New makes a CQ with attr resolved against the provider's limits (actual
// size, default format). A device's BindCQ (or a driver through Driver)
// then feeds it from the device's completion rings.
func New(attr Attr, lim Limits) (*CQ, error) {
	a, err := lim.Resolve(attr)
	if err != nil {
		return nil, err
	}
	c := &CQ{attr: a, single: a.SingleThreaded, wakeCh: make(chan struct{}), done: make(chan struct{})}
	c.srcs.Store(&noSources)
	switch a.WaitObj {
	case WaitFD, WaitUnspec, WaitMutexCond:
		fd, err := eventfd.New()
		if err != nil {
			return nil, fmt.Errorf("cq: wait object: %w", err)
		}
		c.wait = fd
	}
	return c, nil
}

// Attr returns the attributes in effect: the actual size, the resolved
// format.
func (c *CQ) Attr() Attr { return c.attr }

// addSource attaches a device ring to the CQ. Sources are polled in the
// order they were added.
func (c *CQ) addSource(s Source) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	if err := s.Attach(c.attr.Format); err != nil {
		return err
	}
	old := c.sources()
	srcs := append(old[:len(old):len(old)], s) // a copy: readers may hold old
	c.srcs.Store(&srcs)
	return nil
}

// sources returns the published sources, which nobody alters: one load,
// without c.mu.
func (c *CQ) sources() []Source { return *c.srcs.Load() }

// noSources is the sources of a new or closed CQ.
var noSources []Source

// bind records an endpoint (a device queue) that reports to this CQ; Close
// fails with ErrBusy until it is unbound.
func (c *CQ) bind() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	c.bound++
	return nil
}

// unbind undoes one bind.
func (c *CQ) unbind() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.bound > 0 {
		c.bound--
	}
}

// boundCount returns the number of bound endpoints.
func (c *CQ) boundCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bound
}

func (c *CQ) lock() {
	if !c.single {
		c.mu.Lock()
	}
}

func (c *CQ) unlock() {
	if !c.single {
		c.mu.Unlock()
	}
}

// Read moves up to len(ents) completions into ents (fi_cq_read). It
// returns the successes that precede the first error entry; ErrAvail when
// an error entry is at the head (take it with ReadErr); ErrAgain when the
// queue is empty; ErrOverrun once the queue was overrun and its valid
// entries are drained, for good. A Read of zero entries drives progress and
// reports whether completions are waiting (nil), or ErrAgain/ErrAvail.
// Read does not allocate.
func (c *CQ) Read(ents []Entry) (int, error) {
	return c.read(ents, nil)
}

// ReadFrom is Read that also returns the source address of each completion
// in addrs, which must be at least as long as ents (fi_cq_readfrom):
// AddrNotAvail for completions without one (sends, endpoints without
// source addressing).
func (c *CQ) ReadFrom(ents []Entry, addrs []Addr) (int, error) {
	if len(addrs) < len(ents) {
		return 0, errShortAddrs
	}
	return c.read(ents, addrs[:len(ents)])
}

func (c *CQ) read(ents []Entry, addrs []Addr) (int, error) {
	c.lock()
	srcs := c.sources()
	if c.closed || len(ents) == 0 || len(srcs) != 1 {
		return c.readAll(ents, addrs, srcs)
	}
	// One source, the common case: what readAll does, with nothing but c
	// to keep across the call.
	n, st := srcs[0].Poll(ents, addrs)
	if st == SourceOverrun && n == 0 {
		c.fatal = true
	}
	fatal := c.fatal
	if !c.single { // c.unlock, which the compiler does not inline
		c.mu.Unlock()
	}
	switch {
	case n > 0:
		return n, nil
	case st == SourceError:
		return 0, ErrAvail
	case fatal:
		return 0, ErrOverrun
	}
	return 0, ErrAgain
}

// readAll is read for a closed CQ, a zero-count read and any number of
// sources, srcs, as read loaded them. Called locked; it unlocks.
func (c *CQ) readAll(ents []Entry, addrs []Addr, srcs []Source) (int, error) {
	if c.closed {
		c.unlock()
		return 0, ErrClosed
	}
	if len(ents) == 0 {
		err := c.probe(srcs)
		c.unlock()
		return 0, err
	}
	n := 0
	errHead, over := false, false
	for _, s := range srcs {
		var a []Addr
		if addrs != nil {
			a = addrs[n:]
		}
		k, st := s.Poll(ents[n:], a)
		n += k
		if st == SourceError {
			errHead = true
			break
		}
		if st == SourceOverrun {
			over = true
		}
		if n == len(ents) {
			break
		}
	}
	if over && n == 0 && !errHead {
		c.fatal = true
	}
	fatal := c.fatal
	c.unlock()
	switch {
	case n > 0:
		return n, nil
	case errHead:
		return 0, ErrAvail
	case fatal:
		return 0, ErrOverrun
	}
	return 0, ErrAgain
}

// probe is a zero-count read of srcs: progress and state only. Called
// locked.
func (c *CQ) probe(srcs []Source) error {
	ready, over := false, false
	for _, s := range srcs {
		switch _, st := s.Poll(nil, nil); st {
		case SourceError:
			return ErrAvail
		case SourceOverrun:
			over = true
			continue
		}
		if s.Pending(1) > 0 {
			ready = true
		}
	}
	switch {
	case ready:
		return nil
	case over:
		c.fatal = true
	}
	if c.fatal {
		return ErrOverrun
	}
	return ErrAgain
}

// ReadErr takes the error completion at the head of the queue into e
// (fi_cq_readerr): Err, ProvErrno, OLen and every Entry field, and the
// error data copied into e.ErrData's buffer (up to its capacity, resliced
// to the length copied) or, when e.ErrData is nil, a buffer held by the CQ
// until its next read call. It returns ErrAgain when no error entry is at
// the head, ErrOverrun when none is and the CQ was overrun. It does not
// allocate.
func (c *CQ) ReadErr(e *ErrEntry) error {
	if e == nil {
		return fmt.Errorf("%w: ReadErr into nil", ErrInvalid)
	}
	c.lock()
	defer c.unlock()
	if c.closed {
		return ErrClosed
	}
	buf := e.ErrData
	srcs := c.sources()
	for _, s := range srcs {
		data, ok := s.ReadErr(e)
		if !ok {
			continue
		}
		if buf != nil {
			e.ErrData = buf[:copy(buf[:cap(buf)], data)]
		} else {
			e.ErrData = data
		}
		return nil
	}
	// No error entry: a source that overran says so here too, not only
	// once a Read has noticed it.
	if !c.fatal && c.probe(srcs) == ErrOverrun {
		return ErrOverrun
	}
	if c.fatal {
		return ErrOverrun
	}
	return ErrAgain
}

// StrError describes a provider error number with its error data
// (fi_cq_strerror).
func (c *CQ) StrError(provErrno ProvErrno, errData []byte) string {
	if s, ok := provText[provErrno]; ok {
		return "cq: " + s
	}
	for _, s := range c.sources() {
		if msg, ok := s.StrError(provErrno, errData); ok {
			return msg
		}
	}
	return fmt.Sprintf("cq: provider error %d", provErrno)
}

// Close releases the CQ and its device rings (fi_close). It fails with
// ErrBusy while device queues are bound to it. Blocked SRead calls return ErrClosed;
// completions still queued are lost. Close is idempotent.
func (c *CQ) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	if c.bound > 0 {
		n := c.bound
		c.mu.Unlock()
		return fmt.Errorf("%w: %d endpoint(s)", ErrBusy, n)
	}
	c.closed = true
	srcs := c.sources()
	c.srcs.Store(&noSources)
	c.mu.Unlock()

	close(c.done)
	if c.wait != nil {
		_ = c.wait.Add(1) // wake a goroutine parked on the eventfd
	}
	var errs []error
	for _, s := range srcs {
		errs = append(errs, s.Close())
	}
	// The device's interrupts are released with the sources, before the
	// eventfd they signal goes away.
	if c.wait != nil {
		errs = append(errs, c.wait.Close())
	}
	return errors.Join(errs...)
}
