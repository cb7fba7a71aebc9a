package main

import (
	"strings"
	"testing"
	"time"
)

// TestCheckTools: the tool and direction lists are checked before a guest
// boots; a vfnic mode may carry an idle interval, the other tools may not.
func TestCheckTools(t *testing.T) {
	for _, tc := range []struct {
		tools, dirs string
		ok          bool
	}{
		{"dpdk,busy,adaptive,interrupt,linux", "tx,rx", true},
		{"busy,adaptive:1ms,adaptive:300us,interrupt:2ms", "rx", true},
		{"adaptive:0s", "tx", false},
		{"adaptive:-1ms", "tx", false},
		{"adaptive:soon", "tx", false},
		{"dpdk:1ms", "tx", false},
		{"linux:1ms", "tx", false},
		{"fast", "tx", false},
		{"busy", "up", false},
		{"busy", "", false},
		{"busy,busy@base,adaptive:1ms@base", "rx", true},
		{"dpdk@base", "rx", false},
		{"linux@base", "tx", false},
		{"busy@head", "tx", false},
	} {
		if err := checkTools(tc.tools, tc.dirs); (err == nil) != tc.ok {
			t.Errorf("checkTools(%q, %q) = %v, want ok %v", tc.tools, tc.dirs, err, tc.ok)
		}
	}
}

// TestTableRatios: every tool gets its ratio to DPDK, also one listed
// before it, and each cell its spread.
func TestTableRatios(t *testing.T) {
	var rs []result
	for i, v := range []float64{90, 110, 100} {
		rs = append(rs, result{nic: "igb", dir: "rx", tool: "busy", rep: i, rate: v},
			result{nic: "igb", dir: "rx", tool: "dpdk", rep: i, rate: 2 * v})
	}
	var b strings.Builder
	table(&b, rs, []string{"igb"}, []string{"busy", "dpdk"}, []string{"rx"}, time.Second)
	out := b.String()
	for _, want := range []string{"busy     100    0.50x     20%", "dpdk     200        -     20%"} {
		if !strings.Contains(strings.Join(strings.Fields(out), " "), strings.Join(strings.Fields(want), " ")) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}
