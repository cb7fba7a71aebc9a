package main

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/pci"
	"golang.org/x/sys/unix"
)

// TestRestoreNote: what -force gives back is said, and what the kernel
// refused is named with what to do; nothing to do says nothing.
func TestRestoreNote(t *testing.T) {
	a := addrs(t, "0000:7f:01.0")[0]
	require.Empty(t, restoreNote(a, func() ([]string, error) { return nil, nil }))
	require.Equal(t, "gave 0000:7f:01.0's interfaces back what they had: eth1: up, 10.0.0.2/24",
		restoreNote(a, func() ([]string, error) { return []string{"eth1: up, 10.0.0.2/24"}, nil }))
	refused := fmt.Errorf("%w: %w", pci.ErrNetRestore, fmt.Errorf("route to 10.9.0.0/16 on eth1: %w", unix.ENETUNREACH))
	require.Equal(t, "gave 0000:7f:01.0's interfaces back what they had: eth1: up; 0000:7f:01.0: the kernel refused "+
		"route to 10.9.0.0/16 on eth1: network is unreachable (configure those again by hand)",
		restoreNote(a, func() ([]string, error) { return []string{"eth1: up"}, refused }))
	gone := fmt.Errorf("%w: 0000:7f:01.0: its interfaces did not come back: %w", pci.ErrNetRestore, context.DeadlineExceeded)
	require.Equal(t, "0000:7f:01.0: its interfaces did not come back within 5s: configure them again by hand",
		restoreNote(a, func() ([]string, error) { return nil, gone }))
	require.Equal(t, "0000:7f:01.0: configuration not given back: boom",
		restoreNote(a, func() ([]string, error) { return nil, errors.New("boom") }))
}
