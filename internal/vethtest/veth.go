// Package vethtest is what the host-device tests share (nic/afxdp,
// nic/afpacket, and cmd/vfnic's, which nic/internal could not serve): a veth pair between two network namespaces a test makes
// and removes, running code inside a namespace, a Linux AF_PACKET peer,
// and test frames that say which frame they are.
package vethtest

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/vfnic/vfnic/internal/netns"
)

// Veth is a veth pair between two network namespaces that the test made
// and removes when it ends, failed or not: vfnic's end "vfx0" in A, the
// Linux peer's "vfx1" in B. No interface of the machine is touched.
type Veth struct {
	A, B string // namespace names
}

var vethSeq atomic.Int32

// NeedRoot skips a test that needs root and the ip command, or fails it
// under CI=true, where skipping would hide that it did not run.
func NeedRoot(t testing.TB) {
	t.Helper()
	NeedRootAnd(t, "host network test (network namespaces, veth, AF_XDP, AF_PACKET)")
}

// NeedRootAnd is NeedRoot for the test named what, which also needs each
// of paths to exist (a device node such as /dev/net/tun).
func NeedRootAnd(t testing.TB, what string, paths ...string) {
	t.Helper()
	why := ""
	if os.Geteuid() != 0 {
		why = "not root"
	} else if _, err := exec.LookPath("ip"); err != nil {
		why = "no ip command (iproute2)"
	}
	for _, p := range paths {
		if _, err := os.Stat(p); why == "" && err != nil {
			why = "no " + p
		}
	}
	if why == "" {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s cannot run under CI=true: %s", what, why)
	}
	t.Skipf("%s needs root and iproute2: %s", what, why)
}

// New makes the namespaces and the pair, with queues queue pairs on
// vfx0, both ends up and IPv6 off (no neighbour discovery frames).
func New(t testing.TB, queues int) *Veth {
	t.Helper()
	NeedRoot(t)
	removeStale(t)
	n := vethSeq.Add(1)
	v := &Veth{A: fmt.Sprintf("vfnic-veth-%d-%d-a", os.Getpid(), n), B: fmt.Sprintf("vfnic-veth-%d-%d-b", os.Getpid(), n)}
	t.Cleanup(func() {
		for _, ns := range []string{v.A, v.B} {
			if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil && !strings.Contains(string(out), "No such file") {
				t.Errorf("ip netns del %s: %v: %s", ns, err, out)
			}
		}
	})
	q := fmt.Sprint(queues)
	for _, args := range [][]string{
		{"netns", "add", v.A},
		{"netns", "add", v.B},
		{"-n", v.A, "link", "add", "vfx0", "numrxqueues", q, "numtxqueues", q, "type", "veth", "peer", "name", "vfx1", "numrxqueues", q, "numtxqueues", q, "netns", v.B},
	} {
		IP(t, args...)
	}
	for _, ns := range []struct{ ns, dev string }{{v.A, "vfx0"}, {v.B, "vfx1"}} {
		for _, k := range []string{"all", "default", ns.dev} {
			IP(t, "netns", "exec", ns.ns, "sysctl", "-qw", "net.ipv6.conf."+k+".disable_ipv6=1")
		}
		IP(t, "-n", ns.ns, "link", "set", ns.dev, "up")
	}
	return v
}

// IP runs the ip command and returns its output, failing t on an error.
func IP(t testing.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// In runs f on a thread in namespace ns (netns.Do).
func In(ns string, f func() error) error { return netns.Do(netns.Named(ns), f) }

// removeStale removes the namespaces of test processes that ended without
// removing theirs (killed): "vfnic-veth-PID-..." whose PID is gone.
func removeStale(t testing.TB) {
	for _, err := range netns.RemoveStale("vfnic-veth-") {
		t.Log(err)
	}
}

// Peer makes a Peer on vfx1 in namespace B, closed at the end of the test.
func (v *Veth) Peer(t testing.TB) *Peer {
	t.Helper()
	var p *Peer
	if err := In(v.B, func() (err error) { p, err = NewPeer("vfx1"); return err }); err != nil {
		t.Fatalf("peer on vfx1: %v", err)
	}
	t.Cleanup(p.Close)
	return p
}
