package afxdp

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	vt "github.com/vfnic/vfnic/internal/vethtest"
	"github.com/vfnic/vfnic/nic"
)

func TestOpenInfoClose(t *testing.T) {
	v := vt.New(t, 2)
	var dev nic.Device
	require.NoError(t, vt.In(v.A, func() (err error) {
		dev, err = nic.Open(context.Background(), "afxdp:vfx0", nic.Config{QueuePairs: 2})
		return err
	}))
	t.Logf("%+v", dev.Info())
	l, err := dev.Link()
	require.NoError(t, err)
	require.True(t, l.Up)
	require.NoError(t, dev.Close())
}
