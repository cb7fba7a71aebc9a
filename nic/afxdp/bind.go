package afxdp

import (
	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/nic"
	qcore "github.com/vfnic/vfnic/nic/internal/queue"
)

// BindCQ implements nic.Device. Entry.Queue is 2i for the receive queue of
// pair i and 2i+1 for its transmit queue. A receive entry's Buf is the
// frame (RxQueue.Frame, Repost, Release). The socket's readiness cannot
// signal the CQ's eventfd itself: an armed queue's forwarder waits on it
// and signals the CQ; a transmit queue's waits on the socket's write
// readiness in copy mode, and in zero-copy mode, which signals no
// completion, for TxOwedWait at the most while sends are owed (Flush
// pokes it).
func (d *Device) BindCQ(c *cq.CQ, i int, dir nic.Direction) error {
	return d.core().BindForwarded(c, i, dir, func(q *qcore.Queue) qcore.Forwarding {
		if q == &d.tx[q.Pair].Queue && d.tx[q.Pair].x.wirq == nil {
			return qcore.Forwarding{Owed: func() bool { return q.Outstanding() > 0 }, OwedWait: TxOwedWait}
		}
		return qcore.Forwarding{}
	})
}
