package qemu

import (
	"bytes"
	"compress/gzip"
	"context"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
)

// Booting a bzImage under TCG spends about 2.5 s decompressing the kernel in
// emulated code. QEMU can instead load the uncompressed vmlinux ELF through
// its PVH entry point, so the kernel is extracted once on the host and cached.

// xenElfnotePhys32Entry is the ELF note (owner "Xen") that marks a PVH entry point.
const xenElfnotePhys32Entry = 18

var pvhMu sync.Mutex

// PVHImage returns an uncompressed vmlinux with a PVH entry point extracted
// from k.Image, cached in CacheDir()/pvh. It returns an error when the image
// cannot be extracted (compression tool missing, kernel without PVH); the
// bzImage still boots then, only slower.
func (k *Kernel) PVHImage(ctx context.Context) (string, error) {
	pvhMu.Lock()
	defer pvhMu.Unlock()
	st, err := os.Stat(k.Image)
	if err != nil {
		return "", fmt.Errorf("qemu: stat kernel %s: %w", k.Image, err)
	}
	dir := filepath.Join(CacheDir(), "pvh")
	out := filepath.Join(dir, fmt.Sprintf("vmlinux-%s-%d", k.Version, st.Size()))
	if ost, err := os.Stat(out); err == nil && !ost.ModTime().Before(st.ModTime()) {
		return out, nil
	}
	data, err := os.ReadFile(k.Image)
	if err != nil {
		return "", fmt.Errorf("qemu: read kernel %s: %w", k.Image, err)
	}
	vmlinux, err := extractVmlinux(ctx, data)
	if err != nil {
		return "", fmt.Errorf("qemu: extract vmlinux from %s: %w", k.Image, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("qemu: create %s: %w", dir, err)
	}
	tmp, err := os.CreateTemp(dir, ".vmlinux-*")
	if err != nil {
		return "", fmt.Errorf("qemu: create temp file in %s: %w", dir, err)
	}
	_, werr := tmp.Write(vmlinux)
	_ = tmp.Chmod(0o644)
	cerr := tmp.Close()
	if werr != nil || cerr != nil {
		os.Remove(tmp.Name())
		return "", fmt.Errorf("qemu: write %s: %v %v", tmp.Name(), werr, cerr)
	}
	// Rename is atomic, so concurrent test processes never see half a file.
	if err := os.Rename(tmp.Name(), out); err != nil {
		os.Remove(tmp.Name())
		return "", fmt.Errorf("qemu: rename to %s: %w", out, err)
	}
	return out, nil
}

// extractVmlinux finds the compressed kernel inside a bzImage and returns
// it decompressed, checked to be an ELF with a PVH entry note.
func extractVmlinux(ctx context.Context, bz []byte) ([]byte, error) {
	formats := []struct {
		magic []byte
		tool  []string
	}{
		{[]byte{0xfd, '7', 'z', 'X', 'Z', 0}, []string{"xz", "-dc", "--single-stream"}},
		{[]byte{0x28, 0xb5, 0x2f, 0xfd}, []string{"zstd", "-dc"}},
		{[]byte{0x1f, 0x8b, 0x08}, nil}, // gzip, done in Go
	}
	var errs []error
	for _, f := range formats {
		i := bytes.Index(bz, f.magic)
		if i < 0 {
			continue
		}
		var out []byte
		var err error
		if f.tool == nil {
			var zr *gzip.Reader
			if zr, err = gzip.NewReader(bytes.NewReader(bz[i:])); err == nil {
				zr.Multistream(false)
				out, err = io.ReadAll(zr)
			}
		} else {
			var stdout bytes.Buffer
			cmd := exec.CommandContext(ctx, f.tool[0], f.tool[1:]...)
			cmd.Stdin, cmd.Stdout = bytes.NewReader(bz[i:]), &stdout
			// Trailing data after the stream may make the tool complain;
			// the output is judged by the ELF check below instead.
			err = cmd.Run()
			out = stdout.Bytes()
			if len(out) > 0 {
				err = nil
			}
		}
		if err == nil {
			err = checkPVH(out)
		}
		if err == nil {
			return out, nil
		}
		errs = append(errs, fmt.Errorf("at offset %d: %w", i, err))
	}
	if len(errs) == 0 {
		return nil, fmt.Errorf("no xz, zstd or gzip stream found")
	}
	return nil, fmt.Errorf("%v", errs)
}

// checkPVH fails unless b is an x86-64 ELF carrying the Xen PHYS32_ENTRY note.
func checkPVH(b []byte) error {
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return err
	}
	if f.Machine != elf.EM_X86_64 {
		return fmt.Errorf("ELF machine %v", f.Machine)
	}
	for _, p := range f.Progs {
		if p.Type != elf.PT_NOTE {
			continue
		}
		notes, err := io.ReadAll(p.Open())
		if err != nil {
			return err
		}
		for len(notes) >= 12 {
			nsz := int(binary.LittleEndian.Uint32(notes[0:]))
			dsz := int(binary.LittleEndian.Uint32(notes[4:]))
			typ := binary.LittleEndian.Uint32(notes[8:])
			nameEnd := 12 + (nsz+3)&^3
			next := nameEnd + (dsz+3)&^3
			if nsz < 0 || dsz < 0 || next > len(notes) || next <= 0 {
				break
			}
			if typ == xenElfnotePhys32Entry && bytes.Equal(bytes.TrimRight(notes[12:12+nsz], "\x00"), []byte("Xen")) {
				return nil
			}
			notes = notes[next:]
		}
	}
	return fmt.Errorf("no PVH entry note (kernel built without CONFIG_PVH)")
}
