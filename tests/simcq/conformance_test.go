package simcq

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vfnic/vfnic/cq/qpsim"
	"github.com/vfnic/vfnic/tests/conformance"
)

func TestConformance(t *testing.T) {
	d, err := qpsim.New(qpsim.Config{})
	require.NoError(t, err)
	defer func() { require.NoError(t, d.Close()) }()
	conformance.Run(t, &Provider{Dev: d})
}
