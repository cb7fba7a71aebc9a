package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vfnic/vfnic/qemu"
)

func TestConfigure(t *testing.T) {
	t.Setenv("VFNIC_NICS", "")
	t.Setenv("VFNIC_TIMEOUT", "")
	t.Setenv("VFNIC_MEM", "2048")
	t.Setenv("VFNIC_MODULES", "virtio_net, e1000e")
	t.Setenv("VFNIC_GUEST_ENV", "A=1 B=2")
	cfg, cmd, err := configure("/tmp/x.test", []string{"-test.v", "-test.timeout=2m"})
	require.NoError(t, err)
	require.Len(t, cfg.NICs, 2)
	require.Equal(t, qemu.VirtioNet, cfg.NICs[0].Model)
	require.True(t, cfg.NICs[0].Packed)
	require.Equal(t, 2048, cfg.MemoryMB)
	require.Equal(t, []string{"virtio_net", "e1000e"}, cfg.Modules)
	require.Equal(t, []string{"A=1", "B=2"}, cmd.Env)
	require.Equal(t, 3*time.Minute, cfg.Timeout, "-test.timeout plus a minute")
	require.Equal(t, "/tmp/x.test", cmd.Path)

	t.Setenv("VFNIC_TIMEOUT", "30s")
	cfg, _, err = configure("/tmp/x.test", nil)
	require.NoError(t, err)
	require.Equal(t, 30*time.Second, cfg.Timeout)

	for env, val := range map[string]string{"VFNIC_TIMEOUT": "soon", "VFNIC_CPUS": "two", "VFNIC_NICS": "e1000e,addr=1"} {
		t.Run(env, func(t *testing.T) {
			t.Setenv(env, val)
			_, _, err := configure("/tmp/x.test", nil)
			require.Error(t, err)
		})
	}
}

func TestTestTimeout(t *testing.T) {
	d, ok := testTimeout([]string{"-test.v", "-test.timeout", "90s"})
	require.True(t, ok)
	require.Equal(t, 90*time.Second, d)
	_, ok = testTimeout([]string{"-args", "-test.timeout=1s"})
	require.False(t, ok, "flags after -args belong to the test")
}
