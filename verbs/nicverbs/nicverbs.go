// Package nicverbs adapts an open NIC (package nic: virtio, igb) to
// package verbs: a verbs CQ is a cq.CQ that the device's queues feed once
// they are bound to it (nic.Device.BindCQ with verbs.CQ.FI), so the verbs
// iterator, request-notify and completion channels run over the same ring
// reader as the NIC's fi_cq CQs.
package nicverbs

import (
	"fmt"

	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/verbs"
)

// MaxCQE is the largest verbs CQ a NIC gets here: the CQ buffers entries
// read from the queues' rings, which hold at most a few thousand each.
const MaxCQE = 1 << 16

// Provider is a nic.Device as a verbs.Provider.
type Provider struct {
	// Dev is the device whose queues feed the CQs.
	Dev nic.Device
}

// New returns the provider for d.
func New(d nic.Device) *Provider { return &Provider{Dev: d} }

// QueryDevice implements verbs.Provider. A NIC completion carries the byte
// count and the queue (the QP number is the queue pair); it has no
// immediate data or source QP. Its interrupts are per queue, wired when a
// queue is bound, so each queue pair is a completion vector.
//
// IgnoreOverrun is honoured because no overrun can happen: the CQ has no
// ring of its own but reads the bound queues' rings (cq/ring.QueueSource),
// whose completions are bounded by the buffers posted to them, and that
// source never reports an overrun (only a ring with an overrun register
// does, and virtio's and igb's have none). The CQ never enters the error
// state, whatever its size.
func (p *Provider) QueryDevice() verbs.DeviceAttr {
	return verbs.DeviceAttr{
		MaxCQE:         MaxCQE,
		NumCompVectors: max(1, p.Dev.QueuePairs()),
		Fields:         verbs.FieldByteLen | verbs.FieldQPNum,
		Flags:          verbs.SingleThreaded | verbs.IgnoreOverrun,
		Resize:         true,
	}
}

// OpenCQ implements verbs.Provider. The CQ has no queue yet: bind the
// device's queues to it with Dev.BindCQ(verbsCQ.FI(), pair, dir).
func (p *Provider) OpenCQ(entries, vector int, format cq.Format, single bool) (*cq.CQ, error) {
	return cq.New(cq.Attr{Size: entries, Format: format, WaitObj: cq.WaitFD, SingleThreaded: single},
		cq.Limits{MaxSize: MaxCQE, Vectors: max(1, p.Dev.QueuePairs())})
}

// ResizeCQ implements verbs.Resizer. A NIC CQ has no ring of its own:
// its completions stay in the bound queues' rings until they are read,
// and a resize moves none of them, so that order is kept while the
// device writes. It checks that the new size holds the completions
// waiting (held, plus those the rings hold) and reports it.
func (p *Provider) ResizeCQ(c *cq.CQ, entries, held int) (int, error) {
	if entries < 1 || entries > MaxCQE || held < 0 {
		return 0, fmt.Errorf("nicverbs: resize to %d entries (1 to %d): %w", entries, MaxCQE, cq.ErrInvalid)
	}
	if n := held + c.Driver().Pending(entries+1); n > entries {
		return 0, fmt.Errorf("nicverbs: resize to %d entries: the CQ holds %d or more: %w", entries, n, cq.ErrInvalid)
	}
	return entries, nil
}

// VendorErr implements verbs.Provider: the code of the ring reader or the
// device status that refused the entry (cq.ErrEntry.ProvErrno), as a
// 32-bit two's complement.
func (p *Provider) VendorErr(e *cq.ErrEntry) uint32 { return uint32(int32(e.ProvErrno)) }

// QueueShift implements verbs.Provider: queue pair k's queues are 2k
// (receive) and 2k+1 (transmit) in cq.Entry.Queue, for virtio and igb.
func (p *Provider) QueueShift() uint { return 1 }
