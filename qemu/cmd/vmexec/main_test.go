package main

import (
	"debug/elf"
	"os"
	"path/filepath"
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

// TestMapOutputs rewrites the arguments `go test -exec vmexec -cover
// -coverprofile=/tmp/c.out -cpuprofile=cpu.out` passes to the binary.
func TestMapOutputs(t *testing.T) {
	args := []string{"-test.paniconexit0", "-test.gocoverdir=/tmp/go-build1/b001/gocoverdir", "-test.timeout=10m0s",
		"-test.outputdir=/work/pkg", "-test.coverprofile=/tmp/go-build1/b001/_cover_.out", "-test.cpuprofile", "cpu prof.out",
		"-test.run=TestX", "-args", "-test.memprofile=/not/a/flag/here"}
	got, collect, env, err := mapOutputs(args, "/tmp/go-build1/b001/gocoverdir")
	require.NoError(t, err)
	require.Equal(t, []string{"-test.paniconexit0", "-test.gocoverdir=/vfnic/out/d0", "-test.timeout=10m0s",
		"-test.outputdir=/vfnic/out/d1", "-test.coverprofile=/vfnic/out/f0/_cover_.out", "-test.cpuprofile", "/vfnic/out/f1/cpu_prof.out",
		"-test.run=TestX", "-args", "-test.memprofile=/not/a/flag/here"}, got)
	require.Equal(t, []qemu.Collect{
		{Guest: "/vfnic/out/d0", Host: "/tmp/go-build1/b001/gocoverdir", Dir: true},
		{Guest: "/vfnic/out/d1", Host: "/work/pkg", Dir: true},
		{Guest: "/vfnic/out/f0/_cover_.out", Host: "/tmp/go-build1/b001/_cover_.out"},
		{Guest: "/vfnic/out/f1/cpu_prof.out", Host: "/work/pkg/cpu prof.out"},
	}, collect)
	require.Equal(t, []string{"GOCOVERDIR=/vfnic/out/d0"}, env, "the same directory maps once")

	// Nothing to bring back: the arguments stay as they were.
	plain := []string{"-test.v=true", "-test.run=X"}
	got, collect, env, err = mapOutputs(plain, "")
	require.NoError(t, err)
	require.Equal(t, plain, got)
	require.Empty(t, collect)
	require.Empty(t, env)

	// A relative profile without -test.outputdir is relative to here.
	wd, err := os.Getwd()
	require.NoError(t, err)
	_, collect, _, err = mapOutputs([]string{"-test.trace=t.out"}, "")
	require.NoError(t, err)
	require.Equal(t, []qemu.Collect{{Guest: "/vfnic/out/f5/t.out", Host: filepath.Join(wd, "t.out")}}, collect)
}

// TestDynamicPayload: a payload built with cgo (a dynamic executable) is
// refused before any guest boots, saying how to build it static.
func TestDynamicPayload(t *testing.T) {
	qemu.RequireVM(t) // the plan needs the kernel; nothing boots
	dyn := "/bin/true"
	f, err := elf.Open(dyn)
	require.NoError(t, err)
	interp := false
	for _, p := range f.Progs {
		interp = interp || p.Type == elf.PT_INTERP
	}
	f.Close()
	require.True(t, interp, "%s is dynamic on this host", dyn)
	cfg, cmd, err := configure(dyn, nil)
	require.NoError(t, err)
	_, err = qemu.Run(t.Context(), cfg, cmd)
	require.ErrorIs(t, err, qemu.ErrBadConfig)
	require.ErrorContains(t, err, "is dynamically linked (built with cgo?)")
	require.ErrorContains(t, err, "CGO_ENABLED=0 go test -exec vmexec ./pkg")
	require.NotContains(t, err.Error(), "busybox")
}
