// Package initramfs writes Linux initramfs archives: a newc ("070701") cpio
// writer, an Archive that collects files, directories, symlinks and device
// nodes and fills in missing parent directories, and a resolver for kernel
// modules and their dependencies from modules.dep.
package initramfs

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strings"
)

// Errors returned by the cpio writer and the archive.
var (
	// ErrBadName is returned for an empty, absolute-escaping or NUL-bearing entry name.
	ErrBadName = errors.New("initramfs: bad entry name")
	// ErrClosed is returned when writing to a Writer after Close.
	ErrClosed = errors.New("initramfs: writer closed")
	// ErrTooLarge is returned for a field that does not fit newc's 32-bit header fields.
	ErrTooLarge = errors.New("initramfs: value too large for a newc header")
)

// newc header: magic then 13 eight-digit hex fields; 110 bytes in all.
const (
	newcMagic   = "070701"
	headerSize  = 110
	trailerName = "TRAILER!!!"
)

// Mode bits of the cpio c_mode field (the same values as st_mode).
const (
	modeDir     = 0o040000
	modeFile    = 0o100000
	modeSymlink = 0o120000
	modeCharDev = 0o020000
)

// Writer writes a newc cpio archive. Each entry gets a fresh inode number so
// that the kernel never mistakes two entries for hard links of one file.
// Call Close to write the trailer.
type Writer struct {
	w      io.Writer
	off    int64
	ino    uint32
	closed bool
	err    error
}

// NewWriter returns a Writer that writes a newc archive to w.
func NewWriter(w io.Writer) *Writer {
	return &Writer{w: w, ino: 1}
}

// header describes one archive entry before it is encoded.
type header struct {
	name      string
	mode      uint32 // type and permission bits
	size      int64
	rdevMajor uint32
	rdevMinor uint32
	nlink     uint32
	uid, gid  uint32
	mtime     uint32
}

// cleanName turns an archive path into the relative form cpio uses
// ("bin/sh", "." for the root) and rejects names the kernel cannot unpack.
func cleanName(name string) (string, error) {
	if name == "" || strings.ContainsRune(name, 0) {
		return "", fmt.Errorf("%w: %q", ErrBadName, name)
	}
	n := strings.Trim(name, "/")
	if n == "" || n == "." {
		return ".", nil // the root, as "/" or as cleanName gave it
	}
	if n == trailerName {
		// The kernel stops unpacking at the entry of this name.
		return "", fmt.Errorf("%w: %q ends a cpio archive", ErrBadName, name)
	}
	for _, part := range strings.Split(n, "/") {
		if part == "" || part == "." || part == ".." {
			return "", fmt.Errorf("%w: %q", ErrBadName, name)
		}
	}
	return n, nil
}

func (w *Writer) write(p []byte) error {
	if w.err != nil {
		return w.err
	}
	n, err := w.w.Write(p)
	w.off += int64(n)
	if err != nil {
		w.err = fmt.Errorf("initramfs: write cpio: %w", err)
	}
	return w.err
}

// pad writes zero bytes up to the next 4-byte boundary, as newc requires
// after the name and after the data.
func (w *Writer) pad() error {
	var zeros [3]byte
	if r := w.off % 4; r != 0 {
		return w.write(zeros[:4-r])
	}
	return nil
}

func (w *Writer) writeHeader(h header) error {
	if w.closed {
		return ErrClosed
	}
	if h.size < 0 || h.size > 0xffffffff {
		return fmt.Errorf("%w: size %d of %q", ErrTooLarge, h.size, h.name)
	}
	ino := w.ino
	w.ino++
	if h.nlink == 0 {
		h.nlink = 1
	}
	hdr := fmt.Sprintf("%s%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
		newcMagic, ino, h.mode, h.uid, h.gid, h.nlink, h.mtime, uint32(h.size),
		0, 0, h.rdevMajor, h.rdevMinor, len(h.name)+1, 0)
	if len(hdr) != headerSize {
		return fmt.Errorf("%w: header of %q", ErrTooLarge, h.name)
	}
	if err := w.write([]byte(hdr)); err != nil {
		return err
	}
	if err := w.write(append([]byte(h.name), 0)); err != nil {
		return err
	}
	return w.pad()
}

// WriteFile adds a regular file with the given permission bits and contents.
func (w *Writer) WriteFile(name string, perm fs.FileMode, data []byte) error {
	n, err := cleanName(name)
	if err != nil {
		return err
	}
	if err := w.writeHeader(header{name: n, mode: modeFile | unixPerm(perm), size: int64(len(data))}); err != nil {
		return err
	}
	if err := w.write(data); err != nil {
		return err
	}
	return w.pad()
}

// WriteFileFrom adds a regular file of the given size whose contents are read
// from r, so large binaries are streamed rather than held in memory.
func (w *Writer) WriteFileFrom(name string, perm fs.FileMode, size int64, r io.Reader) error {
	n, err := cleanName(name)
	if err != nil {
		return err
	}
	if err := w.writeHeader(header{name: n, mode: modeFile | unixPerm(perm), size: size}); err != nil {
		return err
	}
	if w.err != nil {
		return w.err
	}
	cw := &countWriter{w: w.w}
	copied, err := io.CopyN(cw, r, size)
	w.off += cw.n
	if err != nil {
		w.err = fmt.Errorf("initramfs: copy %q (%d of %d bytes): %w", n, copied, size, err)
		return w.err
	}
	return w.pad()
}

// WriteDir adds a directory with the given permission bits.
func (w *Writer) WriteDir(name string, perm fs.FileMode) error {
	n, err := cleanName(name)
	if err != nil {
		return err
	}
	return w.writeHeader(header{name: n, mode: modeDir | unixPerm(perm), nlink: 2})
}

// WriteSymlink adds a symbolic link name -> target.
func (w *Writer) WriteSymlink(name, target string) error {
	n, err := cleanName(name)
	if err != nil {
		return err
	}
	if target == "" || strings.ContainsRune(target, 0) {
		return fmt.Errorf("%w: symlink target %q of %q", ErrBadName, target, name)
	}
	if err := w.writeHeader(header{name: n, mode: modeSymlink | 0o777, size: int64(len(target))}); err != nil {
		return err
	}
	if err := w.write([]byte(target)); err != nil {
		return err
	}
	return w.pad()
}

// WriteCharDev adds a character device node (for example /dev/console, 5:1),
// which the kernel needs before devtmpfs is mounted.
func (w *Writer) WriteCharDev(name string, perm fs.FileMode, major, minor uint32) error {
	n, err := cleanName(name)
	if err != nil {
		return err
	}
	return w.writeHeader(header{name: n, mode: modeCharDev | unixPerm(perm), rdevMajor: major, rdevMinor: minor})
}

// Close writes the trailer entry. It does not close the underlying writer.
// Calling Close again does nothing.
func (w *Writer) Close() error {
	if w.closed {
		return w.err
	}
	err := w.writeHeader(header{name: trailerName})
	w.closed = true
	return err
}

// unixPerm maps Go's permission and special bits to the st_mode layout.
func unixPerm(m fs.FileMode) uint32 {
	p := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		p |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		p |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		p |= 0o1000
	}
	return p
}

// countWriter counts bytes written, to keep track of newc's 4-byte alignment.
type countWriter struct {
	w io.Writer
	n int64
}

// Write forwards to the underlying writer, counting bytes.
func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
