// Package stackstats lists the counters of gVisor's TCP/IP stack that are
// not zero, for the diagnostics of netstack's tests on the host and in
// the guest.
package stackstats

import (
	"fmt"
	"reflect"
	"sort"
	"strings"

	"gvisor.dev/gvisor/pkg/tcpip"
)

// NonZero lists the non-zero counters of a gVisor stats struct (such as
// tcpip.Stats, or its TCP or IP part), as "Path.Name=value", sorted.
func NonZero(v any) string {
	var out []string
	var walk func(prefix string, v reflect.Value)
	walk = func(prefix string, v reflect.Value) {
		switch v.Kind() {
		case reflect.Pointer:
			if v.IsNil() {
				return
			}
			if c, ok := v.Interface().(*tcpip.StatCounter); ok {
				if x := c.Value(); x != 0 {
					out = append(out, fmt.Sprintf("%s=%d", prefix, x))
				}
				return
			}
			walk(prefix, v.Elem())
		case reflect.Struct:
			for i := 0; i < v.NumField(); i++ {
				f := v.Type().Field(i)
				if !f.IsExported() {
					continue
				}
				walk(strings.TrimPrefix(prefix+"."+f.Name, "."), v.Field(i))
			}
		}
	}
	walk("", reflect.ValueOf(v))
	sort.Strings(out)
	return strings.Join(out, " ")
}
