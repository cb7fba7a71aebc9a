package qemu

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// ErrCollect means files named in Config.Collect did not all come back from
// the guest: a path the payload did not write, or a transfer that failed.
var ErrCollect = errors.New("qemu: guest files not brought back")

// CollectLimit is the most a run can bring back from the guest, as one tar
// stream on a sparse raw disk: 1 GiB.
const CollectLimit = 1 << 30

// collectSerial identifies the disk the guest writes its files to, so that
// disks the caller adds through QEMUArgs are never overwritten.
const collectSerial = "vfnic-collect"

// Collect is a guest file or directory tree copied back to the host after
// the payload exits, whatever its exit status: a pcap, a profile, coverage
// data. The guest writes the files as one tar stream to a raw virtio-blk
// disk that the host reads once QEMU has exited, so the console carries
// no data and a few hundred MB come back as fast as the guest can write.
// Regular files and directories come back; symbolic links and device
// files are left out. The disk is one more PCI device in the guest (a
// virtio-blk, with a slot QEMU picks), present only when Collect is set.
type Collect struct {
	// Guest is the absolute guest path: a file or a directory.
	Guest string
	// Host is where it lands on the host: the file itself, or the directory
	// the tree's contents are merged into (created if needed).
	Host string
	// Dir makes /init create Guest as an empty directory before the
	// payload starts (for GOCOVERDIR, -test.outputdir); otherwise /init
	// only creates Guest's parent directory.
	Dir bool
}

func checkCollect(cs []Collect) error {
	seen := map[string]bool{}
	for _, c := range cs {
		g := path.Clean(c.Guest)
		if !path.IsAbs(c.Guest) || g == "/" || c.Host == "" {
			return fmt.Errorf("%w: Collect{Guest: %q, Host: %q} needs an absolute guest path other than / and a host path", ErrBadConfig, c.Guest, c.Host)
		}
		if strings.ContainsAny(g, " \t\n'\"\\$`*?[") {
			return fmt.Errorf("%w: Collect guest path %q holds white space or a shell special character", ErrBadConfig, c.Guest)
		}
		if seen[g] {
			return fmt.Errorf("%w: Collect guest path %q named twice", ErrBadConfig, g)
		}
		seen[g] = true
	}
	return nil
}

// collectModules drive the collect disk in the guest.
var collectModules = []string{"virtio_pci", "virtio_blk"}

// collectArgs are QEMU's arguments for the collect disk. The device has no
// address: QEMU gives it a free slot after the NICs and the caller's own
// devices, whatever slots those use.
func collectArgs(image string) []string {
	return []string{
		"-drive", "file=" + strings.ReplaceAll(image, ",", ",,") + ",format=raw,if=none,id=vfnic-collect,cache=unsafe",
		"-device", "virtio-blk-pci,drive=vfnic-collect,serial=" + collectSerial,
	}
}

// createCollectImage makes the sparse disk the guest writes into.
func createCollectImage(name string) error {
	f, err := os.Create(name)
	if err != nil {
		return fmt.Errorf("qemu: collect disk: %w", err)
	}
	if err := f.Truncate(CollectLimit); err != nil {
		f.Close()
		return fmt.Errorf("qemu: collect disk: %w", err)
	}
	return f.Close()
}

// extractCollect reads the tar stream the guest wrote to image and writes
// each entry under the Collect that names it. It returns the host paths of
// the files written.
func extractCollect(image string, cs []Collect) ([]string, error) {
	f, err := os.Open(image)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCollect, err)
	}
	defer f.Close()
	// Longest guest path first, so a nested Collect wins over its parent.
	byLen := append([]Collect(nil), cs...)
	sort.Slice(byLen, func(i, j int) bool { return len(byLen[i].Guest) > len(byLen[j].Guest) })
	var written []string
	tr := tar.NewReader(io.LimitReader(f, CollectLimit))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return written, nil
		}
		if err != nil {
			return written, fmt.Errorf("%w: reading the guest's tar stream: %v", ErrCollect, err)
		}
		name := "/" + strings.TrimSuffix(strings.TrimPrefix(h.Name, "./"), "/")
		dst, ok := collectDest(byLen, name)
		if !ok {
			return written, fmt.Errorf("%w: the guest wrote %q, which no Collect names", ErrCollect, h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(dst, 0o755); err != nil {
				return written, fmt.Errorf("%w: %v", ErrCollect, err)
			}
		case tar.TypeReg:
			if err := writeCollected(dst, tr, h.FileInfo().Mode().Perm()|0o600); err != nil {
				return written, err
			}
			written = append(written, dst)
		}
	}
}

// collectDest maps a guest path from the tar stream to its host path.
func collectDest(cs []Collect, name string) (string, bool) {
	for _, c := range cs {
		g := path.Clean(c.Guest)
		if name == g {
			return c.Host, true
		}
		if rel, ok := strings.CutPrefix(name, g+"/"); ok {
			rel = filepath.FromSlash(rel)
			if !filepath.IsLocal(rel) {
				return "", false
			}
			return filepath.Join(c.Host, rel), true
		}
	}
	return "", false
}

func writeCollected(dst string, r io.Reader, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("%w: %v", ErrCollect, err)
	}
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrCollect, err)
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return fmt.Errorf("%w: writing %s: %v", ErrCollect, dst, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("%w: writing %s: %v", ErrCollect, dst, err)
	}
	return nil
}
