package netstack

import "github.com/vfnic/vfnic/internal/stackstats"

// statDump lists the stack's non-zero TCP and IP counters, for a failure
// message.
func statDump(n *Net) string {
	st := n.Stack().Stats()
	return "TCP: " + stackstats.NonZero(st.TCP) + "; IP: " + stackstats.NonZero(st.IP)
}
