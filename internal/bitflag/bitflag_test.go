package bitflag

import "testing"

func TestString(t *testing.T) {
	names := []Name[uint32]{{1, "A"}, {4, "C"}, {2, "B"}}
	for _, tc := range []struct {
		f    uint32
		want string
	}{
		{0, "0"}, {1, "A"}, {7, "A|C|B"}, {6, "C|B"}, {1 | 0x30, "A|0x30"}, {0x100, "0x100"},
	} {
		if got := String(tc.f, names); got != tc.want {
			t.Errorf("String(%#x) = %q, want %q", tc.f, got, tc.want)
		}
	}
}
