package owner

import (
	"errors"
	"github.com/vfnic/vfnic/nic"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestNilOwner: a device built without a PCI device behind it (the
// drivers' fakes) has a nil Owner, which holds and gives back nothing.
func TestNilOwner(t *testing.T) {
	var o *Owner
	var in nic.Info
	o.Record(&in)
	require.Empty(t, in.PreviousDriver)
	o.Watch(nil, func() { t.Fatal("no request to watch") })
	o.Wait()
	require.NoError(t, o.GiveBack(nic.ErrRemovedClosed))
}

// TestErrRemovedClosed matches both what a closed queue and a removed
// device report.
func TestErrRemovedClosed(t *testing.T) {
	require.True(t, errors.Is(nic.ErrRemovedClosed, os.ErrClosed))
	require.True(t, errors.Is(nic.ErrRemovedClosed, nic.ErrRemoved))
}
