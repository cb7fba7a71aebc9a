package igb

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/nic"
)

// TestBusMasterAfterReset: a device that a killed process left running
// (receive and transmit enabled on rings at that process's addresses,
// its queue interrupts unmasked) gets bus mastering only once it has been
// reset, with receive and transmit off and every interrupt masked, and
// before any queue, ring register or DMA memory of the new owner exists.
// Bus mastering lets the device write memory and send MSI-X messages:
// turned on first, as Open did, the old rings could be used until the
// reset.
func TestBusMasterAfterReset(t *testing.T) {
	f := newFakeRegs(t)
	f.set(regRCTL, rctlEN)
	f.set(regTCTL, tctlEN)
	f.set(regRDBAL0, 0x1000)
	f.set(regRDLEN0, 256*16)
	f.set(regRDT0, 255)
	f.set(regTDBAL0, 0x2000)
	f.set(regTDLEN0, 256*16)
	f.set(regEIMS, 0x1f)
	d, err := startFake(f, Config{Config: nic.Config{QueuePairs: 2, QueueSize: 256}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	require.Equal(t, []masterChange{{on: true, resets: 1, tctl: tctlPSP}}, f.master,
		"bus mastering turned on once: after the reset, with receive, transmit and interrupts off, before any ring or queue")
	require.NotZero(t, f.get(regRCTL)&rctlEN, "receive enabled afterwards")
	require.Equal(t, [2]int{1, 1}, [2]int{f.writes[regRDBAL0], f.writes[regTDBAL0]}, "queue 0's rings programmed afterwards")
}
