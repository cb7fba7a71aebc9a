package pci

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// ErrBadConfig reports configuration space that cannot be decoded: too
// short, a capability list that loops or points outside config space, or a
// capability whose fields are inconsistent.
var ErrBadConfig = errors.New("pci: bad config space")

// Sizes of configuration space.
const (
	HeaderSize         = 64   // the type 0/1 header every reader must supply
	ConfigSize         = 256  // conventional PCI config space
	ExtendedConfigSize = 4096 // PCI Express extended config space
)

// Standard capability IDs (byte 0 of a capability in the list at 0x34).
const (
	CapPM     = 0x01 // power management
	CapMSI    = 0x05 // message signalled interrupts
	CapVendor = 0x09 // vendor specific (virtio puts its layout here)
	CapPCIe   = 0x10 // PCI Express
	CapMSIX   = 0x11 // MSI-X
)

// Extended capability IDs (bits 15:0 of a header from 0x100 on).
const (
	ExtCapAER    = 0x0001 // advanced error reporting
	ExtCapDSN    = 0x0003 // device serial number
	ExtCapVendor = 0x000b // vendor specific extended capability
	ExtCapSRIOV  = 0x0010 // single root I/O virtualisation
)

// Offsets and bits of the configuration header that the walk needs.
const (
	offStatus     = 0x06
	statusCapList = 1 << 4 // status: capabilities list present
	offHeaderType = 0x0e
	offCapPtr     = 0x34 // type 0 and 1 headers
	offCardbusCap = 0x14 // type 2 (CardBus) header
)

// Bounds on the bytes a Capability exposes when its length is not encoded
// in the capability itself.
const (
	maxStdWindow = 64
	maxExtWindow = 128
)

// Capability is one entry of the standard or extended capability list.
type Capability struct {
	// ID is the capability ID: 8 bits for standard capabilities, 16 bits
	// for extended ones.
	ID uint16
	// Offset is where the capability starts in config space.
	Offset int
	// Extended is true for capabilities in the PCIe extended space (>= 0x100).
	Extended bool
	// Version is the capability version of an extended capability.
	Version uint8
	// Body holds the capability's bytes, header included, from the
	// snapshot the Config was decoded from. Its length is the encoded
	// length where the capability has one (vendor-specific, MSI, MSI-X,
	// PCIe, DSN, extended vendor-specific); otherwise it extends to the
	// next capability or a bounded window, never past config space.
	Body []byte
}

// Config is a decoded snapshot of a function's configuration space.
// Registers that change at run time (command, MSI-X enable) must be re-read
// from the device; this is what they held when the snapshot was taken.
type Config struct {
	// Raw is the configuration space as read: 64 to 4096 bytes.
	Raw        []byte
	VendorID   uint16
	DeviceID   uint16
	Command    uint16
	Status     uint16
	Revision   uint8
	Class      uint32 // 24-bit class code
	HeaderType uint8  // header layout 0, 1 or 2; the multi-function bit is removed
	// MultiFunction is bit 7 of the header type register.
	MultiFunction bool
	// Capabilities lists standard capabilities in list order, then
	// extended ones in list order.
	Capabilities []Capability
}

// ReadConfig reads configuration space through r (a sysfs config file, a
// VFIO config region, a bytes.Reader) and decodes it. r must supply at least
// the 64-byte header; extended capabilities are decoded only when r supplies
// all 4096 bytes.
func ReadConfig(r io.ReaderAt) (*Config, error) {
	buf := make([]byte, ExtendedConfigSize)
	n, err := r.ReadAt(buf[:ConfigSize], 0)
	if n < HeaderSize {
		if err == nil || errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: only %d bytes readable, need the %d-byte header", ErrBadConfig, n, HeaderSize)
		}
		return nil, fmt.Errorf("pci: read config header: %w", err)
	}
	if n == ConfigSize {
		// A short or failing read here just means no extended space:
		// conventional devices and VFIO regions of 256 bytes end here.
		if m, _ := r.ReadAt(buf[ConfigSize:], ConfigSize); m == ExtendedConfigSize-ConfigSize {
			n = ExtendedConfigSize
		}
	}
	return parseConfig(buf[:n])
}

// ParseConfig decodes configuration space held in b (64 to 4096 bytes;
// extra bytes are ignored). The Config keeps its own copy of b.
func ParseConfig(b []byte) (*Config, error) {
	if len(b) > ExtendedConfigSize {
		b = b[:ExtendedConfigSize]
	}
	return parseConfig(append([]byte(nil), b...))
}

// Capabilities reads configuration space through r and returns its
// capability list; see ReadConfig.
func Capabilities(r io.ReaderAt) ([]Capability, error) {
	c, err := ReadConfig(r)
	if err != nil {
		return nil, err
	}
	return c.Capabilities, nil
}

func parseConfig(raw []byte) (*Config, error) {
	if len(raw) < HeaderSize {
		return nil, fmt.Errorf("%w: %d bytes, need the %d-byte header", ErrBadConfig, len(raw), HeaderSize)
	}
	c := &Config{
		Raw:           raw,
		VendorID:      le16(raw, 0x00),
		DeviceID:      le16(raw, 0x02),
		Command:       le16(raw, 0x04),
		Status:        le16(raw, offStatus),
		Revision:      raw[0x08],
		Class:         uint32(raw[0x09]) | uint32(raw[0x0a])<<8 | uint32(raw[0x0b])<<16,
		HeaderType:    raw[offHeaderType] & 0x7f,
		MultiFunction: raw[offHeaderType]&0x80 != 0,
	}
	std, err := c.walkStandard()
	if err != nil {
		return nil, err
	}
	ext, err := c.walkExtended()
	if err != nil {
		return nil, err
	}
	c.Capabilities = append(std, ext...)
	c.fillBodies()
	return c, nil
}

// walkStandard follows the list from the capabilities pointer. Every offset
// is visited at most once, so a malformed list ends in an error, not a loop.
func (c *Config) walkStandard() ([]Capability, error) {
	if c.Status&statusCapList == 0 {
		return nil, nil
	}
	from := offCapPtr
	if c.HeaderType == 2 {
		from = offCardbusCap
	}
	raw := c.Raw
	var seen [ConfigSize / 4]bool
	var caps []Capability
	// The low two bits of every pointer are reserved; hardware may set them.
	ptr := int(raw[from]) &^ 3
	for ptr != 0 {
		switch {
		case ptr < HeaderSize:
			return nil, fmt.Errorf("%w: capability pointer at 0x%02x is 0x%02x, inside the header", ErrBadConfig, from, ptr)
		case ptr+2 > len(raw):
			return nil, fmt.Errorf("%w: capability pointer at 0x%02x is 0x%02x, beyond the %d bytes of config space read (the full space needs root)", ErrBadConfig, from, ptr, len(raw))
		case seen[ptr/4]:
			return nil, fmt.Errorf("%w: capability list loops: pointer at 0x%02x returns to 0x%02x", ErrBadConfig, from, ptr)
		}
		seen[ptr/4] = true
		id := raw[ptr]
		if id == 0xff {
			// All-ones is what reads of a vanished device return: the
			// kernel treats it as the end of the list, and so do we.
			break
		}
		caps = append(caps, Capability{ID: uint16(id), Offset: ptr})
		from = ptr + 1
		ptr = int(raw[from]) &^ 3
	}
	return caps, nil
}

// walkExtended follows the PCIe extended list from 0x100 when the full
// 4096-byte space is present.
func (c *Config) walkExtended() ([]Capability, error) {
	raw := c.Raw
	if len(raw) < ExtendedConfigSize {
		return nil, nil
	}
	if h := le32(raw, ConfigSize); h == 0 || h == 0xffffffff {
		return nil, nil // no extended capabilities, or none implemented
	}
	var seen [(ExtendedConfigSize - ConfigSize) / 4]bool
	var caps []Capability
	for off := ConfigSize; ; {
		seen[(off-ConfigSize)/4] = true
		h := le32(raw, off)
		// ID 0 is a placeholder that only links to the next capability.
		if id := uint16(h); id != 0 {
			caps = append(caps, Capability{ID: id, Offset: off, Extended: true, Version: uint8(h>>16) & 0xf})
		}
		next := int(h>>20) &^ 3
		switch {
		case next == 0:
			return caps, nil
		case next < ConfigSize:
			return nil, fmt.Errorf("%w: extended capability at 0x%03x points to 0x%03x, below 0x100", ErrBadConfig, off, next)
		case seen[(next-ConfigSize)/4]:
			return nil, fmt.Errorf("%w: extended capability list loops: 0x%03x returns to 0x%03x", ErrBadConfig, off, next)
		}
		off = next
	}
}

// fillBodies gives every capability its bytes: the encoded length where the
// capability states one, else up to the next capability in the same space,
// within a bounded window.
func (c *Config) fillBodies() {
	raw := c.Raw
	stdEnd := min(len(raw), ConfigSize)
	for i := range c.Capabilities {
		cp := &c.Capabilities[i]
		end, window := stdEnd, maxStdWindow
		if cp.Extended {
			end, window = len(raw), maxExtWindow
		}
		n := encodedLen(raw, *cp)
		if n == 0 {
			// Unknown layout: stop at the closest capability above this one.
			n = window
			for _, o := range c.Capabilities {
				if o.Extended == cp.Extended && o.Offset > cp.Offset && o.Offset-cp.Offset < n {
					n = o.Offset - cp.Offset
				}
			}
		}
		cp.Body = raw[cp.Offset:min(cp.Offset+n, end):min(cp.Offset+n, end)]
	}
}

// encodedLen returns the length a capability's own fields give it, 0 when
// its layout is not one this package knows.
func encodedLen(raw []byte, cp Capability) int {
	at := func(i int) byte { // reads past the end give 0, never a panic
		if i < len(raw) {
			return raw[i]
		}
		return 0
	}
	o := cp.Offset
	if cp.Extended {
		switch cp.ID {
		case ExtCapDSN:
			return 12
		case ExtCapVendor:
			// VSEC header: length in bits 31:20 of the second dword.
			return max(int(at(o+6)>>4)|int(at(o+7))<<4, 8)
		}
		return 0
	}
	switch cp.ID {
	case CapPM:
		return 8
	case CapVendor:
		return max(int(at(o+2)), 3) // cap_len; never shorter than the bytes that hold it
	case CapMSI:
		ctrl := uint16(at(o+2)) | uint16(at(o+3))<<8
		n := 10
		if ctrl&msi64Bit != 0 {
			n += 4
		}
		if ctrl&msiPerVectorMask != 0 {
			n += 10 // reserved, mask bits, pending bits
		}
		return n
	case CapPCIe:
		if at(o+2)&0xf == 1 {
			return 0x24 // version 1 capability
		}
		return 0x3c
	case CapMSIX:
		return 12
	}
	return 0
}

// Capability returns the first standard capability with the given ID.
func (c *Config) Capability(id uint8) (Capability, bool) {
	for _, cp := range c.Capabilities {
		if !cp.Extended && cp.ID == uint16(id) {
			return cp, true
		}
	}
	return Capability{}, false
}

// ExtendedCapability returns the first extended capability with the given ID.
func (c *Config) ExtendedCapability(id uint16) (Capability, bool) {
	for _, cp := range c.Capabilities {
		if cp.Extended && cp.ID == id {
			return cp, true
		}
	}
	return Capability{}, false
}

func le16(b []byte, off int) uint16 { return binary.LittleEndian.Uint16(b[off:]) }
func le32(b []byte, off int) uint32 { return binary.LittleEndian.Uint32(b[off:]) }

// need checks that a capability of the wanted ID has at least n bytes.
func (cp Capability) need(id uint16, extended bool, n int, what string) error {
	if cp.ID != id || cp.Extended != extended {
		return fmt.Errorf("%w: capability 0x%02x at 0x%02x is not %s", ErrBadConfig, cp.ID, cp.Offset, what)
	}
	if len(cp.Body) < n {
		return fmt.Errorf("%w: %s capability at 0x%02x has %d bytes, need %d", ErrBadConfig, what, cp.Offset, len(cp.Body), n)
	}
	return nil
}

// MSI-X message control bits.
const (
	msixEnable       = 1 << 15
	msixFunctionMask = 1 << 14
)

// MSIX is a decoded MSI-X capability.
type MSIX struct {
	// TableSize is the number of vectors (the encoded N-1, plus one).
	TableSize    int
	TableBAR     int    // BAR holding the vector table
	TableOffset  uint32 // offset of the table in that BAR
	PBABAR       int    // BAR holding the pending bit array
	PBAOffset    uint32 // offset of the PBA in that BAR
	Enabled      bool   // MSI-X enable bit when the snapshot was taken
	FunctionMask bool   // function mask bit when the snapshot was taken
}

// MSIX decodes an MSI-X capability (ID 0x11).
func (cp Capability) MSIX() (MSIX, error) {
	if err := cp.need(CapMSIX, false, 12, "MSI-X"); err != nil {
		return MSIX{}, err
	}
	ctrl := le16(cp.Body, 2)
	tbl, pba := le32(cp.Body, 4), le32(cp.Body, 8)
	m := MSIX{
		TableSize:    int(ctrl&0x7ff) + 1,
		TableBAR:     int(tbl & 7),
		TableOffset:  tbl &^ 7,
		PBABAR:       int(pba & 7),
		PBAOffset:    pba &^ 7,
		Enabled:      ctrl&msixEnable != 0,
		FunctionMask: ctrl&msixFunctionMask != 0,
	}
	if m.TableBAR > 5 || m.PBABAR > 5 {
		return MSIX{}, fmt.Errorf("%w: MSI-X at 0x%02x names reserved BAR indicator (table %d, PBA %d)", ErrBadConfig, cp.Offset, m.TableBAR, m.PBABAR)
	}
	return m, nil
}

// MSI message control bits.
const (
	msiEnable        = 1 << 0
	msi64Bit         = 1 << 7
	msiPerVectorMask = 1 << 8
)

// MSI is a decoded MSI capability.
type MSI struct {
	Enabled       bool
	Is64          bool // 64-bit message address
	PerVectorMask bool // mask and pending registers are present
	// MaxVectors is the number of vectors the function requests (1..32).
	MaxVectors int
	// EnabledVectors is the number of vectors software allocated.
	EnabledVectors int
	Address        uint64 // message address when the snapshot was taken
	Data           uint16 // message data when the snapshot was taken
}

// MSI decodes an MSI capability (ID 0x05).
func (cp Capability) MSI() (MSI, error) {
	if err := cp.need(CapMSI, false, 10, "MSI"); err != nil {
		return MSI{}, err
	}
	ctrl := le16(cp.Body, 2)
	m := MSI{
		Enabled:       ctrl&msiEnable != 0,
		Is64:          ctrl&msi64Bit != 0,
		PerVectorMask: ctrl&msiPerVectorMask != 0,
		// Both counts are log2 encoded; 6 and 7 are reserved and clamped
		// to the 32-vector maximum.
		MaxVectors:     1 << min((ctrl>>1)&7, 5),
		EnabledVectors: 1 << min((ctrl>>4)&7, 5),
	}
	m.Address = uint64(le32(cp.Body, 4))
	dataOff := 8
	if m.Is64 {
		if err := cp.need(CapMSI, false, 14, "64-bit MSI"); err != nil {
			return MSI{}, err
		}
		m.Address |= uint64(le32(cp.Body, 8)) << 32
		dataOff = 12
	}
	m.Data = le16(cp.Body, dataOff)
	return m, nil
}

// PCIe is the basic part of a decoded PCI Express capability.
type PCIe struct {
	Version  uint8 // capability version (1 or 2)
	PortType uint8 // device/port type: 0 endpoint, 4 root port, 9 RC integrated endpoint, ...
	// MaxPayloadSupported and MaxPayload are in bytes (128..4096).
	MaxPayloadSupported int
	MaxPayload          int
	MaxReadRequest      int  // bytes (128..4096)
	FLR                 bool // function level reset supported
	MaxLinkSpeed        uint8
	MaxLinkWidth        uint8
	// LinkSpeed and LinkWidth are the negotiated values (speed 1 = 2.5 GT/s,
	// 2 = 5, 3 = 8, 4 = 16, 5 = 32); zero for functions without a link.
	LinkSpeed uint8
	LinkWidth uint8
}

// PCIe decodes a PCI Express capability (ID 0x10).
func (cp Capability) PCIe() (PCIe, error) {
	if err := cp.need(CapPCIe, false, 0x14, "PCI Express"); err != nil {
		return PCIe{}, err
	}
	b := cp.Body
	caps, devcap, devctl := le16(b, 0x02), le32(b, 0x04), le16(b, 0x08)
	linkcap, linksta := le32(b, 0x0c), le16(b, 0x12)
	return PCIe{
		Version:             uint8(caps & 0xf),
		PortType:            uint8(caps>>4) & 0xf,
		MaxPayloadSupported: 128 << min(devcap&7, 5),
		MaxPayload:          128 << min((devctl>>5)&7, 5),
		MaxReadRequest:      128 << min((devctl>>12)&7, 5),
		FLR:                 devcap&(1<<28) != 0,
		MaxLinkSpeed:        uint8(linkcap & 0xf),
		MaxLinkWidth:        uint8(linkcap>>4) & 0x3f,
		LinkSpeed:           uint8(linksta & 0xf),
		LinkWidth:           uint8(linksta>>4) & 0x3f,
	}, nil
}
