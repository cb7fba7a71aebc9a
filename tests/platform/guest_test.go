package platform

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/dma"
	"github.com/vfnic/vfnic/doorbell"
	"github.com/vfnic/vfnic/eventfd"
	"github.com/vfnic/vfnic/hugepage"
	"github.com/vfnic/vfnic/pci"
	"github.com/vfnic/vfnic/qemu"
	"github.com/vfnic/vfnic/tests/leakcheck"
	"github.com/vfnic/vfnic/vfio"
)

// The guest topology TestVM boots; the addresses are fixed by PCI slot.
const (
	addrVirtio   = "0000:00:04.0" // virtio-net-pci, packed, on a dgram netdev to the host
	addrE1000e   = "0000:00:05.0" // e1000e
	addrLinuxNIC = "0000:00:06.0" // virtio-net left to the guest's Linux driver, up with an address
	linuxNICIP   = "10.0.2.15/24"
	// Two conventional PCI e1000 NICs behind one PCIe-to-PCI bridge share an
	// IOMMU group; the second stays with the kernel's e1000 driver.
	bridgeSlot = 0x07
)

// Guest RAM is 1 GiB; DMA memory goes at or above 4 GiB so that a stray
// physical address can never alias it.
const iovaFloor = 4 << 30

func guestOnly(t *testing.T) {
	t.Helper()
	if !qemu.InGuest() {
		t.Skip("needs VFIO and emulated NICs: runs inside the QEMU guest booted by TestVM")
	}
}

func mustAddr(t *testing.T, s string) pci.Address {
	t.Helper()
	a, err := pci.ParseAddress(s)
	require.NoError(t, err)
	return a
}

// bindVFIO binds the device to vfio-pci (idempotently) and returns its
// sysfs record, taken after the bind.
func bindVFIO(t *testing.T, addr string) pci.Device {
	t.Helper()
	a := mustAddr(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, pci.Sysfs{}.CheckInUse(a, nil, false))
	require.NoError(t, pci.Sysfs{}.Bind(ctx, a, "vfio-pci"))
	d, err := pci.Lookup(a)
	require.NoError(t, err)
	require.Equal(t, "vfio-pci", d.Driver)
	require.GreaterOrEqual(t, d.IOMMUGroup, 0)
	return d
}

type opened struct {
	c *vfio.Container
	g *vfio.Group
	d *vfio.Device
}

func openVFIO(t *testing.T, addr string) opened {
	t.Helper()
	dev := bindVFIO(t, addr)
	c, err := vfio.OpenContainer()
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	g, err := c.OpenGroup(dev.IOMMUGroup)
	require.NoError(t, err)
	d, err := g.OpenDevice(addr)
	require.NoError(t, err)
	require.NoError(t, d.SetBusMaster(true), "DMA and MSI-X need bus mastering")
	return opened{c, g, d}
}

// resources is what Close must give back: open fds, and VFIO and hugepage
// mappings.
type resources = leakcheck.Resources

func snapshot(t *testing.T) resources {
	t.Helper()
	r, err := leakcheck.Snapshot()
	require.NoError(t, err)
	return r
}

func TestGuestDiscover(t *testing.T) {
	guestOnly(t)
	want := map[string][2]uint16{
		addrVirtio:   {0x1af4, 0x1041},
		addrE1000e:   {0x8086, 0x10d3},
		addrLinuxNIC: {0x1af4, 0x1041},
	}
	devs, err := pci.List(pci.ListOptions{})
	require.NoError(t, err)
	found := map[string]pci.Device{}
	for _, d := range devs {
		found[d.Address.String()] = d
		if d.IsNetwork() {
			t.Logf("%s %04x:%04x class %06x group %d driver %q if %v",
				d.Address, d.VendorID, d.DeviceID, d.Class, d.IOMMUGroup, d.Driver, d.NetInterfaces)
		}
	}
	for addr, id := range want {
		d, ok := found[addr]
		require.True(t, ok, "%s not discovered", addr)
		require.Equal(t, id, [2]uint16{d.VendorID, d.DeviceID}, addr)
		require.True(t, d.IsNetwork(), addr)
		require.GreaterOrEqual(t, d.IOMMUGroup, 0, "%s has an IOMMU group", addr)
		members, err := os.ReadDir("/sys/kernel/iommu_groups/" + strconv.Itoa(d.IOMMUGroup) + "/devices")
		require.NoError(t, err)
		require.Len(t, members, 1, "%s is alone in its IOMMU group", addr)
	}
}

func TestGuestBindVFIO(t *testing.T) {
	guestOnly(t)
	for _, addr := range []string{addrVirtio, addrE1000e} {
		d := bindVFIO(t, addr)
		_, err := os.Stat("/dev/vfio/" + strconv.Itoa(d.IOMMUGroup))
		require.NoError(t, err, "group node for %s", addr)
		bindVFIO(t, addr) // binding again is a no-op
	}
}

// virtioCommon maps the BAR that holds virtio's common configuration and
// returns it with the decoded capabilities.
func virtioCommon(t *testing.T, o opened) (doorbell.Window, map[uint8]pci.VirtioCap) {
	t.Helper()
	cfg, err := pci.ReadConfig(o.d.ConfigReader())
	require.NoError(t, err)
	caps, err := cfg.VirtioCaps()
	require.NoError(t, err)
	byType := pci.VirtioStructures(caps)
	common, ok := byType[pci.VirtioCommonCfg]
	require.True(t, ok, "virtio common cfg capability")
	m, err := o.d.MapRegion(int(common.Bar))
	require.NoError(t, err)
	for _, c := range byType {
		require.Equal(t, common.Bar, c.Bar, "this test expects all structures in one BAR")
	}
	return doorbell.NewWindow(m.Bytes()), byType
}

func TestGuestVirtioBAR(t *testing.T) {
	guestOnly(t)
	before := snapshot(t)
	o := openVFIO(t, addrVirtio)
	w, caps := virtioCommon(t, o)
	base := uintptr(caps[pci.VirtioCommonCfg].Offset)
	require.NoError(t, w.Write32(base+vcDeviceFeatureSelect, 1)) // bits 32..63
	hi, err := w.Read32(base + vcDeviceFeature)
	require.NoError(t, err)
	t.Logf("virtio device features[63:32] = %#x", hi)
	require.NotZero(t, hi&featVersion1Hi, "VIRTIO_F_VERSION_1 (bit 32)")
	require.NotZero(t, hi&featAccessPlatfHi, "VIRTIO_F_ACCESS_PLATFORM (bit 33): iommu_platform=on")
	require.NotZero(t, hi&featRingPackedHi, "VIRTIO_F_RING_PACKED (bit 34): packed=on")
	nq, err := w.Read16(base + vcNumQueues)
	require.NoError(t, err)
	require.GreaterOrEqual(t, nq, uint16(2), "at least one RX and one TX queue")
	require.NoError(t, o.c.Close())
	require.Equal(t, before, snapshot(t), "Close returns fds and mappings")
}

const (
	e1000Ctrl   = 0x0000
	e1000Status = 0x0008
	e1000ICR    = 0x00c0
	e1000ICS    = 0x00c8
	e1000IMS    = 0x00d0
	e1000IMC    = 0x00d8
	e1000IVAR   = 0x00e4

	e1000StatusLU = 1 << 1
	e1000IntLSC   = 1 << 2
	e1000IntOther = 1 << 24
	ivarValid     = 0x8
)

func TestGuestE1000eBAR(t *testing.T) {
	guestOnly(t)
	before := snapshot(t)
	o := openVFIO(t, addrE1000e)
	m, err := o.d.MapRegion(vfio.RegionBAR0)
	require.NoError(t, err)
	require.Greater(t, snapshot(t).Maps, before.Maps, "the leak check sees a BAR mapping")
	w := doorbell.NewWindow(m.Bytes())
	status, err := w.Read32(e1000Status)
	require.NoError(t, err)
	t.Logf("e1000e STATUS = %#08x", status)
	require.NotEqual(t, uint32(0xffffffff), status, "the BAR answers")
	require.NotZero(t, status&e1000StatusLU, "link up")
	// The same register read through the region file agrees with the mapping.
	var b [4]byte
	_, err = o.d.ReadRegion(vfio.RegionBAR0, b[:], e1000Status)
	require.NoError(t, err)
	require.Equal(t, status, binary.LittleEndian.Uint32(b[:]))
	require.NoError(t, o.c.Close())
	require.Equal(t, before, snapshot(t), "Close returns fds and mappings")
}

func TestGuestHugepageDMA(t *testing.T) {
	guestOnly(t)
	before := snapshot(t)
	o := openVFIO(t, addrE1000e)
	space, err := dma.NewVFIOSpace(o.c, iovaFloor)
	require.NoError(t, err)
	t.Logf("IOVA ranges %v", space.Ranges())
	r, err := space.Alloc(2<<20, hugepage.Options{})
	require.NoError(t, err)
	require.Equal(t, hugepage.Size2M, r.PageSize(), "backed by a 2 MiB hugepage")
	require.GreaterOrEqual(t, r.IOVA(), uint64(iovaFloor), "above guest RAM")
	require.Len(t, o.c.Mappings(), 1)
	t.Logf("2 MiB hugepage at IOVA %#x", r.IOVA())
	require.NoError(t, space.Close())
	require.Empty(t, o.c.Mappings())
	require.NoError(t, o.c.Close())
	require.Equal(t, before, snapshot(t), "Close returns fds and mappings")
}

// eventfds makes n eventfds and returns them with their raw descriptors.
func eventfds(t *testing.T, n int) ([]*eventfd.FD, []int) {
	t.Helper()
	efs := make([]*eventfd.FD, n)
	fds := make([]int, n)
	for i := range efs {
		e, err := eventfd.New()
		require.NoError(t, err)
		t.Cleanup(func() { _ = e.Close() })
		efs[i], fds[i] = e, e.Fd()
	}
	return efs, fds
}

func TestGuestE1000eMSIX(t *testing.T) {
	guestOnly(t)
	before := snapshot(t)
	o := openVFIO(t, addrE1000e)
	info, err := o.d.IRQInfo(vfio.IRQMSIX)
	require.NoError(t, err)
	require.GreaterOrEqual(t, info.Count, 3)
	t.Logf("MSI-X: %d vectors, flags %v", info.Count, info.Flags)
	efs, fds := eventfds(t, info.Count)
	require.NoError(t, o.d.EnableMSIX(fds))
	m, err := o.d.MapRegion(vfio.RegionBAR0)
	require.NoError(t, err)
	w := doorbell.NewWindow(m.Bytes())
	const vec = 2 // "other causes" (link changes) go to vector 2
	require.NoError(t, w.Write32(e1000IMC, 0xffffffff))
	_, _ = w.Read32(e1000ICR) // clear what is pending
	require.NoError(t, w.Write32(e1000IVAR, (ivarValid|vec)<<16))
	require.NoError(t, w.Write32(e1000IMS, e1000IntLSC|e1000IntOther))
	for _, e := range efs {
		_, _ = e.Take()
	}
	count := uint64(0)
	for i := 0; i < 3; i++ {
		require.NoError(t, w.Write32(e1000ICS, e1000IntLSC)) // software-raised link change
		n, err := efs[vec].Wait(context.Background(), time.Now().Add(5*time.Second))
		require.NoError(t, err, "MSI-X vector %d fired for ICS write %d", vec, i)
		count += n
		_, _ = w.Read32(e1000ICR) // acknowledge
	}
	t.Logf("e1000e: %d interrupts counted on vector %d for 3 ICS writes", count, vec)
	require.GreaterOrEqual(t, count, uint64(3))
	for i, e := range efs {
		if i != vec {
			n, _ := e.Take()
			require.Zero(t, n, "vector %d stayed quiet", i)
		}
	}
	require.NoError(t, o.d.DisableMSIX())
	require.NoError(t, o.c.Close())
	for _, e := range efs {
		require.NoError(t, e.Close())
	}
	require.Equal(t, before, snapshot(t), "Close returns fds and mappings")
}

func TestGuestMissingDevice(t *testing.T) {
	guestOnly(t)
	_, err := pci.Lookup(mustAddr(t, "0000:00:1f.6"))
	require.ErrorIs(t, err, pci.ErrNotFound)
	require.Contains(t, err.Error(), "0000:00:1f.6")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = pci.Sysfs{}.Bind(ctx, mustAddr(t, "0000:00:1f.6"), "vfio-pci")
	require.ErrorIs(t, err, pci.ErrNotFound)

	o := openVFIO(t, addrE1000e)
	_, err = o.g.OpenDevice("0000:00:1f.6")
	require.ErrorIs(t, err, vfio.ErrNoDevice)
	_, err = o.c.OpenGroup(9999)
	require.Error(t, err)
	t.Logf("missing group: %v", err)
}

func TestGuestInterfaceInUse(t *testing.T) {
	guestOnly(t)
	a := mustAddr(t, addrLinuxNIC)
	d, err := pci.Lookup(a)
	require.NoError(t, err)
	require.NotEmpty(t, d.NetInterfaces, "the Linux driver owns an interface")
	err = pci.Sysfs{}.CheckInUse(a, nil, false)
	require.ErrorIs(t, err, pci.ErrInUse)
	t.Logf("refused: %v", err)
	require.Contains(t, err.Error(), d.NetInterfaces[0], "the error names the interface")
	require.Contains(t, err.Error(), strings.Split(linuxNICIP, "/")[0], "and its address")
	require.NoError(t, pci.Sysfs{}.CheckInUse(a, nil, true), "force overrides")
	d2, err := pci.Lookup(a)
	require.NoError(t, err)
	require.Equal(t, d.Driver, d2.Driver, "a refused check leaves the device alone")
}

func TestGuestGroupNotViable(t *testing.T) {
	guestOnly(t)
	vf := mustAddr(t, "0000:01:01.0") // behind the bridge (its secondary bus is 1)
	other := mustAddr(t, "0000:01:02.0")
	dv, err := pci.Lookup(vf)
	require.NoError(t, err)
	do, err := pci.Lookup(other)
	require.NoError(t, err)
	require.Equal(t, dv.IOMMUGroup, do.IOMMUGroup, "devices behind a PCI bridge share a group")
	require.Equal(t, "e1000", do.Driver, "the other member stays with its kernel driver")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, pci.Sysfs{}.Bind(ctx, vf, "vfio-pci"))
	c, err := vfio.OpenContainer()
	require.NoError(t, err)
	defer c.Close()
	_, err = c.OpenGroup(dv.IOMMUGroup)
	require.ErrorIs(t, err, vfio.ErrGroupNotViable)
	require.Contains(t, err.Error(), strconv.Itoa(dv.IOMMUGroup))
	t.Logf("refused: %v", err)
}

func TestGuestMapOutsideRanges(t *testing.T) {
	guestOnly(t)
	o := openVFIO(t, addrE1000e)
	mem, err := hugepage.Alloc(2<<20, hugepage.Options{})
	require.NoError(t, err)
	defer mem.Close()
	ranges, err := o.c.IOVARanges()
	require.NoError(t, err)
	require.Greater(t, len(ranges), 1, "q35 reports a hole at the interrupt window")
	hole := ranges[0].End + 1 // first address of the MSI window
	for _, iova := range []uint64{hole &^ (2<<20 - 1), ranges[len(ranges)-1].End + 1} {
		err = o.c.MapDMA(mem.Bytes(), iova)
		require.ErrorIs(t, err, vfio.ErrOutOfRange, "IOVA %#x", iova)
		t.Logf("refused: %v", err)
	}
	require.Empty(t, o.c.Mappings())
	var errOut error = vfio.ErrOutOfRange
	require.True(t, errors.Is(err, errOut))
}
