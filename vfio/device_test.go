package vfio

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// fileDevice is a Device whose fd is a regular file laid out like a
// vfio-pci device fd: pread, pwrite and mmap at region offsets are the real
// syscalls, only the region infos are given instead of asked for.
func fileDevice(t *testing.T, regions map[int]RegionInfo, size int64) (*Device, *os.File) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(t.TempDir(), "device"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Dup(int(f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	d := &Device{
		addr:    "0000:00:04.0",
		info:    DeviceInfo{Flags: DeviceFlagPCI, NumRegions: 9, NumIRQs: 5},
		made:    true,
		fd:      fd,
		regions: regions,
		irqs:    map[int]int{},
	}
	t.Cleanup(func() { d.Close() })
	return d, f
}

const (
	testBAR0Off = 0x10000
	testBAR2Off = 0x20000
	testCfgOff  = 0x40000
)

func testRegions() map[int]RegionInfo {
	rw := RegionFlagRead | RegionFlagWrite
	return map[int]RegionInfo{
		0: {Index: 0, Flags: rw | RegionFlagMmap, Size: 0x4000, Offset: testBAR0Off},
		1: {Index: 1},
		2: {Index: 2, Flags: rw | RegionFlagMmap | RegionFlagCaps, Size: 0x4000, Offset: testBAR2Off,
			Sparse: true, SparseAreas: []SparseArea{{0, 0x1000}, {0x2000, 0x2000}}},
		3:            {Index: 3, Flags: rw | RegionFlagMmap | RegionFlagCaps, Size: 0x1000, Offset: 0x30000, Sparse: true},
		4:            {Index: 4, Flags: rw, Size: 0x20, Offset: 0x38000}, // an I/O-port BAR: no mmap
		RegionConfig: {Index: RegionConfig, Flags: rw, Size: 256, Offset: testCfgOff},
	}
}

func TestConfigSpace(t *testing.T) {
	d, f := fileDevice(t, testRegions(), 0x50000)
	cfg := make([]byte, 256)
	for i := range cfg {
		cfg[i] = byte(i)
	}
	copy(cfg[0:], []byte{0xf4, 0x1a, 0x41, 0x10}) // vendor 1af4, device 1041
	if _, err := f.WriteAt(cfg, testCfgOff); err != nil {
		t.Fatal(err)
	}
	var r io.ReaderAt = d.ConfigReader()
	hdr := make([]byte, 4)
	if n, err := r.ReadAt(hdr, 0); n != 4 || err != nil || !bytes.Equal(hdr, cfg[:4]) {
		t.Errorf("ReadAt %d %v %x", n, err, hdr)
	}
	if v, err := d.ReadConfig16(0); v != 0x1af4 || err != nil {
		t.Errorf("vendor %#x %v", v, err)
	}
	if v, err := d.ReadConfig32(0); v != 0x10411af4 || err != nil {
		t.Errorf("id %#x %v", v, err)
	}
	if v, err := d.ReadConfig8(0x34); v != 0x34 || err != nil {
		t.Errorf("cap ptr %#x %v", v, err)
	}
	// Reads stop at the end of config space with io.EOF.
	tail := make([]byte, 8)
	if n, err := r.ReadAt(tail, 252); n != 4 || err != io.EOF || !bytes.Equal(tail[:4], cfg[252:]) {
		t.Errorf("tail read %d %v", n, err)
	}
	if n, err := r.ReadAt(tail, 256); n != 0 || err != io.EOF {
		t.Errorf("read past end %d %v", n, err)
	}
	if _, err := r.ReadAt(tail, -1); !errors.Is(err, ErrInvalid) {
		t.Errorf("negative offset %v", err)
	}
	if _, err := d.ReadConfig32(254); !errors.Is(err, ErrOutOfRange) {
		t.Errorf("32-bit read across the end: %v", err)
	}
	// Writes land at the config region's offset in the device fd.
	if err := d.WriteConfig16(4, 0x0406); err != nil {
		t.Fatal(err)
	}
	if err := d.WriteConfig32(0x10, 0xfebf0000); err != nil {
		t.Fatal(err)
	}
	if err := d.WriteConfig8(0x3c, 0x0b); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 256)
	f.ReadAt(got, testCfgOff)
	if got[4] != 0x06 || got[5] != 0x04 || got[0x10] != 0 || got[0x13] != 0xfe || got[0x3c] != 0x0b {
		t.Errorf("config after writes % x", got[:0x40])
	}
	if err := d.WriteConfig32(0xfe, 1); !errors.Is(err, ErrOutOfRange) {
		t.Errorf("write across the end: %v", err)
	}
	if sz, err := d.ConfigReader().Size(); sz != 256 || err != nil {
		t.Errorf("size %d %v", sz, err)
	}
}

func TestMapRegionWhole(t *testing.T) {
	d, f := fileDevice(t, testRegions(), 0x50000)
	pattern := bytes.Repeat([]byte{0xa5, 0x5a}, 0x2000)
	f.WriteAt(pattern, testBAR0Off)
	m, err := d.MapRegion(0)
	if err != nil {
		t.Fatal(err)
	}
	b := m.Bytes()
	if len(b) != 0x4000 || !bytes.Equal(b, pattern) {
		t.Fatalf("mapping len %d does not show the region", len(b))
	}
	// MAP_SHARED: stores reach the fd.
	b[8] = 0x42
	one := make([]byte, 1)
	f.ReadAt(one, testBAR0Off+8)
	if one[0] != 0x42 {
		t.Errorf("store not visible through the fd: %#x", one[0])
	}
	if s, err := m.Slice(0x3ffc, 4); err != nil || len(s) != 4 || cap(s) != 4 {
		t.Errorf("slice at the end: %d %v", len(s), err)
	}
	if _, err := m.Slice(0x3ffc, 8); !errors.Is(err, ErrOutOfRange) {
		t.Errorf("slice past the end: %v", err)
	}
	if len(m.Areas()) != 1 || m.Areas()[0].Offset != 0 {
		t.Errorf("areas %+v", m.Areas())
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}
	if m.Bytes() != nil || m.Areas() != nil {
		t.Error("closed mapping still hands out memory")
	}
	if _, err := m.Slice(0, 4); !errors.Is(err, ErrClosed) {
		t.Errorf("slice after close: %v", err)
	}
	if len(d.maps) != 0 {
		t.Error("device still tracks a closed mapping")
	}
}

func TestMapRegionSparse(t *testing.T) {
	d, f := fileDevice(t, testRegions(), 0x50000)
	f.WriteAt([]byte{1, 2, 3, 4}, testBAR2Off+0x2ffc)
	m, err := d.MapRegion(2)
	if err != nil {
		t.Fatal(err)
	}
	if m.Bytes() != nil {
		t.Error("sparse region handed out as one slice")
	}
	areas := m.Areas()
	if len(areas) != 2 || areas[0].Offset != 0 || len(areas[0].Bytes) != 0x1000 ||
		areas[1].Offset != 0x2000 || len(areas[1].Bytes) != 0x2000 {
		t.Fatalf("areas %+v", areas)
	}
	s, err := m.Slice(0x2ffc, 4)
	if err != nil || !bytes.Equal(s, []byte{1, 2, 3, 4}) {
		t.Errorf("slice in second area %v %v", s, err)
	}
	if _, err := m.Slice(0x1800, 4); !errors.Is(err, ErrOutOfRange) {
		t.Errorf("slice in the hole: %v", err)
	}
	if _, err := m.Slice(0xffc, 8); !errors.Is(err, ErrOutOfRange) {
		t.Errorf("slice across the hole: %v", err)
	}
	// Device.Close releases mappings it still tracks.
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if m.Areas() != nil {
		t.Error("Device.Close left the region mapped")
	}
	if err := d.Close(); err != nil {
		t.Errorf("second device close: %v", err)
	}
	if _, err := d.MapRegion(0); !errors.Is(err, ErrClosed) {
		t.Errorf("map after close: %v", err)
	}
	if _, err := d.ReadConfig8(0); !errors.Is(err, ErrClosed) {
		t.Errorf("config after close: %v", err)
	}
}

func TestMapRegionRefused(t *testing.T) {
	d, _ := fileDevice(t, testRegions(), 0x50000)
	for _, idx := range []int{1, 3, 4, RegionConfig} {
		if _, err := d.MapRegion(idx); !errors.Is(err, ErrNotMappable) {
			t.Errorf("region %d: %v", idx, err)
		}
	}
	if _, err := d.MapRegion(9); !errors.Is(err, ErrOutOfRange) {
		t.Errorf("region 9: %v", err)
	}
	if _, err := d.MapRegion(-1); !errors.Is(err, ErrOutOfRange) {
		t.Errorf("region -1: %v", err)
	}
	// An I/O-port BAR is still reachable through pread/pwrite.
	if _, err := d.WriteRegion(4, []byte{1, 2}, 0x1e); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2)
	if n, err := d.ReadRegion(4, buf, 0x1e); n != 2 || err != nil || buf[1] != 2 {
		t.Errorf("io bar read %d %v %v", n, err, buf)
	}
	if _, err := d.WriteRegion(4, []byte{1, 2, 3}, 0x1e); !errors.Is(err, ErrOutOfRange) {
		t.Errorf("write past region: %v", err)
	}
}

func TestResetWithoutFlag(t *testing.T) {
	d, _ := fileDevice(t, testRegions(), 0x1000)
	err := d.Reset()
	if !errors.Is(err, ErrNotSupported) || !bytes.Contains([]byte(err.Error()), []byte("0000:00:04.0")) {
		t.Errorf("reset: %v", err)
	}
}

func TestIRQSetLayout(t *testing.T) {
	buf := irqSetBuf(irqSetDataEventfd|irqSetActionTrigger, IRQMSIX, 0, 3, []int{7, -1, 9})
	want := cat(le32(32), le32(irqSetDataEventfd|irqSetActionTrigger), le32(IRQMSIX), le32(0), le32(3),
		le32(7), le32(0xffffffff), le32(9))
	if !bytes.Equal(buf, want) {
		t.Errorf("eventfd set\n got % x\nwant % x", buf, want)
	}
	buf = irqSetBuf(irqSetDataNone|irqSetActionTrigger, IRQMSIX, 0, 0, nil)
	if !bytes.Equal(buf, cat(le32(20), le32(irqSetDataNone|irqSetActionTrigger), le32(2), le32(0), le32(0))) {
		t.Errorf("disable % x", buf)
	}
	buf = irqSetBuf(irqSetDataNone|irqSetActionTrigger, IRQMSIX, 5, 1, nil)
	if !bytes.Equal(buf, cat(le32(20), le32(irqSetDataNone|irqSetActionTrigger), le32(2), le32(5), le32(1))) {
		t.Errorf("trigger % x", buf)
	}
}

func TestCheckIRQFDs(t *testing.T) {
	msix := IRQInfo{Index: IRQMSIX, Flags: IRQFlagEventfd | IRQFlagNoResize, Count: 3}
	if err := checkIRQFDs(msix, []int{4, 5, 6}); err != nil {
		t.Error(err)
	}
	if err := checkIRQFDs(msix, []int{4, -1}); err != nil {
		t.Error(err)
	}
	cases := []struct {
		info IRQInfo
		fds  []int
		want error
	}{
		{msix, []int{1, 2, 3, 4}, ErrOutOfRange},
		{msix, nil, ErrInvalid},
		{msix, []int{-2}, ErrInvalid},
		{IRQInfo{Index: IRQMSIX, Flags: IRQFlagEventfd}, []int{3}, ErrNotSupported},
		{IRQInfo{Index: IRQMSI, Count: 1}, []int{3}, ErrNotSupported},
	}
	for _, c := range cases {
		if err := checkIRQFDs(c.info, c.fds); !errors.Is(err, c.want) {
			t.Errorf("%+v %v: %v, want %v", c.info, c.fds, err, c.want)
		}
	}
}

func TestIRQStateChecks(t *testing.T) {
	d, _ := fileDevice(t, testRegions(), 0x1000)
	// Not enabled: trigger/unmask refused before any ioctl, disable is a no-op.
	if err := d.TriggerIRQ(IRQMSIX, 0); !errors.Is(err, ErrInvalid) {
		t.Errorf("trigger before enable: %v", err)
	}
	if err := d.DisableMSIX(); err != nil {
		t.Errorf("disable when not enabled: %v", err)
	}
	d.irqs[IRQMSIX] = 2
	if err := d.TriggerIRQ(IRQMSIX, 2); !errors.Is(err, ErrOutOfRange) {
		t.Errorf("trigger beyond the wired vectors: %v", err)
	}
	if err := d.EnableMSI([]int{3}); !errors.Is(err, ErrBusy) {
		t.Errorf("MSI while MSI-X enabled: %v", err)
	}
	if err := d.EnableMSIX([]int{3, 4, 5}); !errors.Is(err, ErrInvalid) {
		t.Errorf("growing enabled MSI-X from 2 to 3 vectors: %v", err)
	}
	if _, err := d.IRQInfo(7); !errors.Is(err, ErrOutOfRange) {
		t.Errorf("irq index 7: %v", err)
	}
}
