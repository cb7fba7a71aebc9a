package vfio

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sync"
	"unsafe"

	"github.com/vfnic/vfnic/eventfd"
	"golang.org/x/sys/unix"
)

// DeviceInfo is what VFIO_DEVICE_GET_INFO reports.
type DeviceInfo struct {
	Flags      DeviceFlags
	NumRegions int // region indexes are 0..NumRegions-1
	NumIRQs    int // IRQ indexes are 0..NumIRQs-1
}

// Device is an open VFIO device. Its methods are safe for concurrent use;
// memory returned by MapRegion is accessed without locks.
//
// Only Group.OpenDevice makes a Device. Any other (the zero value) owns no
// descriptor: its methods that would use one return an error matching
// ErrInvalid (os.ErrInvalid) and its Close does nothing, so that none of
// them uses fd 0, which belongs to someone else.
type Device struct {
	g    *Group
	addr string
	info DeviceInfo
	made bool // by Group.OpenDevice

	mu      sync.Mutex
	fd      int
	closed  bool
	regions map[int]RegionInfo // region info never changes while the fd is open
	maps    []*RegionMapping
	irqs    map[int]int // enabled IRQ index -> number of vectors wired
	req     *eventfd.FD // the device-request interrupt; nil when the device has none
}

// newDevice reads the device info of a freshly opened device fd.
func newDevice(g *Group, addr string, fd int) (*Device, error) {
	di := deviceInfo{Argsz: uint32(sizeofDeviceInfo)}
	if _, err := ioctlPtr(fd, ioctlDeviceGetInfo, unsafe.Pointer(&di)); err != nil {
		return nil, fmt.Errorf("vfio: VFIO_DEVICE_GET_INFO on device %s: %w", addr, err)
	}
	return &Device{
		g:    g,
		addr: addr,
		info: DeviceInfo{Flags: DeviceFlags(di.Flags), NumRegions: int(di.NumRegions), NumIRQs: int(di.NumIRQs)},
		made: true,
		fd:   fd,
		irqs: make(map[int]int),
	}, nil
}

// Addr is the device name given to OpenDevice.
func (d *Device) Addr() string { return d.addr }

// Info returns the device flags and region/IRQ counts read at open.
func (d *Device) Info() DeviceInfo { return d.info }

// errf builds an error naming the operation and the device.
func (d *Device) errf(op string, err error) error {
	return fmt.Errorf("vfio: %s on device %s: %w", op, d.addr, err)
}

// usableLocked reports ErrClosed after Close, and ErrInvalid for a Device
// that OpenDevice did not make.
func (d *Device) usableLocked(op string) error {
	if !d.made {
		return errNotMade(op, "Device")
	}
	if d.closed {
		return d.errf(op, ErrClosed)
	}
	return nil
}

// RegionInfo returns region index's info, with its capability chain
// (VFIO_DEVICE_GET_REGION_INFO, repeated with a larger buffer when the
// chain does not fit). vfio-pci: indexes 0-5 are BARs, 6 the ROM, 7 config
// space, 8 VGA (absent on most devices: an error).
func (d *Device) RegionInfo(index int) (RegionInfo, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.regionInfoLocked(index)
}

func (d *Device) regionInfoLocked(index int) (RegionInfo, error) {
	const op = "VFIO_DEVICE_GET_REGION_INFO"
	if err := d.usableLocked(op); err != nil {
		return RegionInfo{}, err
	}
	if ri, ok := d.regions[index]; ok {
		return ri, nil
	}
	if index < 0 || index >= d.info.NumRegions {
		return RegionInfo{}, d.errf(op, fmt.Errorf("region %d: device has regions 0..%d: %w", index, d.info.NumRegions-1, ErrOutOfRange))
	}
	buf, err := fetchInfo(sizeofRegionInfo,
		func(b []byte) { ne.PutUint32(b[8:], uint32(index)) },
		func(b []byte) error { _, err := ioctlBuf(d.fd, ioctlDeviceGetRegionInfo, b); return err })
	if err != nil {
		return RegionInfo{}, d.errf(op, fmt.Errorf("region %d: %w", index, err))
	}
	ri, err := parseRegionInfo(buf)
	if err != nil {
		return RegionInfo{}, d.errf(op, fmt.Errorf("region %d: %w", index, err))
	}
	if ri.Index != index {
		return RegionInfo{}, d.errf(op, fmt.Errorf("asked for region %d, kernel answered %d: %w", index, ri.Index, ErrBadInfo))
	}
	if d.regions == nil {
		d.regions = make(map[int]RegionInfo)
	}
	d.regions[index] = ri
	return ri, nil
}

// regionIOLocked bounds a pread/pwrite of len(p) bytes at off within a
// region; it returns the device-fd offset and how many bytes fit.
func (d *Device) regionIOLocked(op string, index int, need RegionFlags, lenp int, off int64) (int64, int, error) {
	ri, err := d.regionInfoLocked(index)
	if err != nil {
		return 0, 0, err
	}
	if ri.Flags&need == 0 {
		return 0, 0, d.errf(op, fmt.Errorf("region %d does not allow this access (flags %#x): %w", index, uint32(ri.Flags), ErrNotSupported))
	}
	if off < 0 {
		return 0, 0, d.errf(op, fmt.Errorf("region %d: negative offset %d: %w", index, off, ErrInvalid))
	}
	if uint64(off) >= ri.Size {
		return 0, 0, nil
	}
	n := uint64(lenp)
	if rem := ri.Size - uint64(off); n > rem {
		n = rem
	}
	pos := ri.Offset + uint64(off)
	if pos > math.MaxInt64 || pos+n > math.MaxInt64 {
		return 0, 0, d.errf(op, fmt.Errorf("region %d offset %#x beyond what pread can address: %w", index, pos, ErrOutOfRange))
	}
	return int64(pos), int(n), nil
}

// ReadRegion reads from region index at offset off (pread on the device
// fd): the region-relative io.ReaderAt contract, io.EOF at the region end.
func (d *Device) ReadRegion(index int, p []byte, off int64) (int, error) {
	const op = "pread"
	d.mu.Lock()
	defer d.mu.Unlock()
	pos, n, err := d.regionIOLocked(op, index, RegionFlagRead, len(p), off)
	if err != nil {
		return 0, err
	}
	done := 0
	for done < n {
		k, err := unix.Pread(d.fd, p[done:n], pos+int64(done))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return done, d.errf(op, fmt.Errorf("region %d offset %#x: %w", index, off+int64(done), err))
		}
		if k == 0 {
			break
		}
		done += k
	}
	if done < len(p) {
		return done, io.EOF
	}
	return done, nil
}

// WriteRegion writes to region index at offset off (pwrite on the device
// fd). Bytes beyond the region end are not written: the error then wraps
// ErrOutOfRange.
func (d *Device) WriteRegion(index int, p []byte, off int64) (int, error) {
	const op = "pwrite"
	d.mu.Lock()
	defer d.mu.Unlock()
	pos, n, err := d.regionIOLocked(op, index, RegionFlagWrite, len(p), off)
	if err != nil {
		return 0, err
	}
	done := 0
	for done < n {
		k, err := unix.Pwrite(d.fd, p[done:n], pos+int64(done))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return done, d.errf(op, fmt.Errorf("region %d offset %#x: %w", index, off+int64(done), err))
		}
		if k == 0 {
			return done, d.errf(op, fmt.Errorf("region %d offset %#x: %w", index, off+int64(done), io.ErrShortWrite))
		}
		done += k
	}
	if done < len(p) {
		return done, d.errf(op, fmt.Errorf("region %d: write of %d bytes at %#x passes the region end: %w", index, len(p), off, ErrOutOfRange))
	}
	return done, nil
}

// Interface checks: config space is what the pci package's capability
// walk reads; mappings are closers.
var (
	_ io.ReaderAt = (*ConfigSpace)(nil)
	_ io.WriterAt = (*ConfigSpace)(nil)
	_ io.Closer   = (*RegionMapping)(nil)
	_ io.Closer   = (*Device)(nil)
	_ io.Closer   = (*Group)(nil)
	_ io.Closer   = (*Container)(nil)
)

// ConfigSpace reads and writes the device's PCI config space through the
// config region (index RegionConfig). Offsets are config-space offsets.
type ConfigSpace struct{ d *Device }

// ReadAt implements io.ReaderAt over config space.
func (c *ConfigSpace) ReadAt(p []byte, off int64) (int, error) {
	return c.d.ReadRegion(RegionConfig, p, off)
}

// WriteAt implements io.WriterAt over config space. vfio-pci virtualizes
// some fields (BARs, MSI/MSI-X control) and ignores writes to others.
func (c *ConfigSpace) WriteAt(p []byte, off int64) (int, error) {
	return c.d.WriteRegion(RegionConfig, p, off)
}

// Size is the size of config space (256 for PCI, 4096 for PCIe).
func (c *ConfigSpace) Size() (int64, error) {
	ri, err := c.d.RegionInfo(RegionConfig)
	if err != nil {
		return 0, err
	}
	return int64(ri.Size), nil
}

// ConfigReader returns the device's config space as an io.ReaderAt (and
// io.WriterAt); the pci package's capability walk reads through it.
func (d *Device) ConfigReader() *ConfigSpace { return &ConfigSpace{d: d} }

// readConfig reads exactly len(b) bytes of config space at off.
func (d *Device) readConfig(b []byte, off int64) error {
	if _, err := d.ReadRegion(RegionConfig, b, off); err != nil {
		if errors.Is(err, io.EOF) {
			return d.errf("config read", fmt.Errorf("%d bytes at %#x pass the end of config space: %w", len(b), off, ErrOutOfRange))
		}
		return err
	}
	return nil
}

// ReadConfig8 reads the config-space byte at off.
func (d *Device) ReadConfig8(off int64) (uint8, error) {
	var b [1]byte
	err := d.readConfig(b[:], off)
	return b[0], err
}

// ReadConfig16 reads the little-endian 16-bit config-space word at off.
func (d *Device) ReadConfig16(off int64) (uint16, error) {
	var b [2]byte
	err := d.readConfig(b[:], off)
	return binary.LittleEndian.Uint16(b[:]), err
}

// ReadConfig32 reads the little-endian 32-bit config-space word at off.
func (d *Device) ReadConfig32(off int64) (uint32, error) {
	var b [4]byte
	err := d.readConfig(b[:], off)
	return binary.LittleEndian.Uint32(b[:]), err
}

// WriteConfig8 writes the config-space byte at off.
func (d *Device) WriteConfig8(off int64, v uint8) error {
	_, err := d.WriteRegion(RegionConfig, []byte{v}, off)
	return err
}

// WriteConfig16 writes a little-endian 16-bit config-space word at off.
func (d *Device) WriteConfig16(off int64, v uint16) error {
	_, err := d.WriteRegion(RegionConfig, binary.LittleEndian.AppendUint16(nil, v), off)
	return err
}

// WriteConfig32 writes a little-endian 32-bit config-space word at off.
func (d *Device) WriteConfig32(off int64, v uint32) error {
	_, err := d.WriteRegion(RegionConfig, binary.LittleEndian.AppendUint32(nil, v), off)
	return err
}

// Reset resets the device (VFIO_DEVICE_RESET: FLR, PM or bus reset as the
// kernel chooses). Without DeviceFlagReset the error wraps ErrNotSupported:
// the driver must reset through the device's own registers.
func (d *Device) Reset() error {
	const op = "VFIO_DEVICE_RESET"
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.usableLocked(op); err != nil {
		return err
	}
	if d.info.Flags&DeviceFlagReset == 0 {
		return d.errf(op, fmt.Errorf("device reports no VFIO reset: %w", ErrNotSupported))
	}
	if _, err := ioctl(d.fd, ioctlDeviceReset, 0); err != nil {
		return d.errf(op, err)
	}
	return nil
}

// forget drops a closed region mapping from the device's list.
func (d *Device) forget(m *RegionMapping) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.maps = slices.DeleteFunc(d.maps, func(x *RegionMapping) bool { return x == m })
}

// Close unmaps the device's region mappings and closes the device fd; the
// kernel then disables the device's interrupts and bus mastering and resets
// it if it can. Eventfds passed to EnableIRQ stay open (they are the
// caller's); the Request eventfd, the device's own, is closed, which wakes
// a goroutine waiting on it with eventfd.ErrClosed. Idempotent. Close of a
// Device that OpenDevice did not make does nothing.
func (d *Device) Close() error {
	if !d.made {
		return nil
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	maps := d.maps
	d.maps = nil
	d.mu.Unlock()

	var errs []error
	for _, m := range maps {
		errs = append(errs, m.Close())
	}
	d.mu.Lock()
	if err := unix.Close(d.fd); err != nil {
		errs = append(errs, d.errf("close", err))
	}
	d.fd = -1
	req := d.req
	d.mu.Unlock()
	if req != nil {
		errs = append(errs, req.Close())
	}
	if d.g != nil {
		d.g.forget(d)
	}
	return errors.Join(errs...)
}

// PCI command register bits that a userspace driver owns.
const (
	pciCommand       = 0x04
	pciCommandMemory = 0x2 // respond to memory-space (BAR) accesses
	pciCommandMaster = 0x4 // bus master: the device may issue DMA and MSI writes
)

// SetBusMaster turns the device's bus mastering on or off, and its
// memory-space decoding on either way, so that its registers answer. VFIO
// does not enable bus mastering: without it the device's DMA and its
// MSI/MSI-X messages go nowhere. A driver turns it off when it takes the
// device (a previous owner may have left it running), resets the device
// through its registers, turns it on before starting queues, and off on
// the way out.
func (d *Device) SetBusMaster(on bool) error {
	cmd, err := d.ReadConfig16(pciCommand)
	if err != nil {
		return err
	}
	cmd |= pciCommandMemory
	if on {
		cmd |= pciCommandMaster
	} else {
		cmd &^= pciCommandMaster
	}
	return d.WriteConfig16(pciCommand, cmd)
}
