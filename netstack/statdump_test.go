package netstack

import (
	"fmt"
	"reflect"
	"strings"

	"gvisor.dev/gvisor/pkg/tcpip"
)

// nonzero lists the nonzero counters of a gVisor stats struct, for a
// failure message.
func nonzero(prefix string, v reflect.Value, out *strings.Builder) {
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			return
		}
		if c, ok := v.Interface().(*tcpip.StatCounter); ok {
			if n := c.Value(); n != 0 {
				fmt.Fprintf(out, "%s=%d ", prefix, n)
			}
			return
		}
		nonzero(prefix, v.Elem(), out)
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			if v.Type().Field(i).IsExported() {
				nonzero(prefix+"."+v.Type().Field(i).Name, v.Field(i), out)
			}
		}
	}
}

func statDump(n *Net) string {
	var b strings.Builder
	st := n.Stack().Stats()
	nonzero("TCP", reflect.ValueOf(st.TCP), &b)
	nonzero("IP", reflect.ValueOf(st.IP), &b)
	return b.String()
}
