package igbvm

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/eventfd"
	"github.com/vfnic/vfnic/nic/igb"
)

// linkDown is how long the host keeps the link down in a flap.
const linkDown = 2000 // ms

// linkEvent is one wake-up of a program sleeping on the link interrupt.
type linkEvent struct {
	n  uint64 // interrupts taken from the eventfd
	up bool   // Link() right after
	at time.Duration
}

func (e linkEvent) String() string {
	return fmt.Sprintf("%d interrupt(s), link up %v, at %v", e.n, e.up, e.at)
}

// TestGuestLinkInterrupt has the host take the NIC's link down and up
// from QEMU's monitor (set_link nic0 off, on 2 s later), twice: once with
// the program asleep on LinkInterrupt (calling Link after each wake-up,
// as the doc asks), which must wake once for the change to down and once
// for the change back up; once with Link polled every 10 ms, while
// Stats().ConfigInterrupts must count one interrupt per change. Traffic
// resumes after each flap. The interrupt registers are logged and checked
// for what makes a second interrupt possible: the other-causes vector's
// bit in EIAC, so its EICR bit clears when its MSI-X message goes out
// (QEMU's igb_raise_interrupts sends only newly raised EICR&EIMS bits),
// with ICR read by Link to clear LSC. (EIAM reads back as QEMU's model
// keeps it, which ORs in the complement of what is written, and does not
// apply: it is logged, not checked.)
func TestGuestLinkInterrupt(t *testing.T) {
	guestOnly(t)
	p := openPeer(t, igb.Config{})
	ir, err := p.dev.InterruptRegisters()
	require.NoError(t, err)
	t.Logf("interrupt registers after Open: GPIE %#x IVAR_MISC %#x EIMS %#x EIAC %#x EIAM %#x IMS %#x",
		ir.GPIE, ir.IVARMisc, ir.EIMS, ir.EIAC, ir.EIAM, ir.IMS)
	open := p.dev.Stats().ConfigInterrupts

	// Asleep on the link interrupt.
	efd := p.dev.LinkInterrupt()
	require.NotNil(t, efd)
	p.send(p.ctl(msgLinkFlap, linkDown))
	t0 := time.Now()
	var events []linkEvent
	for len(events) < 2 {
		n, err := efd.Wait(context.Background(), time.Now().Add(8*time.Second))
		if errors.Is(err, eventfd.ErrTimeout) {
			break
		}
		require.NoError(t, err)
		l, err := p.dev.Link()
		require.NoError(t, err)
		events = append(events, linkEvent{n: n, up: l.Up, at: time.Since(t0).Round(time.Millisecond)})
	}
	// Nothing more once the link is back up.
	extra, err := efd.Wait(context.Background(), time.Now().Add(time.Second))
	if !errors.Is(err, eventfd.ErrTimeout) {
		require.NoError(t, err)
	}
	t.Logf("asleep on LinkInterrupt through a flap (down %d ms): wake-ups %v, %d interrupt(s) after", linkDown, events, extra)
	require.Len(t, events, 2, "one wake-up for the change to down, one for the change back up")
	require.Equal(t, linkEvent{n: 1, up: false}, linkEvent{n: events[0].n, up: events[0].up}, "the first: one interrupt, link down")
	require.Equal(t, linkEvent{n: 1, up: true}, linkEvent{n: events[1].n, up: events[1].up}, "the second: one interrupt, link up")
	require.Zero(t, extra, "no interrupt without a change")
	p.hello() // traffic resumes

	// Link polled every 10 ms; the driver counts the interrupts.
	c0 := p.dev.Stats().ConfigInterrupts
	p.send(p.ctl(msgLinkFlap, linkDown))
	var seen []bool
	var counts []uint64
	deadline := time.Now().Add(15 * time.Second)
	for len(seen) < 2 && time.Now().Before(deadline) {
		l, err := p.dev.Link()
		require.NoError(t, err)
		if wasUp := len(seen) == 0 || seen[len(seen)-1]; l.Up != wasUp {
			seen = append(seen, l.Up)
			time.Sleep(200 * time.Millisecond) // the interrupt follows STATUS
			counts = append(counts, p.dev.Stats().ConfigInterrupts-c0)
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(time.Second)
	total := p.dev.Stats().ConfigInterrupts - c0
	t.Logf("Link polled through a flap: changes %v, ConfigInterrupts since the flap after each %v, %d in all (%d at Open)",
		seen, counts, total, open)
	require.Equal(t, []bool{false, true}, seen, "Link saw the link go down and come back")
	require.Equal(t, []uint64{1, 2}, counts, "one interrupt per change")
	require.EqualValues(t, 2, total)
	p.hello()

	ir, err = p.dev.InterruptRegisters()
	require.NoError(t, err)
	require.NotZero(t, ir.IVARMisc&(0x80<<8), "IVAR_MISC routes other causes to a vector")
	other := uint32(1) << (ir.IVARMisc >> 8 & 0x1f)
	require.NotZero(t, ir.EIMS&other, "the other-causes vector is unmasked")
	require.NotZero(t, ir.IMS&(1<<2), "ICR.LSC is enabled")
	require.NotZero(t, ir.EIAC&other, "EIAC auto-clears the other-causes vector's EICR bit")
}
