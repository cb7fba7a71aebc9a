package pci

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestParseResource(t *testing.T) {
	res, err := ParseResource(strings.NewReader(virtioNetResource + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 7 {
		t.Fatalf("%d lines, want 7", len(res))
	}
	r := res[4]
	if r.Size() != 0x4000 || !r.IsMem() || r.IsIO() || !r.Is64() || !r.Prefetchable() {
		t.Errorf("BAR4 resource %+v: size %#x mem %v io %v 64 %v pf %v", r, r.Size(), r.IsMem(), r.IsIO(), r.Is64(), r.Prefetchable())
	}
	if res[0].Size() != 0 || res[1].Size() != 0x1000 || res[1].Is64() {
		t.Errorf("resources %+v", res)
	}
	if (Resource{Start: 10, End: 5}).Size() != 0 {
		t.Error("inverted range should have size 0")
	}
	io, _ := ParseResource(strings.NewReader(e1000eResource))
	if !io[2].IsIO() || io[2].Size() != 32 {
		t.Errorf("I/O resource %+v", io[2])
	}

	for _, bad := range []string{"0x0 0x0\n", "0x0 0x0 0x0 0x0\n", "0x0 zz 0x0\n"} {
		if _, err := ParseResource(strings.NewReader(bad)); err == nil || !strings.Contains(err.Error(), "line 1") {
			t.Errorf("ParseResource(%q): %v", bad, err)
		}
	}
}

func TestBARErrors(t *testing.T) {
	// A 64-bit BAR in the last slot has no upper half.
	b := header(256, 1, 1, 0, 0, 0)
	b.u32(0x24, 0x4)
	c, _ := ParseConfig(b)
	if _, err := c.BARs(nil); !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), "BAR5") {
		t.Errorf("64-bit BAR5: %v", err)
	}
	// Reserved memory type.
	b = header(256, 1, 1, 0, 0, 0)
	b.u32(0x10, 0x6)
	c, _ = ParseConfig(b)
	if _, err := c.BARs(nil); !errors.Is(err, ErrBadConfig) {
		t.Errorf("reserved type: %v", err)
	}
	// Unknown header type.
	b = header(256, 1, 1, 0, 0, 0)
	b.u8(0x0e, 0x05)
	c, _ = ParseConfig(b)
	if _, err := c.BARs(nil); !errors.Is(err, ErrBadConfig) {
		t.Errorf("header type 5: %v", err)
	}
	// A bridge has two BARs; sizes are optional.
	b = header(256, 1, 1, 0x060400, 0, 0)
	b.u8(0x0e, 0x01)
	b.u32(0x10, 0xfe000004)
	b.u32(0x14, 0x1)
	c, _ = ParseConfig(b)
	bars, err := c.BARs(nil)
	if err != nil || !reflect.DeepEqual(bars, []BAR{{Index: 0, Is64: true, Addr: 0x1_fe000000}}) {
		t.Errorf("bridge BARs %+v %v", bars, err)
	}
}

func TestSysfsConfigAndBARs(t *testing.T) {
	f := newFakeSys(t)
	f.addDevice(fakeDev{addr: "0000:00:03.0", vendor: 0x1af4, device: 0x1041, class: 0x020000, group: 3,
		config: virtioNetConfig(), resource: virtioNetResource})
	f.addDevice(fakeDev{addr: "0000:00:04.0", vendor: 0x8086, device: 0x10d3, class: 0x020000, group: 4,
		config: e1000eConfig()[:256]}) // a reader of 256 bytes, no resource file
	s := f.sys()

	c, err := s.Config(Address{Device: 3})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Raw) != 4096 || len(c.Capabilities) != 9 {
		t.Errorf("virtio config: %d bytes, %d caps", len(c.Raw), len(c.Capabilities))
	}
	bars, err := s.BARs(Address{Device: 3})
	if err != nil {
		t.Fatal(err)
	}
	if len(bars) != 5 || bars[4].Size != 0x4000 || bars[1].Size != 0x1000 {
		t.Errorf("virtio BARs %+v", bars)
	}

	c, err = s.Config(Address{Device: 4})
	if err != nil || len(c.Raw) != 256 || len(c.Capabilities) != 4 {
		t.Errorf("e1000e config: %v", err)
	}
	if _, err := s.BARs(Address{Device: 4}); err == nil || !strings.Contains(err.Error(), "resource") {
		t.Errorf("BARs without a resource file: %v", err)
	}

	for _, fn := range []func() error{
		func() error { _, err := s.Config(Address{Bus: 1}); return err },
		func() error { _, err := s.Resources(Address{Bus: 1}); return err },
		func() error { _, err := s.BARs(Address{Bus: 1}); return err },
	} {
		if err := fn(); !errors.Is(err, ErrNotFound) {
			t.Errorf("missing device: %v, want ErrNotFound", err)
		}
	}
}
