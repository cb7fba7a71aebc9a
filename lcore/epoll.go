package lcore

import (
	"fmt"

	"github.com/vfnic/vfnic/eventfd"
	"golang.org/x/sys/unix"
)

// epoller sleeps the core's locked thread in epoll_wait on its queues'
// interrupt eventfds (or the readiness they stand for: EPOLLOUT for a
// write readiness) and its wake eventfd. The eventfds stay registered
// with Go's runtime poller too (an fd may be in several epoll sets); only
// this thread reads them while the core runs. A queue's interrupt that
// closes (its device closed, or taken back by the kernel) leaves the set
// without waking it, so each signals the wake eventfd as it closes
// (eventfd.FD.SignalOnClose): the core wakes at once and finds it closed.
type epoller struct {
	fd      int
	wake    *eventfd.FD
	events  []unix.EpollEvent
	cancels []func() // the SignalOnClose registrations
}

const wakeTag = -1 // the event data of the wake eventfd

func newEpoller(wake *eventfd.FD, queues []queueEntry) (*epoller, error) {
	fd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("lcore: epoll_create1: %w", err)
	}
	ep := &epoller{fd: fd, wake: wake, events: make([]unix.EpollEvent, len(queues)+1)}
	added := make(map[int]bool)
	add := func(efd *eventfd.FD, tag int32) error {
		n := efd.Fd()
		if n < 0 {
			return fmt.Errorf("lcore: interrupt eventfd: %w", closedErr(eventfd.ErrClosed))
		}
		if added[n] {
			return nil // queues that share a vector share its eventfd
		}
		added[n] = true
		// Level-triggered: a counter left non-zero wakes the next wait.
		// A socket's readiness has no counter and can last with nothing
		// to read (AF_PACKET's, while a handler keeps the last frame; an
		// AF_XDP socket's write readiness, while its transmit ring has
		// room): edge-triggered, it wakes the core for new events only,
		// and the round after the arm sees what came before the sleep.
		ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: tag}
		if efd.WriteReadiness() {
			ev.Events = unix.EPOLLOUT
		}
		if efd.Readiness() {
			ev.Events |= unix.EPOLLET
		}
		if err := unix.EpollCtl(fd, unix.EPOLL_CTL_ADD, n, &ev); err != nil {
			return fmt.Errorf("lcore: epoll_ctl: %w", err)
		}
		if efd != wake {
			ep.cancels = append(ep.cancels, efd.SignalOnClose(wake))
		}
		return nil
	}
	if err := add(wake, wakeTag); err != nil {
		ep.close()
		return nil, err
	}
	for i, e := range queues {
		if err := add(e.q.Interrupt(), int32(i)); err != nil {
			ep.close()
			return nil, fmt.Errorf("queue %d: %w", e.q.Index(), err)
		}
	}
	return ep, nil
}

// wait blocks the thread until an interrupt or the wake eventfd fires
// (a Wake, the context, or a queue's interrupt closing), and drains the
// wake eventfd if it fired (the queues' eventfds are drained before their
// next arm).
func (ep *epoller) wait() error {
	for {
		n, err := unix.EpollWait(ep.fd, ep.events, -1)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("lcore: epoll_wait: %w", err)
		}
		for _, ev := range ep.events[:n] {
			if ev.Fd == wakeTag {
				if _, err := ep.wake.Take(); err != nil {
					return closedErr(err)
				}
			}
		}
		return nil
	}
}

func (ep *epoller) close() {
	for _, cancel := range ep.cancels {
		cancel()
	}
	_ = unix.Close(ep.fd)
}
