package vfio

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// DefaultContainerPath is the VFIO container device; groups are opened
// next to it as <dir>/<group number>.
const DefaultContainerPath = "/dev/vfio/vfio"

// iommuBackend is the part of the container fd that DMA bookkeeping uses;
// the kernel implements it, host tests substitute a model of type1v2.
type iommuBackend interface {
	getInfo(buf []byte) error
	mapDMA(vaddr, iova, size uint64) error
	unmapDMA(iova, size uint64) (unmapped uint64, err error)
}

// kernelIOMMU issues the type1 IOMMU ioctls on a container fd.
type kernelIOMMU struct{ fd int }

func (k kernelIOMMU) getInfo(buf []byte) error {
	_, err := ioctlBuf(k.fd, ioctlIOMMUGetInfo, buf)
	return err
}

func (k kernelIOMMU) mapDMA(vaddr, iova, size uint64) error {
	m := dmaMap{
		Argsz: uint32(sizeofDMAMap),
		Flags: dmaMapFlagRead | dmaMapFlagWrite,
		Vaddr: vaddr,
		IOVA:  iova,
		Size:  size,
	}
	_, err := ioctlPtr(k.fd, ioctlIOMMUMapDMA, unsafe.Pointer(&m))
	return err
}

func (k kernelIOMMU) unmapDMA(iova, size uint64) (uint64, error) {
	u := dmaUnmap{Argsz: uint32(sizeofDMAUnmap), IOVA: iova, Size: size}
	_, err := ioctlPtr(k.fd, ioctlIOMMUUnmapDMA, unsafe.Pointer(&u))
	// The kernel reports in Size how much it actually unmapped.
	return u.Size, err
}

// DMAMapping is one MapDMA mapping the container tracks.
type DMAMapping struct {
	IOVA uint64  // first IO virtual address
	Size uint64  // bytes
	Addr uintptr // process virtual address of the memory
}

// dmaEntry is a tracked mapping; mem keeps the memory referenced for as
// long as the device may access it.
type dmaEntry struct {
	DMAMapping
	mem []byte
}

func (e *dmaEntry) last() uint64 { return e.IOVA + e.Size - 1 }

// Container is an open VFIO container (/dev/vfio/vfio): the IOMMU context
// its groups' devices share. Its methods are safe for concurrent use.
//
// Only OpenContainerAt makes a Container. Any other (the zero value) owns
// no descriptor: its methods return an error matching ErrInvalid
// (os.ErrInvalid) and its Close does nothing, so that none of them uses
// fd 0, which belongs to someone else.
type Container struct {
	path string
	dir  string
	made bool // by OpenContainerAt

	mu       sync.Mutex
	fd       int
	closed   bool
	iommu    iommuBackend
	groups   []*Group
	iommuSet bool       // VFIO_SET_IOMMU done; undone by the kernel when the last group leaves
	info     IOMMUInfo  // cached at group attach and by IOMMUInfo
	maps     []dmaEntry // sorted by IOVA, non-overlapping
}

// OpenContainer opens DefaultContainerPath; see OpenContainerAt.
func OpenContainer() (*Container, error) { return OpenContainerAt(DefaultContainerPath) }

// OpenContainerAt opens the VFIO container device at path and checks that
// it speaks VFIO API version 0 and offers the type1v2 IOMMU. Groups are
// looked up in the same directory. A missing device wraps ErrNoVFIO; a
// file that is not a VFIO container wraps ErrNotVFIO.
func OpenContainerAt(path string) (*Container, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		perr := &fs.PathError{Op: "open", Path: path, Err: err}
		if err == unix.ENOENT || err == unix.ENODEV || err == unix.ENXIO {
			return nil, fmt.Errorf("vfio: %w: the vfio modules are not loaded (modprobe vfio-pci): %w", perr, ErrNoVFIO)
		}
		return nil, fmt.Errorf("vfio: %w", perr)
	}
	v, err := ioctl(fd, ioctlGetAPIVersion, 0)
	if err != nil {
		unix.Close(fd)
		if err == unix.ENOTTY || err == unix.EINVAL {
			return nil, fmt.Errorf("vfio: VFIO_GET_API_VERSION on %s: %w: not a VFIO container: %w", path, err, ErrNotVFIO)
		}
		return nil, fmt.Errorf("vfio: VFIO_GET_API_VERSION on %s: %w", path, err)
	}
	if v != APIVersion {
		unix.Close(fd)
		return nil, fmt.Errorf("vfio: %s speaks VFIO API version %d, want %d: %w", path, v, APIVersion, ErrNotSupported)
	}
	ok, err := ioctl(fd, ioctlCheckExtension, ExtType1v2IOMMU)
	if err != nil || ok <= 0 {
		unix.Close(fd)
		if err == nil {
			err = errors.New("extension absent")
		}
		return nil, fmt.Errorf("vfio: VFIO_CHECK_EXTENSION(TYPE1v2) on %s: %v: the type1v2 IOMMU is unavailable "+
			"(load vfio_iommu_type1 and boot with the IOMMU enabled, e.g. intel_iommu=on): %w", path, err, ErrNotSupported)
	}
	return &Container{
		path:  path,
		dir:   filepath.Dir(path),
		made:  true,
		fd:    fd,
		iommu: kernelIOMMU{fd: fd},
	}, nil
}

// Path is the container device path.
func (c *Container) Path() string { return c.path }

// CheckExtension reports whether the container supports a VFIO extension
// (one of the Ext constants).
func (c *Container) CheckExtension(ext int) (bool, error) {
	if !c.made {
		return false, errNotMade("VFIO_CHECK_EXTENSION", "Container")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false, fmt.Errorf("vfio: VFIO_CHECK_EXTENSION on %s: %w", c.path, ErrClosed)
	}
	r, err := ioctl(c.fd, ioctlCheckExtension, uintptr(ext))
	if err != nil {
		return false, fmt.Errorf("vfio: VFIO_CHECK_EXTENSION(%d) on %s: %w", ext, c.path, err)
	}
	return r > 0, nil
}

// OpenGroup opens IOMMU group n (<dir>/<n>), checks that it is viable and
// attaches it to the container. Attaching the first group sets the type1v2
// IOMMU. The group's devices must all be bound to vfio-pci (or to no
// driver); otherwise the error wraps ErrGroupNotViable.
func (c *Container) OpenGroup(n int) (*Group, error) {
	if n < 0 {
		return nil, fmt.Errorf("vfio: group %d: negative group number: %w", n, ErrInvalid)
	}
	if !c.made {
		return nil, errNotMade("open group", "Container")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, fmt.Errorf("vfio: open group %d on %s: %w", n, c.path, ErrClosed)
	}
	path := filepath.Join(c.dir, strconv.Itoa(n))
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		perr := &fs.PathError{Op: "open", Path: path, Err: err}
		switch err {
		case unix.ENOENT, unix.ENODEV, unix.ENXIO:
			return nil, fmt.Errorf("vfio: group %d: %w: no device of IOMMU group %d is bound to vfio-pci: %w", n, perr, n, ErrNoDevice)
		case unix.EBUSY:
			return nil, fmt.Errorf("vfio: group %d: %w: the group is already open (another process, or an earlier OpenGroup): %w", n, perr, ErrBusy)
		}
		return nil, fmt.Errorf("vfio: group %d: %w", n, perr)
	}
	g, err := c.attachLocked(n, path, fd)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	return g, nil
}

// attachLocked runs the group status check, SET_CONTAINER, SET_IOMMU for
// the first group and the IOMMU info refresh. On error the group is
// detached again; the caller closes fd.
func (c *Container) attachLocked(n int, path string, fd int) (*Group, error) {
	st := groupStatus{Argsz: uint32(sizeofGroupStatus)}
	if _, err := ioctlPtr(fd, ioctlGroupGetStatus, unsafe.Pointer(&st)); err != nil {
		if err == unix.ENOTTY || err == unix.EINVAL {
			return nil, fmt.Errorf("vfio: VFIO_GROUP_GET_STATUS on %s: %w: not a VFIO group: %w", path, err, ErrNotVFIO)
		}
		return nil, fmt.Errorf("vfio: VFIO_GROUP_GET_STATUS on %s: %w", path, err)
	}
	if err := checkGroupStatus(n, path, st.Flags); err != nil {
		return nil, err
	}
	cfd := int32(c.fd)
	if _, err := ioctlPtr(fd, ioctlGroupSetContainer, unsafe.Pointer(&cfd)); err != nil {
		if err == unix.EBUSY {
			return nil, fmt.Errorf("vfio: VFIO_GROUP_SET_CONTAINER on group %d: %w: %w", n, err, ErrBusy)
		}
		return nil, fmt.Errorf("vfio: VFIO_GROUP_SET_CONTAINER on group %d: %w", n, err)
	}
	if !c.iommuSet {
		if _, err := ioctl(c.fd, ioctlSetIOMMU, ExtType1v2IOMMU); err != nil {
			ioctl(fd, ioctlGroupUnsetContainer, 0)
			return nil, fmt.Errorf("vfio: VFIO_SET_IOMMU(TYPE1v2) on %s for group %d: %w", c.path, n, err)
		}
		c.iommuSet = true
	}
	// Reserved regions of the new group's devices can remove IOVA ranges.
	if err := c.refreshInfoLocked(); err != nil {
		ioctl(fd, ioctlGroupUnsetContainer, 0)
		if len(c.groups) == 0 {
			c.iommuSet = false
		}
		return nil, fmt.Errorf("%w (attaching group %d)", err, n)
	}
	g := &Group{c: c, num: n, path: path, fd: fd}
	c.groups = append(c.groups, g)
	return g, nil
}

// checkGroupStatus refuses a group that is not viable or already
// attached to a container, given VFIO_GROUP_GET_STATUS flags.
func checkGroupStatus(n int, path string, flags uint32) error {
	if flags&groupFlagsViable == 0 {
		return fmt.Errorf("vfio: group %d (%s) is not viable: every device in IOMMU group %d must be bound to vfio-pci "+
			"or have no driver (see /sys/kernel/iommu_groups/%d/devices): %w", n, path, n, n, ErrGroupNotViable)
	}
	if flags&groupFlagsContainerSet != 0 {
		return fmt.Errorf("vfio: group %d (%s) is already attached to a container: %w", n, path, ErrBusy)
	}
	return nil
}

// detach forgets a closed group. When the last group leaves, the kernel
// drops the IOMMU with all its mappings, so the container does too.
func (c *Container) detach(g *Group) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.groups = slices.DeleteFunc(c.groups, func(x *Group) bool { return x == g })
	if len(c.groups) == 0 {
		c.iommuSet = false
		c.info = IOMMUInfo{}
		c.maps = nil
	}
}

// refreshInfoLocked fetches VFIO_IOMMU_GET_INFO (two calls when the
// capability chain does not fit) and caches it.
func (c *Container) refreshInfoLocked() error {
	buf, err := fetchInfo(sizeofIOMMUInfo, nil, c.iommu.getInfo)
	if err != nil {
		return fmt.Errorf("vfio: VFIO_IOMMU_GET_INFO on %s: %w", c.path, err)
	}
	info, err := parseIOMMUInfo(buf)
	if err != nil {
		return fmt.Errorf("vfio: VFIO_IOMMU_GET_INFO on %s: %w", c.path, err)
	}
	c.info = info
	return nil
}

// usableLocked checks that the container is open and has an IOMMU.
func (c *Container) usableLocked(op string) error {
	if !c.made {
		return errNotMade(op, "Container")
	}
	if c.closed {
		return fmt.Errorf("vfio: %s on %s: %w", op, c.path, ErrClosed)
	}
	if !c.iommuSet {
		return fmt.Errorf("vfio: %s on %s: open a group first (the IOMMU is set when the first group attaches): %w", op, c.path, ErrNoGroup)
	}
	return nil
}

// IOMMUInfo queries the IOMMU's page sizes, usable IOVA ranges and
// remaining mapping count. It needs an attached group.
func (c *Container) IOMMUInfo() (IOMMUInfo, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.usableLocked("VFIO_IOMMU_GET_INFO"); err != nil {
		return IOMMUInfo{}, err
	}
	if err := c.refreshInfoLocked(); err != nil {
		return IOMMUInfo{}, err
	}
	info := c.info
	info.IOVARanges = slices.Clone(info.IOVARanges)
	return info, nil
}

// IOVARanges returns the IOVA ranges the IOMMU can map (End inclusive),
// as the kernel reports them. DMA must only use IOVAs inside them. The
// error wraps ErrNotSupported when the kernel does not report ranges.
func (c *Container) IOVARanges() ([]IOVARange, error) {
	info, err := c.IOMMUInfo()
	if err != nil {
		return nil, err
	}
	if info.IOVARanges == nil {
		return nil, fmt.Errorf("vfio: VFIO_IOMMU_GET_INFO on %s: kernel reports no IOVA range capability: %w", c.path, ErrNotSupported)
	}
	return info.IOVARanges, nil
}

// pageSizeLocked is the alignment MAP_DMA requires.
func (c *Container) pageSizeLocked() uint64 {
	if p := c.info.MinPageSize(); p != 0 {
		return p
	}
	return uint64(os.Getpagesize())
}

// MapDMA maps mem for device reads and writes at IOVA iova
// (VFIO_IOMMU_MAP_DMA with READ|WRITE). Before any ioctl it checks that
// [iova, iova+len(mem)) lies inside one reported IOVA range (ErrOutOfRange),
// that the address, length and iova are multiples of the IOMMU page size
// (ErrUnaligned) and that no tracked mapping overlaps (ErrOverlap). The
// container keeps mem referenced until the mapping is removed. When the
// kernel reports no IOVA ranges, only the kernel checks the range.
func (c *Container) MapDMA(mem []byte, iova uint64) error {
	const op = "VFIO_IOMMU_MAP_DMA"
	if len(mem) == 0 {
		return fmt.Errorf("vfio: %s iova %#x on %s: empty memory: %w", op, iova, c.path, ErrInvalid)
	}
	vaddr := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(mem))))
	size := uint64(len(mem))
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.usableLocked(op); err != nil {
		return err
	}
	if err := checkDMA(c.info.IOVARanges, c.pageSizeLocked(), vaddr, iova, size); err != nil {
		return fmt.Errorf("vfio: %s on %s: %w", op, c.path, err)
	}
	i, err := insertPoint(c.maps, iova, size)
	if err != nil {
		return fmt.Errorf("vfio: %s on %s: %w", op, c.path, err)
	}
	if err := c.iommu.mapDMA(vaddr, iova, size); err != nil {
		hint := ""
		switch err {
		case unix.ENOMEM:
			hint = " (pinning needs CAP_IPC_LOCK or a larger RLIMIT_MEMLOCK)"
		case unix.ENOSPC:
			hint = " (the container's DMA mapping limit is reached)"
		case unix.EEXIST:
			err = fmt.Errorf("%w: %w", err, ErrOverlap)
		}
		return fmt.Errorf("vfio: %s iova %#x size %#x addr %#x on %s: %w%s", op, iova, size, vaddr, c.path, err, hint)
	}
	c.maps = slices.Insert(c.maps, i, dmaEntry{DMAMapping{IOVA: iova, Size: size, Addr: uintptr(vaddr)}, mem})
	return nil
}

// UnmapDMA removes the DMA mappings inside [iova, iova+size)
// (VFIO_IOMMU_UNMAP_DMA). Like MapDMA it checks range and alignment before
// any ioctl; the range must cover whole mappings (type1v2 cannot split
// one: ErrOverlap) and at least one (ErrNotMapped).
func (c *Container) UnmapDMA(iova, size uint64) error {
	const op = "VFIO_IOMMU_UNMAP_DMA"
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.usableLocked(op); err != nil {
		return err
	}
	if err := checkDMA(c.info.IOVARanges, c.pageSizeLocked(), 0, iova, size); err != nil {
		return fmt.Errorf("vfio: %s on %s: %w", op, c.path, err)
	}
	i, j, err := unmapSpan(c.maps, iova, size)
	if err != nil {
		return fmt.Errorf("vfio: %s on %s: %w", op, c.path, err)
	}
	var want uint64
	for _, e := range c.maps[i:j] {
		want += e.Size
	}
	got, err := c.iommu.unmapDMA(iova, size)
	if err != nil {
		return fmt.Errorf("vfio: %s iova %#x size %#x on %s: %w", op, iova, size, c.path, err)
	}
	c.maps = slices.Delete(c.maps, i, j)
	if got != want {
		return fmt.Errorf("vfio: %s iova %#x size %#x on %s: kernel unmapped %#x bytes, %#x were mapped", op, iova, size, c.path, got, want)
	}
	return nil
}

// Mappings lists the DMA mappings the container holds, by IOVA.
func (c *Container) Mappings() []DMAMapping {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]DMAMapping, len(c.maps))
	for i, e := range c.maps {
		out[i] = e.DMAMapping
	}
	return out
}

// insertPoint finds where a new mapping [iova, iova+size) goes in the
// sorted list, or reports the mapping it would overlap.
func insertPoint(maps []dmaEntry, iova, size uint64) (int, error) {
	last := iova + size - 1
	// First mapping that ends at or after iova.
	i := sort.Search(len(maps), func(k int) bool { return maps[k].last() >= iova })
	if i < len(maps) && maps[i].IOVA <= last {
		return 0, fmt.Errorf("iova %#x size %#x overlaps mapping iova %#x size %#x: %w", iova, size, maps[i].IOVA, maps[i].Size, ErrOverlap)
	}
	return i, nil
}

// unmapSpan returns the index span of the mappings inside [iova,
// iova+size); a mapping only partly inside is an error, as is none.
func unmapSpan(maps []dmaEntry, iova, size uint64) (int, int, error) {
	last := iova + size - 1
	i := sort.Search(len(maps), func(k int) bool { return maps[k].last() >= iova })
	j := i
	for j < len(maps) && maps[j].IOVA <= last {
		if maps[j].IOVA < iova || maps[j].last() > last {
			return 0, 0, fmt.Errorf("iova %#x size %#x would split mapping iova %#x size %#x: %w",
				iova, size, maps[j].IOVA, maps[j].Size, ErrOverlap)
		}
		j++
	}
	if i == j {
		return 0, 0, fmt.Errorf("iova %#x size %#x: %w", iova, size, ErrNotMapped)
	}
	return i, j, nil
}

// unmapAllLocked removes every tracked mapping from the IOMMU.
func (c *Container) unmapAllLocked() error {
	var errs []error
	if c.iommuSet {
		for _, e := range c.maps {
			if _, err := c.iommu.unmapDMA(e.IOVA, e.Size); err != nil {
				errs = append(errs, fmt.Errorf("vfio: VFIO_IOMMU_UNMAP_DMA iova %#x size %#x on %s: %w", e.IOVA, e.Size, c.path, err))
			}
		}
	}
	c.maps = nil
	return errors.Join(errs...)
}

// Close closes the container and everything opened through it: devices
// (which stops their DMA), then DMA mappings, then groups (unset from the
// container), then the container fd. It is idempotent; errors from the
// steps are joined. Close of a Container that OpenContainerAt did not make
// does nothing.
func (c *Container) Close() error {
	if !c.made {
		return nil
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	groups := slices.Clone(c.groups)
	c.mu.Unlock()

	var errs []error
	for _, g := range groups {
		errs = append(errs, g.closeDevices())
	}
	c.mu.Lock()
	errs = append(errs, c.unmapAllLocked())
	c.mu.Unlock()
	for _, g := range groups {
		errs = append(errs, g.Close())
	}
	c.mu.Lock()
	if c.fd >= 0 {
		if err := unix.Close(c.fd); err != nil {
			errs = append(errs, fmt.Errorf("vfio: close %s: %w", c.path, err))
		}
		c.fd = -1
	}
	c.mu.Unlock()
	return errors.Join(errs...)
}
