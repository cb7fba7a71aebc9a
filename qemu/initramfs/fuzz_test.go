package initramfs

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// newcEntry is one entry of a newc archive as readNewc parses it.
type newcEntry struct {
	name         string
	mode         uint32
	data         string // file contents or symlink target
	major, minor uint32
}

// readNewc parses a newc archive as the kernel unpacks it: entries up to
// the trailer, which must end the archive.
func readNewc(b []byte) ([]newcEntry, error) {
	var out []newcEntry
	off := 0
	align := func() { off = (off + 3) &^ 3 }
	for {
		if len(b)-off < headerSize || string(b[off:off+6]) != newcMagic {
			return nil, fmt.Errorf("no header at %d", off)
		}
		var f [13]uint32
		for i := range f {
			v, err := strconv.ParseUint(string(b[off+6+8*i:off+14+8*i]), 16, 32)
			if err != nil {
				return nil, fmt.Errorf("field %d at %d: %v", i, off, err)
			}
			f[i] = uint32(v)
		}
		off += headerSize
		nameLen, size := int(f[11]), int(f[6])
		if nameLen < 1 || len(b)-off < nameLen || b[off+nameLen-1] != 0 {
			return nil, fmt.Errorf("bad name at %d", off)
		}
		name := string(b[off : off+nameLen-1])
		off += nameLen
		align()
		if name == trailerName {
			if off != len(b) {
				return nil, fmt.Errorf("%d bytes after the trailer", len(b)-off)
			}
			return out, nil
		}
		if len(b)-off < size {
			return nil, fmt.Errorf("short data of %q", name)
		}
		out = append(out, newcEntry{name: name, mode: f[1], data: string(b[off : off+size]), major: f[9], minor: f[10]})
		off += size
		align()
	}
}

// archiveOp is one call FuzzArchive makes.
type archiveOp struct {
	kind  int // 0 file, 1 dir, 2 symlink, 3 char device
	name  string
	data  string // contents or target
	perm  fs.FileMode
	major uint32
}

func (o archiveOp) apply(a *Archive) error {
	switch o.kind {
	case 0:
		return a.AddFile(o.name, o.perm, []byte(o.data))
	case 1:
		return a.AddDir(o.name, o.perm)
	case 2:
		return a.AddSymlink(o.name, o.data)
	}
	return a.AddCharDev(o.name, o.perm, o.major, o.major+1)
}

// archiveOps decodes FuzzArchive's input: per call a byte of kind (bits
// 0-1) and permission bits, a name and a content, each a length byte
// then the bytes.
func archiveOps(data []byte) []archiveOp {
	var ops []archiveOp
	next := func(max int) string {
		if len(data) == 0 {
			return ""
		}
		n := min(int(data[0])%max, len(data)-1)
		s := string(data[1 : 1+n])
		data = data[1+n:]
		return s
	}
	for len(data) > 0 && len(ops) < 32 {
		k := data[0]
		data = data[1:]
		ops = append(ops, archiveOp{kind: int(k & 3), perm: fs.FileMode(k>>2) & 0o77, major: uint32(k >> 2),
			name: next(24), data: next(40)})
	}
	return ops
}

// FuzzArchive adds entries to an archive as the input says (files,
// directories, symlinks and device nodes under arbitrary names) and
// checks what it writes: a refused call leaves no trace (the archive is
// byte for byte the one made of the accepted calls alone); the output is a
// newc archive the kernel unpacks up to its trailer, which ends it; every
// entry comes after its parent directory, once; and it holds exactly what
// the accepted calls added, the last of each name winning, with the
// parents they imply.
func FuzzArchive(f *testing.F) {
	op := func(kind byte, name, data string) []byte {
		return append(append(append([]byte{kind | 0xa0}, byte(len(name))), name...), append([]byte{byte(len(data))}, data...)...)
	}
	f.Add(bytes.Join([][]byte{op(0, "bin/tool", "ELF"), op(1, "tmp", ""), op(2, "bin/sh", "/bin/tool"),
		op(3, "dev/console", ""), op(0, "etc/odd", "five5")}, nil))
	f.Add(bytes.Join([][]byte{op(0, "a", "x"), op(0, "a/b", "y"), op(1, "a", "")}, nil))
	f.Add(bytes.Join([][]byte{op(0, "/../x", "1"), op(0, "x//y", "2"), op(0, "/", "3"), op(2, "l", "")}, nil))
	f.Add(bytes.Join([][]byte{op(0, "TRAILER!!!", "cut"), op(0, "zz", "after")}, nil))
	f.Fuzz(func(t *testing.T, data []byte) {
		ops := archiveOps(data)
		all, accepted := NewArchive(), NewArchive()
		type want struct {
			kind int
			data string
		}
		model := map[string]want{}
		for _, o := range ops {
			if err := o.apply(all); err != nil {
				require.True(t, errors.Is(err, ErrBadName) || errors.Is(err, ErrConflict), "%+v: %v", o, err)
				continue
			}
			require.NoError(t, o.apply(accepted), "%+v", o)
			n, err := cleanName(o.name)
			require.NoError(t, err)
			model[n] = want{o.kind, o.data}
			for dir := path.Dir(n); dir != "."; dir = path.Dir(dir) {
				if _, ok := model[dir]; !ok {
					model[dir] = want{kind: 1}
				}
			}
		}
		var b1, b2 bytes.Buffer
		n, err := all.WriteTo(&b1)
		require.NoError(t, err)
		require.Equal(t, int64(b1.Len()), n)
		_, err = accepted.WriteTo(&b2)
		require.NoError(t, err)
		require.Equal(t, b2.Bytes(), b1.Bytes(), "refused calls changed the archive (%+v)", ops)

		ents, err := readNewc(b1.Bytes())
		require.NoError(t, err, "%+v", ops)
		seen := map[string]bool{}
		for _, e := range ents {
			require.False(t, seen[e.name], "%q twice", e.name)
			seen[e.name] = true
			if d := path.Dir(e.name); d != "." {
				require.True(t, seen[d], "%q before its parent", e.name)
			}
			w, ok := model[e.name]
			require.True(t, ok, "%q never added (%+v)", e.name, ops)
			kinds := map[uint32]int{modeFile: 0, modeDir: 1, modeSymlink: 2, modeCharDev: 3}
			require.Equal(t, w.kind, kinds[e.mode&0o170000], "%q", e.name)
			if w.kind == 0 || w.kind == 2 {
				require.Equal(t, w.data, e.data, "%q", e.name)
			}
			require.False(t, strings.HasPrefix(e.name, "/") || strings.Contains(e.name, "//"), "%q", e.name)
		}
		require.Len(t, ents, len(model), "%+v", ops)
	})
}

// FuzzModulesDep parses arbitrary modules.dep text and resolves every
// module it names. Nothing panics or loops; a resolution lists each
// module once, after every module it depends on, and only modules the
// file names (built-in ones left out).
func FuzzModulesDep(f *testing.F) {
	f.Add("kernel/drivers/vfio/vfio.ko.zst: kernel/virt/lib/irqbypass.ko.zst\nkernel/virt/lib/irqbypass.ko.zst:\n" +
		"kernel/drivers/vfio/pci/vfio-pci.ko.zst: kernel/drivers/vfio/pci/vfio-pci-core.ko.zst kernel/drivers/vfio/vfio.ko.zst\n" +
		"kernel/drivers/vfio/pci/vfio-pci-core.ko.zst: kernel/drivers/vfio/vfio.ko.zst\n")
	f.Add("a.ko: b.ko\nb.ko: a.ko\n")
	f.Add("# comment\n\na.ko:\na.ko: b.ko\nb.ko: c.ko\n")
	f.Add("no colon here\n")
	f.Add(": x\n")
	f.Add("kernel/a.ko.ko: b.ko\nb.ko:\n")
	f.Add("a.ko: /.ko\n")
	f.Fuzz(func(t *testing.T, text string) {
		m, err := ParseModulesDep(strings.NewReader(text))
		if err != nil {
			return
		}
		for name := range m.byName {
			mods, err := m.Resolve(name)
			if err != nil {
				require.True(t, errors.Is(err, ErrModuleCycle) || errors.Is(err, ErrNoModule), "%q: %v", name, err)
				continue
			}
			pos := map[string]int{}
			for i, mod := range mods {
				_, dup := pos[mod.Name]
				require.False(t, dup, "%q listed twice", mod.Name)
				pos[mod.Name] = i
				_, ok := m.Lookup(mod.Name)
				require.True(t, ok, "%q", mod.Name)
			}
			require.Contains(t, pos, name)
			for _, mod := range mods {
				for _, d := range m.deps[mod.Name] {
					if m.IsBuiltin(d) {
						continue
					}
					require.Less(t, pos[d], pos[mod.Name], "%q before its dependency %q", mod.Name, d)
				}
			}
		}
	})
}
