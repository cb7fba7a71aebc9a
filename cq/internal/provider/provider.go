// Package provider joins package cq, the completion-queue API, to package
// cq/ring, the kit that drivers use to feed it, without making the
// driver-side operations part of cq's public face: cq installs its hooks
// here at init, and cq/ring exposes them to drivers.
package provider

import "github.com/vfnic/vfnic/eventfd"

// State is what a source reports after a poll (cq/ring.State).
type State uint8

// Source states.
const (
	StateOK      State = iota // the batch ended: ents full or nothing more
	StateError                // an error completion waits at the head
	StateOverrun              // the ring overran and its valid entries are read
)

// Hooks are cq's driver-side operations on a *cq.CQ, passed as any
// because this package cannot import cq.
type Hooks struct {
	AddSource func(c, s any) error
	Bind      func(c any) error
	Unbind    func(c any)
	Bound     func(c any) int
	Interrupt func(c any) *eventfd.FD
	Pending   func(c any, max int) int
}

// CQ holds cq's hooks, set by cq's init.
var CQ Hooks
