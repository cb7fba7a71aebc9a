package pci

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// BAR is one base address register, decoded from config space, with its
// size from sysfs when known.
type BAR struct {
	Index        int  // 0..5; a 64-bit BAR also occupies Index+1
	IO           bool // I/O port space rather than memory
	Is64         bool // 64-bit memory BAR
	Prefetchable bool
	// Addr is the bus address programmed in the BAR (0 when unassigned).
	Addr uint64
	// Size comes from the sysfs resource file; 0 when unknown or when the
	// BAR is not implemented.
	Size uint64
}

// BAR register bits.
const (
	barIO       = 1 << 0
	barType     = 3 << 1
	barType64   = 2 << 1
	barTypeRsvd = 3 << 1
	barPrefetch = 1 << 3
)

// BARs decodes the base address registers of the header (six for a type 0
// header, two for a bridge, one for CardBus). res, the parsed sysfs resource
// file, supplies sizes and may be nil. Every register slot is returned except
// the upper halves of 64-bit BARs; a slot with Size 0 is absent or unknown,
// since config space alone cannot tell without rewriting the BAR.
func (c *Config) BARs(res []Resource) ([]BAR, error) {
	var n int
	switch c.HeaderType {
	case 0:
		n = 6
	case 1:
		n = 2
	case 2:
		n = 1
	default:
		return nil, fmt.Errorf("%w: header type %d has no known BAR layout", ErrBadConfig, c.HeaderType)
	}
	var bars []BAR
	for i := 0; i < n; i++ {
		v := le32(c.Raw, 0x10+4*i)
		b := BAR{Index: i}
		switch {
		case v&barIO != 0:
			b.IO = true
			b.Addr = uint64(v &^ 3)
		case v&barType == barTypeRsvd:
			return nil, fmt.Errorf("%w: BAR%d (0x%08x) has the reserved memory type", ErrBadConfig, i, v)
		default:
			b.Prefetchable = v&barPrefetch != 0
			b.Addr = uint64(v &^ 0xf)
			if v&barType == barType64 {
				if i+1 >= n {
					return nil, fmt.Errorf("%w: 64-bit BAR%d (0x%08x) has no upper half", ErrBadConfig, i, v)
				}
				b.Is64 = true
				b.Addr |= uint64(le32(c.Raw, 0x10+4*(i+1))) << 32
			}
		}
		if i < len(res) {
			b.Size = res[i].Size()
		}
		bars = append(bars, b)
		if b.Is64 {
			i++
		}
	}
	return bars, nil
}

// Resource is one line of a sysfs resource file: the CPU physical range a
// BAR (lines 0-5), the expansion ROM (line 6) or a bridge window occupies,
// and the kernel's IORESOURCE_* flags for it.
type Resource struct {
	Start, End, Flags uint64
}

// Kernel IORESOURCE_* flags (include/linux/ioport.h) that matter here.
const (
	ioresourceIO       = 0x00000100
	ioresourceMem      = 0x00000200
	ioresourcePrefetch = 0x00002000
	ioresourceMem64    = 0x00100000
)

// Size returns the length of the range, 0 for an unused line.
func (r Resource) Size() uint64 {
	if (r.Start == 0 && r.End == 0) || r.End < r.Start {
		return 0
	}
	return r.End - r.Start + 1
}

// IsIO reports an I/O port range.
func (r Resource) IsIO() bool { return r.Flags&ioresourceIO != 0 }

// IsMem reports a memory range.
func (r Resource) IsMem() bool { return r.Flags&ioresourceMem != 0 }

// Is64 reports a 64-bit memory BAR.
func (r Resource) Is64() bool { return r.Flags&ioresourceMem64 != 0 }

// Prefetchable reports prefetchable memory.
func (r Resource) Prefetchable() bool { return r.Flags&ioresourcePrefetch != 0 }

// ParseResource parses a sysfs resource file: one "start end flags" line of
// hex numbers per resource.
func ParseResource(rd io.Reader) ([]Resource, error) {
	var out []Resource
	sc := bufio.NewScanner(rd)
	for line := 1; sc.Scan(); line++ {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		if len(f) != 3 {
			return nil, fmt.Errorf("pci: resource line %d: %q: want \"start end flags\"", line, sc.Text())
		}
		var v [3]uint64
		for i, s := range f {
			n, err := strconv.ParseUint(s, 0, 64)
			if err != nil {
				return nil, fmt.Errorf("pci: resource line %d: %w", line, err)
			}
			v[i] = n
		}
		out = append(out, Resource{Start: v[0], End: v[1], Flags: v[2]})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("pci: read resource: %w", err)
	}
	return out, nil
}

// Resources reads and parses the device's <dev>/resource file.
func (s Sysfs) Resources(a Address) ([]Resource, error) {
	p := filepath.Join(s.devDir(a), "resource")
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		if _, serr := os.Stat(s.devDir(a)); errors.Is(serr, fs.ErrNotExist) {
			return nil, fmt.Errorf("%w: %s", ErrNotFound, a)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("pci: open resource of %s: %w", a, err)
	}
	defer f.Close()
	res, err := ParseResource(f)
	if err != nil {
		return nil, fmt.Errorf("%w (in %s)", err, p)
	}
	return res, nil
}

// BARs reads the device's config space and resource file and returns its
// BARs with their sizes; see Config.BARs.
func (s Sysfs) BARs(a Address) ([]BAR, error) {
	c, err := s.Config(a)
	if err != nil {
		return nil, err
	}
	res, err := s.Resources(a)
	if err != nil {
		return nil, err
	}
	bars, err := c.BARs(res)
	if err != nil {
		return nil, fmt.Errorf("pci: BARs of %s: %w", a, err)
	}
	return bars, nil
}
