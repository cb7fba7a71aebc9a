// Package tool names the tools that bench/vm's host program asks its guest
// program to run, so that the host refuses a name before a guest boots
// and the guest reads it the same way.
package tool

import (
	"fmt"
	"strings"
	"time"
)

// Parse splits a tool name into its base (dpdk, busy, adaptive, interrupt
// or linux) and the idle interval a vfnic mode may name after a colon
// (adaptive:1ms: vfnic's -idle 1ms), "" when it names none.
func Parse(name string) (base, idle string, err error) {
	base, idle, hasIdle := strings.Cut(name, ":")
	switch base {
	case "dpdk", "linux":
		if hasIdle {
			return "", "", fmt.Errorf("tool %q: only vfnic's modes take an idle interval", name)
		}
	case "busy", "adaptive", "interrupt":
		if !hasIdle {
			break
		}
		if d, err := time.ParseDuration(idle); err != nil || d <= 0 {
			return "", "", fmt.Errorf("tool %q: idle interval %q is not a positive duration", name, idle)
		}
	default:
		return "", "", fmt.Errorf("unknown tool %q (want dpdk, busy, adaptive, interrupt or linux; a vfnic mode may end in :DURATION)", name)
	}
	return base, idle, nil
}
