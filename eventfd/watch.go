package eventfd

import (
	"context"
	"reflect"
	"time"
)

// A sleeper must wake when its context ends. context.AfterFunc does that,
// but it allocates (the registration and the function), and a server
// passes the same request or connection context to read after read. So
// an FD keeps its registrations: one per context in use, plus the last
// few no longer in use, each waking every sleeper of the FD when its
// context ends (a sleeper woken for another's context looks at its own
// and sleeps again).

// maxIdleWatches is how many registrations of contexts no sleeper uses
// an FD keeps for reuse; older ones are stopped.
const maxIdleWatches = 4

// watch is a registration of context.AfterFunc(ctx, e.wakeAll).
type watch struct {
	ctx   context.Context
	stop  func() bool
	users int // sleepers using it now
}

// watchCtx registers ctx's end for the duration of a wait, reusing a
// registration when it has one for ctx; unwatch undoes it. ctx must have
// a Done channel. Called without e.mu.
func (e *FD) watchCtx(ctx context.Context) *watch {
	e.mu.Lock()
	comparable := reflect.TypeOf(ctx).Comparable()
	for _, w := range e.watches {
		// A context of a type that is not comparable (a struct value
		// holding a slice) would make == panic: it gets a registration
		// per wait.
		if comparable && w.ctx == ctx {
			w.users++
			e.mu.Unlock()
			return w
		}
	}
	e.mu.Unlock()
	// Registered outside the lock: AfterFunc runs wakeAll at once, on a
	// goroutine of its own, for a context that has already ended.
	w := &watch{ctx: ctx, users: 1}
	w.stop = context.AfterFunc(ctx, e.wakeAll)
	e.mu.Lock()
	e.watches = append(e.watches, w)
	e.mu.Unlock()
	return w
}

// unwatch ends a wait's use of w, and stops the registrations beyond the
// idle ones kept, oldest first, and those of contexts that have ended.
func (e *FD) unwatch(w *watch) {
	var stale []*watch
	e.mu.Lock()
	w.users--
	idle := 0
	for i := len(e.watches) - 1; i >= 0; i-- {
		v := e.watches[i]
		if v.users > 0 {
			continue
		}
		if idle++; idle > maxIdleWatches || v.ctx.Err() != nil || e.closing {
			stale = append(stale, v)
			e.watches = append(e.watches[:i], e.watches[i+1:]...)
		}
	}
	e.mu.Unlock()
	for _, v := range stale {
		v.stop()
	}
}

// wakeAll wakes every sleeper, for a context that ended: the thread
// sleepers through their cancel eventfds, the one on the runtime poller
// by expiring its deadline.
func (e *FD) wakeAll() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.kickSleepers()
	if !e.closing && e.f != nil {
		_ = e.setDeadline(e.f, expired)
	}
}

// expired is a deadline in the past.
var expired = time.Unix(1, 0)
