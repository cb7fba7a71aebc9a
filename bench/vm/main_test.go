package main

import "testing"

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
	} {
		if err := checkTools(tc.tools, tc.dirs); (err == nil) != tc.ok {
			t.Errorf("checkTools(%q, %q) = %v, want ok %v", tc.tools, tc.dirs, err, tc.ok)
		}
	}
}
