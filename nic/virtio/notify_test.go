package virtio

import (
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/nic"
)

// TestNotifyStaleDeviceEvent is the packed transmit stall netstack hit on
// QEMU: the device enables notifications with its event at the next
// descriptor it reads, then goes on reading what was already available
// without moving the event (virtio-net's transmit completion of a busy
// backend), and waits idle. The event is then behind everything the
// driver publishes next; a driver that notifies only when the event is
// in the batch it publishes never notifies, and the ring fills for good.
func TestNotifyStaleDeviceEvent(t *testing.T) {
	r := newRig(t, 8, true, true, 64<<10)
	tx := r.txQueue(t, 1500)
	var comps [8]nic.Completion
	send := func(n int) {
		t.Helper()
		for range n {
			require.NoError(t, tx.Send(frameFor(0, 64), nil))
		}
		require.NoError(t, tx.Flush())
	}
	drain := func() {
		t.Helper()
		for {
			tk, ok := r.dev.take()
			if !ok {
				break
			}
			r.dev.complete(tk.id, 0, 1)
		}
	}
	for lap := range 4 {
		// The device is busy (notifications off) while the driver
		// publishes 6 descriptors.
		r.dev.setDeviceEvent(eventDisable, 0, false)
		n0, s0 := r.v.notifies, r.v.suppressed
		send(6)
		require.Equal(t, n0, r.v.notifies, "lap %d: busy device", lap)
		require.Equal(t, s0+1, r.v.suppressed, "lap %d", lap)
		// It enables notifications at its read position, takes the 6
		// all the same and goes idle without moving the event.
		r.dev.setDeviceEvent(eventDesc, r.dev.availPos, r.dev.availWrap)
		drain()
		require.Equal(t, 6, tx.Poll(comps[:]), "lap %d", lap)
		// The next descriptor must be notified: the device waits.
		send(1)
		require.Equal(t, n0+1, r.v.notifies, "lap %d: the idle device was not notified", lap)
		drain()
		require.Equal(t, 1, tx.Poll(comps[:]), "lap %d", lap)
	}
}

// TestNotifyDecisionPacked checks the packed ring's decision at every
// batch length, ring position and event position around a wrap, against
// the rule in absolute descriptor numbers: notify when the event names a
// descriptor published (within a ring's length before the next one), not
// when it names one still to come. One wrap bit tells 2 laps apart, so
// the events tried span the ring behind and the ring ahead.
func TestNotifyDecisionPacked(t *testing.T) {
	for _, size := range []int{minRingSize, 5, 8, 256} {
		r := newRig(t, size, true, true, 0)
		q := r.v
		wrong := 0
		for next := 2 * size; next < 6*size; next++ { // the next descriptor to publish
			for n := 1; n <= size; n++ { // descriptors in the batch
				for e := next - size; e < next+size; e++ { // the event
					q.availPos = uint16(next % size)
					q.availBits = descAvail // lap 0 has wrap counter 1
					if (next/size)%2 == 1 {
						q.availBits = descUsed
					}
					q.sinceKick = uint16(n)
					w := uint32(e%size) | eventDesc<<16
					if (e/size)%2 == 0 {
						w |= 1 << 15
					}
					atomic.StoreUint32(q.devEvent, w)
					if got, want := q.kickNeeded(), e < next; got != want && wrong < 10 {
						t.Errorf("size %d, next %d, batch %d, event %d: notify %v, want %v", size, next, n, e, got, want)
						wrong++
					}
				}
			}
		}
	}
}
