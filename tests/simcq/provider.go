// Package simcq runs the CQ conformance suite and the completion-path
// benchmarks on the software device, nic/qpsim.
package simcq

import (
	"context"
	"fmt"
	"sync"

	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/cq/qpsim"
	"github.com/vfnic/vfnic/cq/ring"
	"github.com/vfnic/vfnic/tests/conformance"
)

// Provider adapts a qpsim.Device to conformance.Provider.
type Provider struct {
	Dev *qpsim.Device // the device the CQs and endpoints live on
}

// Name implements conformance.Provider.
func (p *Provider) Name() string { return "sim" }

// Caps implements conformance.Provider: the software device produces every
// completion format and every fault.
func (p *Provider) Caps() conformance.Caps {
	return conformance.Caps{MaxSize: qpsim.MaxCQSize, RemoteData: true, Tagged: true, MultiRecv: true,
		Source: true, Overrun: true, Truncation: true}
}

// OpenCQ implements conformance.Provider.
func (p *Provider) OpenCQ(attr cq.Attr) (*cq.CQ, error) { return p.Dev.OpenCQ(attr) }

// NewEndpoint implements conformance.Provider with a queue pair whose send
// and receive completions both go to c, and 64 KiB of receive buffers.
func (p *Provider) NewEndpoint(c *cq.CQ, attr conformance.EndpointAttr) (conformance.Endpoint, error) {
	qp, err := p.Dev.NewQP(qpsim.QPConfig{SendCQ: c, RecvCQ: c, SendSize: attr.SendDepth,
		RecvSize: attr.RecvDepth, Source: attr.Source})
	if err != nil {
		return nil, err
	}
	mem, err := p.Dev.Alloc(64 << 10)
	if err != nil {
		_ = qp.Close()
		return nil, err
	}
	return &endpoint{p: p, c: c, qp: qp, mem: mem}, nil
}

// Inject implements conformance.Injector.
func (p *Provider) Inject(c *cq.CQ, f qpsim.FaultKind) error {
	return p.Dev.Inject(c, qpsim.Fault{Kind: f})
}

type endpoint struct {
	p   *Provider
	c   *cq.CQ
	qp  *qpsim.QP
	mu  sync.Mutex
	mem *qpsim.Memory
	off int
}

// Addr implements conformance.Endpoint.
func (e *endpoint) Addr() cq.Addr { return e.qp.Addr() }

// Send implements conformance.Endpoint: a loopback send.
func (e *endpoint) Send(ctx any, payload []byte, o conformance.SendOpts) error {
	return e.qp.Send(e.qp.Addr(), ctx, payload, qpsim.SendOpts{Data: o.Data, HasData: o.HasData, Tag: o.Tag, Tagged: o.Tagged})
}

// PostRecv implements conformance.Endpoint with the endpoint's buffer memory.
func (e *endpoint) PostRecv(ctx any, size int, o conformance.RecvOpts) ([]byte, error) {
	e.mu.Lock()
	b := e.mem.Bytes()
	if size <= 0 || e.off+size > len(b) {
		e.mu.Unlock()
		return nil, fmt.Errorf("simcq: %d bytes of receive buffer: %w", size, ring.ErrFull)
	}
	buf := b[e.off : e.off+size : e.off+size]
	e.off = (e.off + size + 63) &^ 63
	e.mu.Unlock()
	return buf, e.qp.PostRecv(ctx, buf, qpsim.RecvOpts{MultiRecv: o.MultiRecv, MinFree: o.MinFree})
}

// FailNext implements conformance.Endpoint with an error-status fault.
func (e *endpoint) FailNext() error {
	return e.p.Dev.Inject(e.c, qpsim.Fault{Kind: qpsim.FaultErrorStatus, Status: qpsim.StatusGeneralErr, Syndrome: 0x5eed})
}

// Flush implements conformance.Endpoint.
func (e *endpoint) Flush(ctx context.Context) error { return e.qp.Flush(ctx) }

// Close implements conformance.Endpoint.
func (e *endpoint) Close() error {
	err := e.qp.Close()
	if merr := e.mem.Close(); err == nil {
		err = merr
	}
	return err
}
