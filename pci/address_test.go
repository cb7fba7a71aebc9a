package pci

import (
	"errors"
	"strings"
	"testing"
)

func TestParseAddress(t *testing.T) {
	good := []struct {
		in   string
		want Address
		str  string
	}{
		{"0000:00:04.0", Address{0, 0, 4, 0}, "0000:00:04.0"},
		{"00:04.0", Address{0, 0, 4, 0}, "0000:00:04.0"},
		{"0001:3b:1f.7", Address{1, 0x3b, 0x1f, 7}, "0001:3b:1f.7"},
		{"FFFF:FF:1F.7", Address{0xffff, 0xff, 0x1f, 7}, "ffff:ff:1f.7"},
		{"0:0:0.0", Address{}, "0000:00:00.0"},
		{"a:b:c.1", Address{0xa, 0xb, 0xc, 1}, "000a:0b:0c.1"},
	}
	for _, tc := range good {
		got, err := ParseAddress(tc.in)
		if err != nil {
			t.Errorf("ParseAddress(%q): %v", tc.in, err)
			continue
		}
		if got != tc.want {
			t.Errorf("ParseAddress(%q) = %+v, want %+v", tc.in, got, tc.want)
		}
		if got.String() != tc.str {
			t.Errorf("ParseAddress(%q).String() = %q, want %q", tc.in, got.String(), tc.str)
		}
	}

	bad := []struct{ in, why string }{
		{"", "want"},
		{"0000:00:04", `".function"`},
		{"00:04", `".function"`},
		{"0000:00:20.0", `device must be 1 or 2 hex digits from 00 to 1f, got "20"`},
		{"0000:00:04.8", `function must be one hex digit 0-7, got "8"`},
		{"0000:00:04.00", `function must be one hex digit 0-7, got "00"`},
		{"0000:00:04.x", `function must be one hex digit 0-7, got "x"`},
		{"0000:00:04.", `function must be one hex digit 0-7, got ""`},
		{"10000:00:04.0", `domain must be 1 to 4 hex digits, got "10000"`},
		{"0000:100:04.0", `bus must be 1 or 2 hex digits, got "100"`},
		{"0000:00:004.0", `device must be 1 or 2 hex digits from 00 to 1f, got "004"`},
		{"0000:0g:04.0", `bus must be 1 or 2 hex digits, got "0g"`},
		{"0000:+1:04.0", `bus must be 1 or 2 hex digits, got "+1"`},
		{"0000:00:04.0:1", "want"},
		{"0000::04.0", `bus must be 1 or 2 hex digits, got ""`},
		{"0000:00:.0", `device must be 1 or 2 hex digits from 00 to 1f, got ""`},
		{" 0000:00:04.0", `domain must be 1 to 4 hex digits, got " 0000"`},
		{"00:04.0 ", `function must be one hex digit 0-7, got "0 "`},
	}
	for _, tc := range bad {
		_, err := ParseAddress(tc.in)
		if !errors.Is(err, ErrBadAddress) {
			t.Errorf("ParseAddress(%q) error = %v, want ErrBadAddress", tc.in, err)
			continue
		}
		if !strings.Contains(err.Error(), tc.why) || !strings.Contains(err.Error(), `"`+tc.in+`"`) {
			t.Errorf("ParseAddress(%q) error %q should quote the input and mention %q", tc.in, err, tc.why)
		}
	}
}

func TestAddressRoundTrip(t *testing.T) {
	for _, a := range []Address{{}, {0xffff, 0xff, 31, 7}, {0x12, 0x34, 5, 6}} {
		b, err := ParseAddress(a.String())
		if err != nil || b != a {
			t.Errorf("round trip of %+v: got %+v, %v", a, b, err)
		}
	}
}
