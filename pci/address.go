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
		d, err := hexField("domain", parts[0], 4, 0xffff, "1 to 4 hex digits")
		if err != nil {
			return bad(err.Error())
		}
		a.Domain = uint16(d)
		bus, devfn = parts[1], parts[2]
	default:
		return bad(`want "dddd:bb:dd.f" or "bb:dd.f"`)
	}
	b, err := hexField("bus", bus, 2, 0xff, "1 or 2 hex digits")
	if err != nil {
		return bad(err.Error())
	}
	dev, fn, ok := strings.Cut(devfn, ".")
	if !ok {
		return bad(`missing ".function"`)
	}
	d, err := hexField("device", dev, 2, 0x1f, "1 or 2 hex digits from 00 to 1f")
	if err != nil {
		return bad(err.Error())
	}
	f, err := hexField("function", fn, 1, 7, "one hex digit 0-7")
	if err != nil {
		return bad(err.Error())
	}
	a.Bus, a.Device, a.Function = uint8(b), uint8(d), uint8(f)
	return a, nil
}

// hexField parses the address field name from s: 1 to digits hex digits
// (no prefix, no sign) of a value up to max. The error says what the field
// must be (want) and what it got.
func hexField(name, s string, digits int, max uint64, want string) (uint64, error) {
	fail := fmt.Errorf("%s must be %s, got %q", name, want, s)
	if s == "" || len(s) > digits {
		return 0, fail
	}
	// Check the digits here: strconv would take a sign or an underscore.
	for _, c := range s {
		if !strings.ContainsRune("0123456789abcdefABCDEF", c) {
			return 0, fail
		}
	}
	v, err := strconv.ParseUint(s, 16, 64)
	if err != nil || v > max {
		return 0, fail
	}
	return v, nil
}

// String returns the canonical sysfs form, "0000:00:04.0".
func (a Address) String() string {
	return fmt.Sprintf("%04x:%02x:%02x.%x", a.Domain, a.Bus, a.Device, a.Function)
}
