package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCheckMissingKernel: -check with an empty cache names the missing
// kernel and where it goes, installs nothing, and fails.
func TestCheckMissingKernel(t *testing.T) {
	cache := t.TempDir()
	t.Setenv("VFNIC_CACHE", cache)
	var out, errw bytes.Buffer
	code := run(t.Context(), []string{"-check"}, &out, &errw)
	require.Equal(t, 1, code, out.String())
	require.Contains(t, out.String(), "missing: the guest kernel in "+filepath.Join(cache, "kernel"))
	require.Contains(t, errw.String(), "run `go run github.com/vfnic/vfnic/qemu/cmd/vmsetup` as root")
	entries, err := os.ReadDir(cache)
	require.NoError(t, err)
	require.Empty(t, entries, "-check installs nothing")
}

func TestUsage(t *testing.T) {
	var out, errw bytes.Buffer
	require.Equal(t, 2, run(t.Context(), []string{"extra"}, &out, &errw))
	require.Contains(t, errw.String(), "takes no arguments")
	require.Equal(t, 2, run(t.Context(), []string{"-nosuch"}, &out, &errw))
}

func TestKernelPackage(t *testing.T) {
	pkg, err := kernelPackage("linux-image-amd64\n  Depends: linux-image-6.1.0-56-amd64\n  Depends: initramfs-tools\n")
	require.NoError(t, err)
	require.Equal(t, "linux-image-6.1.0-56-amd64", pkg)
	_, err = kernelPackage("linux-image-amd64\n  Depends: linux-image-amd64-signed\n")
	require.ErrorContains(t, err, "apt-cache depends linux-image-amd64")
}

// fakeApt plays apt-get, dpkg and depmod: download writes a .deb, dpkg -x
// unpacks a kernel and its modules, depmod writes modules.dep.
type fakeApt struct{ ran []string }

func (f *fakeApt) run(_ context.Context, dir, name string, args ...string) error {
	f.ran = append(f.ran, filepath.Base(name)+" "+strings.Join(args, " "))
	switch {
	case name == "apt-get" && args[0] == "download":
		return os.WriteFile(filepath.Join(dir, args[len(args)-1]+".deb"), []byte("deb"), 0o644)
	case name == "dpkg":
		root := args[2]
		if err := os.MkdirAll(filepath.Join(root, "boot"), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(root, "boot", "vmlinuz-6.1.0-9-amd64"), []byte("k"), 0o644); err != nil {
			return err
		}
		return os.MkdirAll(filepath.Join(root, "lib", "modules", "6.1.0-9-amd64"), 0o755)
	case filepath.Base(name) == "depmod":
		return os.WriteFile(filepath.Join(args[1], "lib", "modules", args[2], "modules.dep"), []byte("x"), 0o644)
	}
	return nil
}

func (f *fakeApt) output(_ context.Context, name string, args ...string) (string, error) {
	if name == "apt-cache" {
		return "linux-image-amd64\n  Depends: linux-image-6.1.0-9-amd64\n", nil
	}
	return "", fmt.Errorf("unexpected %s", name)
}

// TestFetchKernel: the kernel package behind linux-image-amd64 is
// downloaded, unpacked into the cache (not /boot) and indexed.
func TestFetchKernel(t *testing.T) {
	if depmod() == "" {
		t.Skip("no depmod on this host: the index step names it")
	}
	kdir := filepath.Join(t.TempDir(), "kernel")
	f := &fakeApt{}
	s := &setup{out: &bytes.Buffer{}, runner: f}
	require.NoError(t, s.fetchKernel(t.Context(), kdir))
	require.NoError(t, s.index(t.Context(), kdir))
	require.FileExists(t, filepath.Join(kdir, "boot", "vmlinuz-6.1.0-9-amd64"))
	require.FileExists(t, filepath.Join(kdir, "lib", "modules", "6.1.0-9-amd64", "modules.dep"))
	require.Equal(t, "apt-get update -qq", f.ran[0])
	require.Equal(t, "apt-get download -qq linux-image-6.1.0-9-amd64", f.ran[1])
	require.Contains(t, f.ran[2], "dpkg -x ")
	require.Contains(t, f.ran[3], "depmod -b "+kdir+" 6.1.0-9-amd64")
	require.NoDirExists(t, kdir+".new")
}
