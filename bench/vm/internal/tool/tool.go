// Package tool names the tools that bench/vm's host program asks its guest
// program to run, so that the host refuses a name before a guest boots
// and the guest reads it the same way.
package tool

import (
	"fmt"
	"strings"
	"time"
)

// BaseSuffix ends a vfnic mode run by the base build's vfnic (busy@base),
// for a before/after comparison in one guest.
const BaseSuffix = "@base"

// Parse splits a tool name into its base (dpdk, busy, adaptive, interrupt
// or linux), the idle interval a vfnic mode may name after a colon
// (adaptive:1ms: vfnic's -idle 1ms), "" when it names none, and whether it
// ends in BaseSuffix (a vfnic mode only).
func Parse(name string) (base, idle string, baseBuild bool, err error) {
	rest, baseBuild := strings.CutSuffix(name, BaseSuffix)
	base, idle, hasIdle := strings.Cut(rest, ":")
	switch base {
	case "dpdk", "linux":
		if hasIdle {
			return "", "", false, fmt.Errorf("tool %q: only vfnic's modes take an idle interval", name)
		}
		if baseBuild {
			return "", "", false, fmt.Errorf("tool %q: only vfnic's modes have a base build", name)
		}
	case "busy", "adaptive", "interrupt":
		if !hasIdle {
			break
		}
		if d, err := time.ParseDuration(idle); err != nil || d <= 0 {
			return "", "", false, fmt.Errorf("tool %q: idle interval %q is not a positive duration", name, idle)
		}
	default:
		return "", "", false, fmt.Errorf("unknown tool %q (want dpdk, busy, adaptive, interrupt or linux; a vfnic mode may end in :DURATION and in %s)", name, BaseSuffix)
	}
	return base, idle, baseBuild, nil
}
