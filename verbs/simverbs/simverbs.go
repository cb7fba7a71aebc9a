// Package simverbs adapts the software device (cq/qpsim) to package verbs.
package simverbs

import (
	"encoding/binary"

	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/cq/qpsim"
	"github.com/vfnic/vfnic/verbs"
)

// Provider is a qpsim.Device as a verbs.Provider.
type Provider struct {
	// Dev is the device the CQs are opened on.
	Dev *qpsim.Device
}

// New returns the provider for d.
func New(d *qpsim.Device) *Provider { return &Provider{Dev: d} }

// QueryDevice implements verbs.Provider. The device's entry carries the
// byte count, immediate data, queue and source QP; it has no clock per
// entry, VLAN, flow tag or checksum, and it stops writing when a CQ
// overruns, so IgnoreOverrun cannot be honoured.
func (p *Provider) QueryDevice() verbs.DeviceAttr {
	return verbs.DeviceAttr{
		MaxCQE:         qpsim.MaxCQSize,
		NumCompVectors: qpsim.Limits().Vectors,
		Fields:         verbs.FieldByteLen | verbs.FieldImm | verbs.FieldQPNum | verbs.FieldSrcQP,
		Flags:          verbs.SingleThreaded,
		Resize:         true,
	}
}

// OpenCQ implements verbs.Provider.
func (p *Provider) OpenCQ(entries, vector int, format cq.Format, single bool) (*cq.CQ, error) {
	return p.Dev.OpenCQ(cq.Attr{Size: entries, Format: format, WaitObj: cq.WaitFD,
		Flags: cq.AttrAffinity, SignalingVector: vector, SingleThreaded: single})
}

// NotifiesSolicited implements verbs.SolicitedNotifier: the device raises
// a solicited-only arm's interrupt only for a completion whose send asked
// for it (qpsim.SendOpts.Solicited) or an error.
func (p *Provider) NotifiesSolicited() bool { return true }

// VendorErr implements verbs.Provider: the entry's syndrome for a device
// status; for an entry the reader refused, the cq.Prov* number as a
// 32-bit two's complement.
func (p *Provider) VendorErr(e *cq.ErrEntry) uint32 {
	if e.ProvErrno < 0 {
		return uint32(int32(e.ProvErrno))
	}
	if len(e.ErrData) >= qpsim.OffSyndrome+4 {
		return binary.LittleEndian.Uint32(e.ErrData[qpsim.OffSyndrome:])
	}
	return 0
}

// QueueShift implements verbs.Provider: QP k's queues are 2k and 2k+1.
func (p *Provider) QueueShift() uint { return 1 }

// ResizeCQ implements verbs.Resizer.
func (p *Provider) ResizeCQ(c *cq.CQ, entries, held int) (int, error) {
	return p.Dev.ResizeCQ(c, entries, held)
}
