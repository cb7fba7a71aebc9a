package qemu

import (
	"archive/tar"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// writeTar writes entries (name -> body; a name ending in / is a directory)
// as the guest's busybox tar would, onto a collect disk image.
func writeTar(t *testing.T, image string, entries [][2]string) {
	t.Helper()
	require.NoError(t, createCollectImage(image))
	f, err := os.OpenFile(image, os.O_WRONLY, 0)
	require.NoError(t, err)
	defer f.Close()
	tw := tar.NewWriter(f)
	for _, e := range entries {
		h := &tar.Header{Name: e[0], Mode: 0o644, Size: int64(len(e[1])), Typeflag: tar.TypeReg}
		if e[0][len(e[0])-1] == '/' {
			h.Typeflag, h.Mode, h.Size = tar.TypeDir, 0o755, 0
		}
		require.NoError(t, tw.WriteHeader(h))
		_, err := tw.Write([]byte(e[1]))
		require.NoError(t, err)
	}
	require.NoError(t, tw.Close())
}

func TestExtractCollect(t *testing.T) {
	dir := t.TempDir()
	img := filepath.Join(dir, "collect.img")
	cs := []Collect{
		{Guest: "/vfnic/out/cap.pcap", Host: filepath.Join(dir, "host", "cap.pcap")},
		{Guest: "/vfnic/cov", Host: filepath.Join(dir, "host", "cov"), Dir: true},
		{Guest: "/vfnic/cov/special", Host: filepath.Join(dir, "elsewhere")},
	}
	writeTar(t, img, [][2]string{
		{"vfnic/out/cap.pcap", "pcap bytes"},
		{"vfnic/cov/", ""},
		{"vfnic/cov/covmeta.1", "meta"},
		{"vfnic/cov/sub/", ""},
		{"vfnic/cov/sub/covcounters.1", "counters"},
		{"vfnic/cov/special", "nested Collect wins"},
	})
	got, err := extractCollect(img, cs)
	require.NoError(t, err)
	want := map[string]string{
		"host/cap.pcap":              "pcap bytes",
		"host/cov/covmeta.1":         "meta",
		"host/cov/sub/covcounters.1": "counters",
		"elsewhere":                  "nested Collect wins",
	}
	require.Len(t, got, len(want))
	for rel, body := range want {
		b, err := os.ReadFile(filepath.Join(dir, rel))
		require.NoError(t, err)
		require.Equal(t, body, string(b), rel)
		require.Contains(t, got, filepath.Join(dir, rel))
	}

	// A path that climbs out of its Collect, or one nobody asked for, is
	// refused and writes nothing outside the host paths.
	for _, name := range []string{"vfnic/cov/../../../escape", "etc/passwd"} {
		writeTar(t, img, [][2]string{{name, "x"}})
		_, err := extractCollect(img, cs)
		require.ErrorIs(t, err, ErrCollect, name)
	}
	_, err = os.Stat(filepath.Join(dir, "escape"))
	require.True(t, os.IsNotExist(err))

	// An empty disk (the guest had none of the paths) brings back nothing.
	require.NoError(t, os.Remove(img))
	require.NoError(t, createCollectImage(img))
	got, err = extractCollect(img, cs)
	require.NoError(t, err)
	require.Empty(t, got)
}

func TestCollectConfigErrors(t *testing.T) {
	for _, c := range [][]Collect{
		{{Guest: "rel/path", Host: "/h"}},
		{{Guest: "/", Host: "/h"}},
		{{Guest: "/x", Host: ""}},
		{{Guest: "/x y", Host: "/h"}},
		{{Guest: "/x/$(reboot)", Host: "/h"}},
		{{Guest: "/x", Host: "/h1"}, {Guest: "/x/", Host: "/h2"}},
	} {
		_, err := Run(context.Background(), Config{Collect: c}, Command{GuestPath: "/bin/true"})
		require.ErrorIs(t, err, ErrBadConfig, "%+v", c)
	}
}

func TestCollectArgs(t *testing.T) {
	require.Equal(t, []string{"-drive", "file=/tmp/a,,b/collect.img,format=raw,if=none,id=vfnic-collect,cache=unsafe",
		"-device", "virtio-blk-pci,drive=vfnic-collect,serial=vfnic-collect"}, collectArgs("/tmp/a,b/collect.img"))
}
