package pci

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

type capKey struct {
	ID       uint16
	Offset   int
	Extended bool
	Version  uint8
	Len      int
}

func keys(caps []Capability) []capKey {
	var out []capKey
	for _, c := range caps {
		out = append(out, capKey{c.ID, c.Offset, c.Extended, c.Version, len(c.Body)})
	}
	return out
}

func TestVirtioNetConfig(t *testing.T) {
	raw := virtioNetConfig()
	c, err := ReadConfig(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	if c.VendorID != VirtioVendorID || c.DeviceID != 0x1041 || c.Class != 0x020000 || c.Revision != 1 || c.HeaderType != 0 {
		t.Errorf("header: %+v", c)
	}
	want := []capKey{
		{CapPM, 0xe0, false, 0, 8},
		{CapPCIe, 0xa4, false, 0, 0x3c},
		{CapMSIX, 0x98, false, 0, 12},
		{CapVendor, 0x84, false, 0, 20},
		{CapVendor, 0x70, false, 0, 20},
		{CapVendor, 0x60, false, 0, 16},
		{CapVendor, 0x50, false, 0, 16},
		{CapVendor, 0x40, false, 0, 16},
		{0x000f, 0x100, true, 1, maxExtWindow}, // ATS: unknown length, last in the list
	}
	if got := keys(c.Capabilities); !reflect.DeepEqual(got, want) {
		t.Fatalf("capabilities:\n got %+v\nwant %+v", got, want)
	}
	for _, cp := range c.Capabilities {
		if !bytes.Equal(cp.Body, raw[cp.Offset:cp.Offset+len(cp.Body)]) {
			t.Errorf("body of 0x%x at 0x%x does not match config space", cp.ID, cp.Offset)
		}
	}

	vc, err := c.VirtioCaps()
	if err != nil {
		t.Fatal(err)
	}
	wantV := []VirtioCap{
		{CapOffset: 0x84, CfgType: VirtioPCICfg},
		{CapOffset: 0x70, CfgType: VirtioNotifyCfg, Bar: 4, Offset: 0x3000, Length: 0x1000, NotifyOffMultiplier: 4},
		{CapOffset: 0x60, CfgType: VirtioDeviceCfg, Bar: 4, Offset: 0x2000, Length: 0x1000},
		{CapOffset: 0x50, CfgType: VirtioISRCfg, Bar: 4, Offset: 0x1000, Length: 0x1000},
		{CapOffset: 0x40, CfgType: VirtioCommonCfg, Bar: 4, Offset: 0, Length: 0x1000},
	}
	if !reflect.DeepEqual(vc, wantV) {
		t.Errorf("virtio caps:\n got %+v\nwant %+v", vc, wantV)
	}

	mc, ok := c.Capability(CapMSIX)
	if !ok {
		t.Fatal("no MSI-X")
	}
	m, err := mc.MSIX()
	if err != nil {
		t.Fatal(err)
	}
	if want := (MSIX{TableSize: 4, TableBAR: 1, TableOffset: 0, PBABAR: 1, PBAOffset: 0x800, Enabled: true}); m != want {
		t.Errorf("MSI-X = %+v, want %+v", m, want)
	}

	pc, _ := c.Capability(CapPCIe)
	p, err := pc.PCIe()
	if err != nil {
		t.Fatal(err)
	}
	if want := (PCIe{Version: 2, PortType: 0, MaxPayloadSupported: 128, MaxPayload: 128, MaxReadRequest: 512, FLR: true,
		MaxLinkSpeed: 1, MaxLinkWidth: 1, LinkSpeed: 1, LinkWidth: 1}); p != want {
		t.Errorf("PCIe = %+v, want %+v", p, want)
	}

	if _, ok := c.Capability(CapMSI); ok {
		t.Error("found an MSI capability that is not there")
	}
	if ats, ok := c.ExtendedCapability(0x000f); !ok || ats.Offset != 0x100 {
		t.Errorf("ATS: %+v %v", ats, ok)
	}

	res, err := ParseResource(strings.NewReader(virtioNetResource))
	if err != nil {
		t.Fatal(err)
	}
	bars, err := c.BARs(res)
	if err != nil {
		t.Fatal(err)
	}
	wantB := []BAR{
		{Index: 0},
		{Index: 1, Addr: 0xfea00000, Size: 0x1000},
		{Index: 2},
		{Index: 3},
		{Index: 4, Is64: true, Prefetchable: true, Addr: 0xfe000000, Size: 0x4000},
	}
	if !reflect.DeepEqual(bars, wantB) {
		t.Errorf("BARs:\n got %+v\nwant %+v", bars, wantB)
	}
}

func TestE1000eConfig(t *testing.T) {
	raw := e1000eConfig()
	c, err := ReadConfig(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	want := []capKey{
		{CapPM, 0xc8, false, 0, 8},
		{CapMSI, 0xd0, false, 0, 14},
		{CapPCIe, 0xe0, false, 0, 0x20}, // v1 is 0x24 bytes; config space ends at 0x100
		{CapMSIX, 0xa0, false, 0, 12},
		{ExtCapAER, 0x100, true, 1, 0x40}, // unknown length: up to DSN
		{ExtCapDSN, 0x140, true, 1, 12},
	}
	if got := keys(c.Capabilities); !reflect.DeepEqual(got, want) {
		t.Fatalf("capabilities:\n got %+v\nwant %+v", got, want)
	}

	mc, _ := c.Capability(CapMSI)
	m, err := mc.MSI()
	if err != nil {
		t.Fatal(err)
	}
	if want := (MSI{Is64: true, MaxVectors: 1, EnabledVectors: 1, Address: 0x1_fee00000, Data: 0x4021}); m != want {
		t.Errorf("MSI = %+v, want %+v", m, want)
	}
	xc, _ := c.Capability(CapMSIX)
	x, err := xc.MSIX()
	if err != nil {
		t.Fatal(err)
	}
	if want := (MSIX{TableSize: 5, TableBAR: 3, PBABAR: 3, PBAOffset: 0x2000}); x != want {
		t.Errorf("MSI-X = %+v, want %+v", x, want)
	}
	pc, _ := c.Capability(CapPCIe)
	p, err := pc.PCIe()
	if err != nil {
		t.Fatal(err)
	}
	if want := (PCIe{Version: 1, MaxPayloadSupported: 256, MaxPayload: 128, MaxReadRequest: 512, FLR: true,
		MaxLinkSpeed: 1, MaxLinkWidth: 1, LinkSpeed: 1, LinkWidth: 1}); p != want {
		t.Errorf("PCIe = %+v, want %+v", p, want)
	}
	dsn, ok := c.ExtendedCapability(ExtCapDSN)
	if !ok || le32(dsn.Body, 4) != 0xffaabbcc || le32(dsn.Body, 8) != 0x00112233 {
		t.Errorf("DSN: %+v", dsn)
	}
	if vc, err := c.VirtioCaps(); err != nil || len(vc) != 0 {
		t.Errorf("e1000e has no virtio caps: %v %v", vc, err)
	}

	res, err := ParseResource(strings.NewReader(e1000eResource))
	if err != nil {
		t.Fatal(err)
	}
	bars, err := c.BARs(res)
	if err != nil {
		t.Fatal(err)
	}
	wantB := []BAR{
		{Index: 0, Addr: 0xfebc0000, Size: 128 << 10},
		{Index: 1, Addr: 0xfeb00000, Size: 512 << 10},
		{Index: 2, IO: true, Addr: 0xc040, Size: 32},
		{Index: 3, Addr: 0xfebe0000, Size: 16 << 10},
		{Index: 4},
		{Index: 5},
	}
	if !reflect.DeepEqual(bars, wantB) {
		t.Errorf("BARs:\n got %+v\nwant %+v", bars, wantB)
	}
}

func TestCapabilityWalkErrors(t *testing.T) {
	cases := []struct {
		name  string
		build func() cfgBuf
		want  string
	}{
		{"cycle", func() cfgBuf {
			b := header(256, 1, 1, 0, 0, 0x40)
			b.u8(0x40, CapPM)
			b.u8(0x41, 0x50)
			b.u8(0x50, CapMSI)
			b.u8(0x51, 0x40)
			return b
		}, "loops"},
		{"self loop", func() cfgBuf {
			b := header(256, 1, 1, 0, 0, 0x40)
			b.u8(0x40, CapPM)
			b.u8(0x41, 0x40)
			return b
		}, "loops"},
		{"pointer into header", func() cfgBuf {
			b := header(256, 1, 1, 0, 0, 0x40)
			b.u8(0x40, CapPM)
			b.u8(0x41, 0x20)
			return b
		}, "inside the header"},
		{"first pointer into header", func() cfgBuf { return header(256, 1, 1, 0, 0, 0x10) }, "inside the header"},
		{"extended cycle", func() cfgBuf {
			b := header(4096, 1, 1, 0, 0, 0)
			b.extCap(0x100, ExtCapAER, 1, 0x140)
			b.extCap(0x140, ExtCapDSN, 1, 0x100)
			return b
		}, "loops"},
		{"extended pointer below 0x100", func() cfgBuf {
			b := header(4096, 1, 1, 0, 0, 0)
			b.extCap(0x100, ExtCapAER, 1, 0x080)
			return b
		}, "below 0x100"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadConfig(bytes.NewReader(tc.build()))
			if !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want ErrBadConfig mentioning %q", err, tc.want)
			}
		})
	}
}

func TestCapabilityWalkEdges(t *testing.T) {
	// Status bit clear: the pointer is ignored.
	b := header(256, 1, 1, 0, 0, 0x40)
	b.u16(0x06, 0)
	b.u8(0x40, CapPM)
	if c, err := ParseConfig(b); err != nil || len(c.Capabilities) != 0 {
		t.Errorf("status bit clear: %v %v", c.Capabilities, err)
	}

	// Reserved low pointer bits are masked, as the kernel does; ID 0xff ends the list.
	b = header(256, 1, 1, 0, 0, 0x43)
	b.u8(0x40, CapPM)
	b.u8(0x41, 0x52)
	b.u8(0x50, 0xff)
	b.u8(0x51, 0x40) // would loop if followed
	c, err := ParseConfig(b)
	if err != nil || !reflect.DeepEqual(keys(c.Capabilities), []capKey{{CapPM, 0x40, false, 0, 8}}) {
		t.Errorf("masked pointer / 0xff end: %+v %v", keys(c.Capabilities), err)
	}

	// CardBus header: the pointer is at 0x14.
	b = header(256, 1, 1, 0x060700, 0, 0)
	b.u16(0x06, statusCapList)
	b.u8(0x0e, 0x82) // type 2, multi-function
	b.u8(0x14, 0x80)
	b.u8(0x80, CapPM)
	c, err = ParseConfig(b)
	if err != nil || c.HeaderType != 2 || !c.MultiFunction || len(c.Capabilities) != 1 || c.Capabilities[0].Offset != 0x80 {
		t.Errorf("cardbus: %+v %v", c, err)
	}

	// Extended space all ones (no extended config) or zero: no extended caps.
	for _, h := range []uint32{0, 0xffffffff} {
		b = header(4096, 1, 1, 0, 0, 0)
		b.u32(0x100, h)
		if c, err := ParseConfig(b); err != nil || len(c.Capabilities) != 0 {
			t.Errorf("extended header 0x%x: %v %v", h, c.Capabilities, err)
		}
	}

	// An extended placeholder (ID 0) links on but is not reported.
	b = header(4096, 1, 1, 0, 0, 0)
	b.extCap(0x100, 0, 0, 0x200)
	b.extCap(0x200, ExtCapSRIOV, 1, 0)
	c, err = ParseConfig(b)
	if err != nil || !reflect.DeepEqual(keys(c.Capabilities), []capKey{{ExtCapSRIOV, 0x200, true, 1, maxExtWindow}}) {
		t.Errorf("placeholder: %+v %v", keys(c.Capabilities), err)
	}

	// A capability at the very end is clipped to config space.
	b = header(256, 1, 1, 0, 0, 0xfc)
	b.u8(0xfc, CapMSIX)
	c, err = ParseConfig(b)
	if err != nil || len(c.Capabilities[0].Body) != 4 {
		t.Fatalf("clipped cap: %+v %v", keys(c.Capabilities), err)
	}
	if _, err := c.Capabilities[0].MSIX(); !errors.Is(err, ErrBadConfig) {
		t.Errorf("decoding a clipped MSI-X: %v", err)
	}
}

// shortReader serves only the first n bytes, as the sysfs config file does
// for unprivileged readers (64 bytes) and for conventional devices (256).
type shortReader struct {
	b []byte
	n int
}

func (r shortReader) ReadAt(p []byte, off int64) (int, error) {
	if off >= int64(r.n) {
		return 0, io.EOF
	}
	n := copy(p, r.b[off:r.n])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

type failReader struct{ err error }

func (r failReader) ReadAt([]byte, int64) (int, error) { return 0, r.err }

func TestShortReaders(t *testing.T) {
	full := e1000eConfig()

	// 256 bytes: standard capabilities only.
	c, err := ReadConfig(shortReader{full, 256})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Raw) != 256 || len(c.Capabilities) != 4 {
		t.Errorf("256-byte reader: %d bytes, %+v", len(c.Raw), keys(c.Capabilities))
	}
	for _, cp := range c.Capabilities {
		if cp.Extended {
			t.Errorf("extended capability from a 256-byte reader: %+v", cp)
		}
	}

	// 1000 bytes: more than 256 but not the full space: still no extended caps.
	c, err = ReadConfig(shortReader{full, 1000})
	if err != nil || len(c.Capabilities) != 4 {
		t.Errorf("1000-byte reader: %v %v", keys(c.Capabilities), err)
	}

	// 64 bytes: the header is there, the list is not.
	_, err = ReadConfig(shortReader{full, 64})
	if !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), "beyond the 64 bytes") {
		t.Errorf("64-byte reader: %v", err)
	}
	// 64 bytes without capabilities is fine.
	plain := header(64, 1, 2, 0, 0, 0)
	if c, err := ReadConfig(bytes.NewReader(plain)); err != nil || c.DeviceID != 2 {
		t.Errorf("64-byte config without caps: %v", err)
	}

	// Shorter than the header.
	for _, n := range []int{0, 1, 63} {
		if _, err := ReadConfig(shortReader{full, n}); !errors.Is(err, ErrBadConfig) {
			t.Errorf("%d-byte reader: %v", n, err)
		}
		if _, err := ParseConfig(full[:n]); !errors.Is(err, ErrBadConfig) {
			t.Errorf("ParseConfig of %d bytes: %v", n, err)
		}
	}

	// A failing reader: its error comes back.
	eio := errors.New("input/output error")
	if _, err := ReadConfig(failReader{eio}); !errors.Is(err, eio) {
		t.Errorf("failing reader: %v", err)
	}
}

func TestDecoderErrors(t *testing.T) {
	c, err := ParseConfig(virtioNetConfig())
	if err != nil {
		t.Fatal(err)
	}
	pm, _ := c.Capability(CapPM)
	if _, err := pm.MSIX(); !errors.Is(err, ErrBadConfig) {
		t.Errorf("PM as MSI-X: %v", err)
	}
	if _, err := pm.MSI(); !errors.Is(err, ErrBadConfig) {
		t.Errorf("PM as MSI: %v", err)
	}
	if _, err := pm.PCIe(); !errors.Is(err, ErrBadConfig) {
		t.Errorf("PM as PCIe: %v", err)
	}
	if _, err := pm.Virtio(); !errors.Is(err, ErrBadConfig) {
		t.Errorf("PM as virtio: %v", err)
	}

	// Reserved BIR.
	b := virtioNetConfig()
	b.u32(0x9c, 0x6)
	c, _ = ParseConfig(b)
	mc, _ := c.Capability(CapMSIX)
	if _, err := mc.MSIX(); !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), "reserved BAR") {
		t.Errorf("MSI-X with BIR 6: %v", err)
	}

	// Virtio caps too short for their type.
	for _, tc := range []struct {
		cfgType, capLen uint8
	}{{VirtioCommonCfg, 8}, {VirtioNotifyCfg, 16}, {VirtioSharedMemoryCfg, 20}} {
		b := virtioNetConfig()
		b.u8(0x40+3, tc.cfgType)
		b.u8(0x40+2, tc.capLen)
		c, _ := ParseConfig(b)
		if _, err := c.VirtioCaps(); !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), "0x40") {
			t.Errorf("virtio cap type %d len %d: %v", tc.cfgType, tc.capLen, err)
		}
	}
}

func TestVirtioSharedMemoryCap(t *testing.T) {
	b := header(256, VirtioVendorID, 0x105a, 0x018000, 1, 0x40)
	b.u8(0x40, CapVendor)
	b.u8(0x42, 24)
	b.u8(0x43, VirtioSharedMemoryCfg)
	b.u8(0x44, 2)
	b.u8(0x45, 1)
	b.u32(0x48, 0x1000)
	b.u32(0x4c, 0x2000)
	b.u32(0x50, 0x1)
	b.u32(0x54, 0x2)
	c, err := ParseConfig(b)
	if err != nil {
		t.Fatal(err)
	}
	vc, err := c.VirtioCaps()
	if err != nil {
		t.Fatal(err)
	}
	want := VirtioCap{CapOffset: 0x40, CfgType: VirtioSharedMemoryCfg, Bar: 2, ID: 1, Offset: 0x1_00001000, Length: 0x2_00002000}
	if len(vc) != 1 || vc[0] != want {
		t.Errorf("shared memory cap = %+v, want %+v", vc, want)
	}
}

// TestRealConfigs walks the config space of every PCI function of this
// machine through its sysfs config file.
func TestRealConfigs(t *testing.T) {
	files, _ := filepath.Glob("/sys/bus/pci/devices/*/config")
	if len(files) == 0 {
		t.Skip("no PCI config files")
	}
	if os.Geteuid() != 0 {
		t.Skip("sysfs shows only 64 bytes of config space to non-root users")
	}
	for _, p := range files {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		c, err := ReadConfig(f)
		f.Close()
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		name := filepath.Base(filepath.Dir(p))
		for _, cp := range c.Capabilities {
			if cp.Offset+len(cp.Body) > len(c.Raw) || len(cp.Body) < 2 {
				t.Errorf("%s: capability %+v out of bounds", name, cp)
			}
			switch {
			case cp.Extended:
			case cp.ID == CapMSIX:
				if m, err := cp.MSIX(); err != nil || m.TableSize < 1 {
					t.Errorf("%s: MSI-X %+v %v", name, m, err)
				}
			case cp.ID == CapMSI:
				if _, err := cp.MSI(); err != nil {
					t.Errorf("%s: MSI %v", name, err)
				}
			case cp.ID == CapPCIe:
				if _, err := cp.PCIe(); err != nil {
					t.Errorf("%s: PCIe %v", name, err)
				}
			}
		}
		t.Logf("%s: %04x:%04x %d bytes, capabilities %+v", name, c.VendorID, c.DeviceID, len(c.Raw), keys(c.Capabilities))
		// Modern virtio devices must describe at least their common config.
		if c.VendorID == VirtioVendorID && c.DeviceID >= 0x1040 {
			vc, err := c.VirtioCaps()
			if err != nil {
				t.Errorf("%s: %v", name, err)
			}
			common := false
			for _, v := range vc {
				common = common || (v.CfgType == VirtioCommonCfg && v.Bar <= 5 && v.Length > 0)
			}
			if !common {
				t.Errorf("%s: modern virtio device without common config: %+v", name, vc)
			}
		}
		// Config space and resource file agree on each implemented BAR's kind.
		a, err := ParseAddress(name)
		if err != nil {
			t.Fatal(err)
		}
		bars, err := Sysfs{}.BARs(a)
		if err != nil {
			t.Errorf("%s: BARs: %v", name, err)
			continue
		}
		res, _ := Sysfs{}.Resources(a)
		for _, bar := range bars {
			if bar.Size == 0 {
				continue
			}
			r := res[bar.Index]
			if bar.IO != r.IsIO() || bar.Is64 != r.Is64() || bar.Prefetchable != r.Prefetchable() {
				t.Errorf("%s: BAR%d %+v disagrees with resource %+v", name, bar.Index, bar, r)
			}
			t.Logf("%s: BAR%d %+v", name, bar.Index, bar)
		}
	}
}

// FuzzCapabilities feeds arbitrary bytes to the config decoders: they must
// return, without panicking, and keep every capability inside config space.
// Run it with a short minimisation time, or the 4 KiB inputs keep the
// workers minimising instead of fuzzing:
//
//	go test ./pci -run '^$' -fuzz FuzzCapabilities -fuzztime=20s -fuzzminimizetime=1s
func FuzzCapabilities(f *testing.F) {
	f.Add([]byte(virtioNetConfig()))
	f.Add([]byte(e1000eConfig()))
	f.Add([]byte(header(64, 1, 1, 0, 0, 0x40)))
	cyc := header(4096, 1, 1, 0, 0, 0x40)
	cyc.u8(0x40, CapVendor)
	cyc.u8(0x41, 0x40)
	cyc.extCap(0x100, 1, 1, 0x100)
	f.Add([]byte(cyc))
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, c := range []func() (*Config, error){
			func() (*Config, error) { return ParseConfig(data) },
			func() (*Config, error) { return ReadConfig(bytes.NewReader(data)) },
		} {
			cfg, err := c()
			if err != nil {
				if !errors.Is(err, ErrBadConfig) {
					t.Fatalf("error not wrapping ErrBadConfig: %v", err)
				}
				continue
			}
			// Each offset is visited once: 48 standard, 960 extended at most.
			if len(cfg.Capabilities) > 48+960 {
				t.Fatalf("%d capabilities", len(cfg.Capabilities))
			}
			for _, cp := range cfg.Capabilities {
				if cp.Offset < HeaderSize || cp.Offset+len(cp.Body) > len(cfg.Raw) {
					t.Fatalf("capability out of bounds: offset 0x%x len %d of %d", cp.Offset, len(cp.Body), len(cfg.Raw))
				}
				_, _ = cp.MSIX()
				_, _ = cp.MSI()
				_, _ = cp.PCIe()
				_, _ = cp.Virtio()
			}
			_, _ = cfg.VirtioCaps()
			_, _ = cfg.BARs(nil)
		}
	})
}

func TestVirtioStructures(t *testing.T) {
	caps := []VirtioCap{
		{CfgType: VirtioPCICfg, Bar: 0, Length: 0},                    // not mapped by drivers
		{CfgType: VirtioCommonCfg, Bar: 6, Offset: 0x0, Length: 0x38}, // reserved BAR
		{CfgType: VirtioCommonCfg, Bar: 4, Offset: 0x0, Length: 0},    // empty
		{CfgType: VirtioCommonCfg, Bar: 4, Offset: 0x100, Length: 0x38},
		{CfgType: VirtioCommonCfg, Bar: 2, Offset: 0x0, Length: 0x38}, // not the first
		{CfgType: VirtioNotifyCfg, Bar: 4, Offset: 0x3000, Length: 0x1000, NotifyOffMultiplier: 4},
		{CfgType: VirtioISRCfg, Bar: 4, Offset: 0x1000, Length: 0x1000},
		{CfgType: VirtioVendorCfg, Bar: 4, Offset: 0x5000, Length: 0x10},
	}
	got := VirtioStructures(caps)
	want := map[uint8]VirtioCap{VirtioCommonCfg: caps[3], VirtioNotifyCfg: caps[5], VirtioISRCfg: caps[6]}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("VirtioStructures = %+v, want the first usable common, notify and ISR: %+v", got, want)
	}
}
