package initramfs

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func names(mods []Module) []string {
	var n []string
	for _, m := range mods {
		n = append(n, m.Name)
	}
	return n
}

func TestResolveFixture(t *testing.T) {
	m, err := LoadModules("testdata")
	require.NoError(t, err)
	mods, err := m.Resolve("vfio-pci", "vfio_iommu_type1")
	require.NoError(t, err)
	// modprobe's order: a line's dependencies from last to first.
	require.Equal(t, []string{"irqbypass", "vfio", "vfio_virqfd", "vfio_pci_core", "vfio_pci", "vfio_iommu_type1"}, names(mods))
	require.Equal(t, "kernel/drivers/vfio/pci/vfio-pci.ko", mods[4].Path)
	require.Equal(t, "/lib/modules/6.1.0-x/kernel/drivers/vfio/pci/vfio-pci.ko", mods[4].GuestPath("6.1.0-x"))

	// Every module comes after all its dependencies, each once.
	mods, err = m.Resolve("virtio_net", "vfio_pci", "failover", "virtio")
	require.NoError(t, err)
	pos := map[string]int{}
	for i, mod := range mods {
		_, dup := pos[mod.Name]
		require.False(t, dup, "%s listed twice", mod.Name)
		pos[mod.Name] = i
	}
	for _, mod := range mods {
		for _, d := range m.deps[mod.Name] {
			require.Less(t, pos[d], pos[mod.Name], "%s before %s", d, mod.Name)
		}
	}
	_, builtin := pos["virtio"]
	require.False(t, builtin, "built-in modules are not loaded")
	require.True(t, m.IsBuiltin("e1000e"))
	vn, ok := m.Lookup("virtio-net")
	require.True(t, ok)
	require.Equal(t, "/lib/modules/v/kernel/drivers/net/virtio_net.ko", vn.GuestPath("v"), "compression suffix dropped")

	_, err = m.Resolve("nosuch")
	require.ErrorIs(t, err, ErrNoModule)
	_, err = m.Resolve("broken")
	require.ErrorIs(t, err, ErrNoModule)
	require.Contains(t, err.Error(), "needed by broken")
}

func TestResolveCycleAndBadInput(t *testing.T) {
	m, err := ParseModulesDep(strings.NewReader("a.ko: b.ko\nb.ko: a.ko\n"))
	require.NoError(t, err)
	_, err = m.Resolve("a")
	require.ErrorIs(t, err, ErrModuleCycle)
	_, err = ParseModulesDep(strings.NewReader("no colon here\n"))
	require.Error(t, err)
	// Files that name no module Lookup could find again (found by
	// FuzzModulesDep: ".ko" became a module named "").
	for _, dep := range []string{".:\n.ko:\n", "kernel/.ko.xz:\n", "a.ko: .ko\n", "a.ko.ko:\n", "/:\n"} {
		_, err = ParseModulesDep(strings.NewReader(dep))
		require.ErrorContains(t, err, "is not a module file", "%q", dep)
	}
	_, err = LoadModules(t.TempDir())
	require.ErrorIs(t, err, ErrNoModulesDep)
	require.Equal(t, "vfio_pci", CanonicalName("kernel/drivers/vfio/pci/vfio-pci.ko.zst"))
}

func TestAddModulesDecompresses(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "kernel"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "kernel", "plain.ko"), []byte("plain"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "modules.dep"), []byte("kernel/plain.ko:\nkernel/gz.ko.gz:\n"), 0o644))
	var gz strings.Builder
	writeGzip(t, &gz, "gzipped module")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "kernel", "gz.ko.gz"), []byte(gz.String()), 0o644))
	m, err := LoadModules(dir)
	require.NoError(t, err)
	mods, err := m.Resolve("plain", "gz")
	require.NoError(t, err)
	a := NewArchive()
	require.NoError(t, a.AddModules(context.Background(), m, "v", mods))
	require.True(t, a.Has("lib/modules/v/kernel/plain.ko"))
	require.True(t, a.Has("lib/modules/v/kernel/gz.ko"))
	e := a.entries["lib/modules/v/kernel/gz.ko"]
	require.Equal(t, "gzipped module", string(e.data))
}
