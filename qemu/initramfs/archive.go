package initramfs

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// ErrConflict is returned when an archive path is added twice with different kinds.
var ErrConflict = errors.New("initramfs: conflicting entries")

type entryKind int

const (
	kindDir entryKind = iota
	kindFile
	kindHostFile
	kindSymlink
	kindCharDev
)

type entry struct {
	kind         entryKind
	perm         fs.FileMode
	data         []byte
	hostPath     string
	target       string
	major, minor uint32
	explicit     bool // added by the caller rather than implied by a child
}

// Archive collects the contents of an initramfs and writes them as one newc
// cpio archive, parents before children. Missing parent directories are
// created with mode 0755. Host files are read only when the archive is
// written, so adding a large binary costs nothing until then.
type Archive struct {
	entries map[string]*entry
}

// NewArchive returns an empty archive.
func NewArchive() *Archive {
	return &Archive{entries: map[string]*entry{}}
}

func (a *Archive) add(name string, e *entry) error {
	n, err := cleanName(name)
	if err != nil {
		return err
	}
	e.explicit = true
	if n == "." && e.kind != kindDir {
		return fmt.Errorf("%w: \"/\" is a directory", ErrConflict)
	}
	if old, ok := a.entries[n]; ok {
		// An implied directory may be made explicit; anything else
		// replacing an entry of another kind is a caller mistake.
		switch {
		case old.kind == kindDir && e.kind == kindDir:
		case old.kind == kindDir && !old.explicit:
			return fmt.Errorf("%w: %q is a directory", ErrConflict, "/"+n)
		case old.kind != e.kind && !(isFileKind(old.kind) && isFileKind(e.kind)):
			return fmt.Errorf("%w: %q added twice with different kinds", ErrConflict, "/"+n)
		}
	}
	// The parents are checked before anything is added: a refused call
	// leaves the archive as it was.
	for dir := path.Dir(n); dir != "." && dir != "/"; dir = path.Dir(dir) {
		if old, ok := a.entries[dir]; ok && old.kind != kindDir {
			return fmt.Errorf("%w: parent %q of %q is not a directory", ErrConflict, "/"+dir, "/"+n)
		}
	}
	a.entries[n] = e
	for dir := path.Dir(n); dir != "." && dir != "/"; dir = path.Dir(dir) {
		if _, ok := a.entries[dir]; !ok {
			a.entries[dir] = &entry{kind: kindDir, perm: 0o755}
		}
	}
	return nil
}

func isFileKind(k entryKind) bool { return k == kindFile || k == kindHostFile }

// AddDir adds a directory.
func (a *Archive) AddDir(name string, perm fs.FileMode) error {
	return a.add(name, &entry{kind: kindDir, perm: perm})
}

// AddFile adds a regular file with the given contents; a later AddFile or
// AddHostFile of the same path replaces it.
func (a *Archive) AddFile(name string, perm fs.FileMode, data []byte) error {
	return a.add(name, &entry{kind: kindFile, perm: perm, data: bytes.Clone(data)})
}

// AddHostFile adds the host file hostPath at name. perm 0 keeps the host
// file's permission bits. The file must exist and be regular now; its
// contents are read when the archive is written.
func (a *Archive) AddHostFile(name, hostPath string, perm fs.FileMode) error {
	st, err := os.Stat(hostPath)
	if err != nil {
		return fmt.Errorf("initramfs: add %q: %w", hostPath, err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("initramfs: add %q: not a regular file", hostPath)
	}
	if perm == 0 {
		perm = st.Mode().Perm()
	}
	return a.add(name, &entry{kind: kindHostFile, perm: perm, hostPath: hostPath})
}

// AddHostTree adds the host directory hostDir and everything below it at
// name, keeping permission bits and symlinks. Other file types are skipped.
func (a *Archive) AddHostTree(name, hostDir string) error {
	return filepath.WalkDir(hostDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("initramfs: walk %q: %w", p, err)
		}
		rel, err := filepath.Rel(hostDir, p)
		if err != nil {
			return fmt.Errorf("initramfs: walk %q: %w", p, err)
		}
		dst := path.Join(name, filepath.ToSlash(rel))
		info, err := d.Info()
		if err != nil {
			return fmt.Errorf("initramfs: stat %q: %w", p, err)
		}
		switch {
		case d.IsDir():
			return a.AddDir(dst, info.Mode().Perm())
		case info.Mode()&fs.ModeSymlink != 0:
			t, err := os.Readlink(p)
			if err != nil {
				return fmt.Errorf("initramfs: readlink %q: %w", p, err)
			}
			return a.AddSymlink(dst, t)
		case info.Mode().IsRegular():
			return a.AddHostFile(dst, p, info.Mode().Perm())
		}
		return nil
	})
}

// AddSymlink adds a symbolic link name -> target.
func (a *Archive) AddSymlink(name, target string) error {
	if target == "" || strings.ContainsRune(target, 0) {
		// As the Writer would refuse it when the archive is written.
		return fmt.Errorf("%w: symlink target %q of %q", ErrBadName, target, name)
	}
	return a.add(name, &entry{kind: kindSymlink, perm: 0o777, target: target})
}

// AddCharDev adds a character device node.
func (a *Archive) AddCharDev(name string, perm fs.FileMode, major, minor uint32) error {
	return a.add(name, &entry{kind: kindCharDev, perm: perm, major: major, minor: minor})
}

// Has reports whether the archive holds an entry at name.
func (a *Archive) Has(name string) bool {
	n, err := cleanName(name)
	if err != nil {
		return false
	}
	_, ok := a.entries[n]
	return ok
}

// WriteTo writes the archive, trailer included, to w. It implements io.WriterTo.
func (a *Archive) WriteTo(w io.Writer) (int64, error) {
	names := make([]string, 0, len(a.entries))
	for n := range a.entries {
		names = append(names, n)
	}
	// A parent's name is a prefix of its children's, so it sorts first.
	sort.Strings(names)
	cw := &countWriter{w: w}
	cp := NewWriter(cw)
	for _, n := range names {
		if err := a.writeEntry(cp, n, a.entries[n]); err != nil {
			return cw.n, err
		}
	}
	err := cp.Close()
	return cw.n, err
}

func (a *Archive) writeEntry(cp *Writer, n string, e *entry) error {
	switch e.kind {
	case kindDir:
		return cp.WriteDir(n, e.perm)
	case kindFile:
		return cp.WriteFile(n, e.perm, e.data)
	case kindSymlink:
		return cp.WriteSymlink(n, e.target)
	case kindCharDev:
		return cp.WriteCharDev(n, e.perm, e.major, e.minor)
	case kindHostFile:
		f, err := os.Open(e.hostPath)
		if err != nil {
			return fmt.Errorf("initramfs: open %q: %w", e.hostPath, err)
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			return fmt.Errorf("initramfs: stat %q: %w", e.hostPath, err)
		}
		return cp.WriteFileFrom(n, e.perm, st.Size(), f)
	}
	return fmt.Errorf("initramfs: unknown entry kind %d for %q", e.kind, n)
}
