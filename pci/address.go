package pci

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ErrBadAddress reports a PCI address that cannot be parsed.
var ErrBadAddress = errors.New("pci: bad address")

// Address is a PCI function address: domain:bus:device.function.
type Address struct {
	Domain   uint16
	Bus      uint8
	Device   uint8 // 0..31
	Function uint8 // 0..7
}

// ParseAddress parses "DDDD:BB:DD.F" (as sysfs names devices) or the short
// "BB:DD.F" form (as lspci prints them), which means domain 0. Hex digits may
// be upper or lower case.
func ParseAddress(s string) (Address, error) {
	bad := func(why string) (Address, error) {
		return Address{}, fmt.Errorf("%w %q: %s", ErrBadAddress, s, why)
	}
	var a Address
	var bus, devfn string
	parts := strings.Split(s, ":")
	switch len(parts) {
	case 2:
		bus, devfn = parts[0], parts[1]
	case 3:
		d, err := parseHex(parts[0], 4, 16)
		if err != nil {
			return bad("domain " + err.Error())
		}
		a.Domain = uint16(d)
		bus, devfn = parts[1], parts[2]
	default:
		return bad(`want "dddd:bb:dd.f" or "bb:dd.f"`)
	}
	b, err := parseHex(bus, 2, 8)
	if err != nil {
		return bad("bus " + err.Error())
	}
	dev, fn, ok := strings.Cut(devfn, ".")
	if !ok {
		return bad(`missing ".function"`)
	}
	d, err := parseHex(dev, 2, 8)
	if err != nil {
		return bad("device " + err.Error())
	}
	if d > 31 {
		return bad("device number above 0x1f")
	}
	f, err := parseHex(fn, 1, 8)
	if err != nil {
		return bad("function " + err.Error())
	}
	if f > 7 {
		return bad("function number above 7")
	}
	a.Bus, a.Device, a.Function = uint8(b), uint8(d), uint8(f)
	return a, nil
}

// parseHex parses 1..maxDigits hex digits (no prefix, no sign) into a value
// of at most bits bits.
func parseHex(s string, maxDigits, bits int) (uint64, error) {
	if s == "" || len(s) > maxDigits {
		return 0, fmt.Errorf("%q: want 1 to %d hex digits", s, maxDigits)
	}
	// Check the digits here so that the error names the field, not strconv.
	for _, c := range s {
		if !strings.ContainsRune("0123456789abcdefABCDEF", c) {
			return 0, fmt.Errorf("%q: not hex", s)
		}
	}
	return strconv.ParseUint(s, 16, bits)
}

// String returns the canonical sysfs form, "0000:00:04.0".
func (a Address) String() string {
	return fmt.Sprintf("%04x:%02x:%02x.%x", a.Domain, a.Bus, a.Device, a.Function)
}
