package afpacket

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

func readDir(p string) ([]string, error) {
	ents, err := os.ReadDir(p)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names, err
}

func readlink(p string) (string, error) { return os.Readlink(p) }

func unsafeAddr(b []byte) unsafe.Pointer { return unsafe.Pointer(&b[0]) }

// mapped reports whether a mapping of the process covers addr.
func mapped(t testing.TB, addr uintptr) bool {
	f, err := os.Open("/proc/self/maps")
	require.NoError(t, err)
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		lo, hi, _ := strings.Cut(strings.Fields(s.Text())[0], "-")
		a, _ := strconv.ParseUint(lo, 16, 64)
		b, _ := strconv.ParseUint(hi, 16, 64)
		if uint64(addr) >= a && uint64(addr) < b {
			return true
		}
	}
	return false
}
