package qmpask

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vfnic/vfnic/qemu"
)

// TestRequests: lines split across writes are put together, requests are
// found after other output on their line, and malformed ones, unknown
// operations and slots without a NIC are the Helper's errors; no request
// here reaches the monitor.
func TestRequests(t *testing.T) {
	var lines []string
	h := &Helper{Ctx: context.Background(), NICs: []qemu.NIC{{Slot: 4}, {Slot: 6}},
		Logf: func(format string, args ...any) { lines = append(lines, args[0].(string)) }}
	for _, w := range []string{"boot\nVFNIC-QMP bo", "gus 6 0\nxx VFNIC-QMP status 9 1\n", "VFNIC-QMP status 4\n", "VFNIC-QMP flap 4 x\n", "tail"} {
		n, err := h.Write([]byte(w))
		require.NoError(t, err)
		require.Equal(t, len(w), n)
	}
	h.Wait()
	require.Equal(t, []string{"boot", "VFNIC-QMP bogus 6 0", "xx VFNIC-QMP status 9 1", "VFNIC-QMP status 4", "VFNIC-QMP flap 4 x"}, lines)
	require.ElementsMatch(t, []string{
		`unknown request "bogus"`,
		"status: no NIC at slot 9",
		`bad request "VFNIC-QMP status 4"`,
		`bad request "VFNIC-QMP flap 4 x"`,
	}, h.errs)
}
