package initramfs

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// needCPIO returns the host cpio; a missing cpio fails under CI and skips elsewhere.
func needCPIO(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("cpio")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("cpio not installed (CI=true): run scripts/setup.sh")
		}
		t.Skip("cpio not installed: run scripts/setup.sh")
	}
	return p
}

func sampleArchive(t *testing.T) (*bytes.Buffer, map[string][]byte, map[string]fs.FileMode) {
	t.Helper()
	files := map[string][]byte{
		"bin/tool":       bytes.Repeat([]byte{0x7f, 'E', 'L', 'F'}, 1001), // size % 4 == 0
		"etc/odd":        []byte("five5"),                                 // needs padding
		"etc/empty":      {},
		"deep/a/b/c.txt": []byte("nested\n"),
	}
	modes := map[string]fs.FileMode{"bin/tool": 0o755, "etc/odd": 0o640, "etc/empty": 0o600, "deep/a/b/c.txt": 0o644}
	host := filepath.Join(t.TempDir(), "hostfile")
	require.NoError(t, os.WriteFile(host, []byte("from the host, 31 bytes long..\n"), 0o700))
	files["opt/hostfile"] = []byte("from the host, 31 bytes long..\n")
	modes["opt/hostfile"] = 0o711

	a := NewArchive()
	for name, data := range files {
		if name == "opt/hostfile" {
			require.NoError(t, a.AddHostFile("/"+name, host, 0o711))
			continue
		}
		require.NoError(t, a.AddFile(name, modes[name], data))
	}
	require.NoError(t, a.AddDir("tmp", 0o1777|fs.ModeSticky))
	require.NoError(t, a.AddSymlink("bin/sh", "/bin/tool"))
	require.NoError(t, a.AddCharDev("dev/console", 0o600, 5, 1))
	var buf bytes.Buffer
	n, err := a.WriteTo(&buf)
	require.NoError(t, err)
	require.Equal(t, int64(buf.Len()), n)
	return &buf, files, modes
}

func TestCPIORoundTripList(t *testing.T) {
	cpio := needCPIO(t)
	buf, files, _ := sampleArchive(t)
	require.Zero(t, buf.Len()%4, "archive length is 4-byte aligned")

	cmd := exec.Command(cpio, "-t", "-v", "--quiet")
	cmd.Stdin = bytes.NewReader(buf.Bytes())
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "cpio -t: %s", out)
	listing := string(out)
	for name := range files {
		require.Contains(t, listing, " "+name+"\n", "listing names %s", name)
	}
	// Parents created implicitly, before their children.
	require.Less(t, strings.Index(listing, " deep/a/b\n"), strings.Index(listing, " deep/a/b/c.txt\n"))
	require.Contains(t, listing, "bin/sh -> /bin/tool")
	require.Regexp(t, `crw------- .* 5,\s+1 .* dev/console`, listing)
	require.Regexp(t, `drwxrwxrwt .* tmp\n`, listing)
	require.Regexp(t, `-rwxr-xr-x .* 4004 .* bin/tool`, listing)
}

func TestCPIORoundTripExtract(t *testing.T) {
	cpio := needCPIO(t)
	buf, files, modes := sampleArchive(t)
	dir := t.TempDir()
	cmd := exec.Command(cpio, "-i", "-d", "--quiet", "--no-absolute-filenames")
	cmd.Dir = dir
	cmd.Stdin = bytes.NewReader(buf.Bytes())
	out, err := cmd.CombinedOutput()
	if err != nil && os.Geteuid() != 0 && strings.Contains(string(out), "dev/console") {
		t.Logf("not root, device node not created: %s", out) // the rest is still checked
	} else {
		require.NoError(t, err, "cpio -i: %s", out)
	}
	for name, data := range files {
		p := filepath.Join(dir, name)
		got, err := os.ReadFile(p)
		require.NoError(t, err)
		require.Equal(t, data, got, name)
		st, err := os.Stat(p)
		require.NoError(t, err)
		require.Equal(t, modes[name], st.Mode().Perm(), "mode of %s", name)
	}
	l, err := os.Readlink(filepath.Join(dir, "bin/sh"))
	require.NoError(t, err)
	require.Equal(t, "/bin/tool", l)
	st, err := os.Stat(filepath.Join(dir, "tmp"))
	require.NoError(t, err)
	require.True(t, st.IsDir())
	require.Equal(t, fs.ModeSticky, st.Mode()&fs.ModeSticky)
	if os.Geteuid() == 0 {
		st, err := os.Lstat(filepath.Join(dir, "dev/console"))
		require.NoError(t, err)
		require.Equal(t, fs.ModeDevice|fs.ModeCharDevice, st.Mode()&(fs.ModeDevice|fs.ModeCharDevice))
	}
}

func TestWriterHeaderLayout(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	require.NoError(t, w.WriteFile("a", 0o644, []byte("xyz")))
	require.NoError(t, w.Close())
	require.NoError(t, w.Close(), "Close is idempotent")
	b := buf.Bytes()
	require.Equal(t, "070701", string(b[:6]))
	// 110-byte header + "a\0" = 112 (aligned), then 3 data bytes padded to 4.
	require.Equal(t, "a\x00", string(b[110:112]))
	require.Equal(t, "xyz\x00", string(b[112:116]))
	require.Equal(t, "070701", string(b[116:122]), "trailer header follows")
	require.Contains(t, string(b[116:]), "TRAILER!!!\x00")
	require.Zero(t, len(b)%4)
	require.ErrorIs(t, w.WriteFile("b", 0o644, nil), ErrClosed)
}

func TestBadNames(t *testing.T) {
	w := NewWriter(&bytes.Buffer{})
	for _, n := range []string{"", "a/../b", "./x", "a//b", "nul\x00"} {
		require.ErrorIs(t, w.WriteFile(n, 0o644, nil), ErrBadName, "%q", n)
	}
	require.ErrorIs(t, w.WriteSymlink("l", ""), ErrBadName)
}

func TestArchiveConflicts(t *testing.T) {
	a := NewArchive()
	require.NoError(t, a.AddFile("x/y", 0o644, []byte("1")))
	require.ErrorIs(t, a.AddFile("x", 0o644, nil), ErrConflict, "x is an implied directory")
	require.ErrorIs(t, a.AddFile("x/y/z", 0o644, nil), ErrConflict, "parent is a file")
	require.ErrorIs(t, a.AddSymlink("x/y", "t"), ErrConflict)
	require.NoError(t, a.AddFile("x/y", 0o600, []byte("2")), "a file may replace a file")
	require.NoError(t, a.AddDir("x", 0o700), "an implied directory may be made explicit")
	require.True(t, a.Has("/x/y"))
	err := a.AddHostFile("h", filepath.Join(t.TempDir(), "missing"), 0)
	require.Error(t, err)
	require.True(t, errors.Is(err, fs.ErrNotExist))
}

func TestAddHostTree(t *testing.T) {
	src := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(src, "sub"), 0o750))
	require.NoError(t, os.WriteFile(filepath.Join(src, "sub", "f"), []byte("data"), 0o640))
	require.NoError(t, os.Symlink("sub/f", filepath.Join(src, "link")))
	a := NewArchive()
	require.NoError(t, a.AddHostTree("/guest/td", src))
	require.True(t, a.Has("guest/td/sub/f"))
	require.True(t, a.Has("guest/td/link"))
	var buf bytes.Buffer
	_, err := a.WriteTo(&buf)
	require.NoError(t, err)
	require.Contains(t, buf.String(), "guest/td/sub/f\x00")
}
