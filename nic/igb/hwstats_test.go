package igb

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/nic"
)

// TestHWStats: Open reads (clears) every statistics register and starts
// from zero; each HWStats read adds what the registers counted since the
// last one (they clear when read), the 64-bit byte counters from both
// halves; after Close the last totals come with ErrClosed.
func TestHWStats(t *testing.T) {
	f := newFakeRegs(t)
	f.set(regMPC, 99) // counted before this open
	d, err := startFake(f, Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	require.Positive(t, f.reads[regMPC], "cleared at open")
	require.Positive(t, f.reads[regGORCL+4], "the high half read, which clears both")

	// The fake register file does not clear on read: play the device.
	f.set(regMPC, 0)
	hw, err := d.HWStats()
	require.NoError(t, err)
	require.Equal(t, HWStats{}, hw, "nothing since open")

	f.set(regGPRC, 5)
	f.set(regMPC, 2)
	f.set(regRNBC, 3)
	f.set(regGORCL, 100)
	f.set(regGORCL+4, 1)
	f.set(regGOTCL, 7)
	hw, err = d.HWStats()
	require.NoError(t, err)
	require.EqualValues(t, 5, hw.RxGood)
	require.EqualValues(t, 2, hw.Missed)
	require.EqualValues(t, 3, hw.NoBuffer)
	require.EqualValues(t, 1<<32+100, hw.RxGoodBytes)
	require.EqualValues(t, 7, hw.TxGoodBytes)
	f.set(regGORCL+4, 0)
	f.set(regGPRC, 1)
	hw, err = d.HWStats()
	require.NoError(t, err)
	require.EqualValues(t, 6, hw.RxGood, "added to the total")

	require.NoError(t, d.Close())
	last, err := d.HWStats()
	require.ErrorIs(t, err, nic.ErrClosed)
	require.Equal(t, hw, last)
}
