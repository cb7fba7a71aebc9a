// Package netns runs a function inside another network namespace on a
// thread of its own, for the tests and the VM harness that make their own
// namespaces (never the machine's).
package netns

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// Named is the path of the namespace `ip netns add NAME` made.
func Named(name string) string { return "/run/netns/" + name }

// Do runs f on a locked thread in the network namespace at path (a
// /run/netns file or /proc/PID/ns/net). Sockets f makes stay in that
// namespace after it returns. The thread goes back to the process's
// namespace after f, or ends with its goroutine if it cannot, so no other
// goroutine ever runs there.
func Do(path string, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		back, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			errc <- err
			return
		}
		defer back.Close()
		there, err := os.Open(path)
		if err != nil {
			errc <- err
			return
		}
		defer there.Close()
		if err := unix.Setns(int(there.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("netns: enter %s: %w", path, err)
			return
		}
		err = f()
		if unix.Setns(int(back.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		} // else the thread ends with this goroutine
		errc <- err
	}()
	return <-errc
}

// RemoveStale deletes the namespaces named prefix+"PID-…" whose process
// PID has ended (a test or run that was killed before it removed its own),
// and returns what `ip netns del` refused, one error per namespace.
func RemoveStale(prefix string) []error {
	ents, err := os.ReadDir("/run/netns")
	if err != nil {
		return nil
	}
	var errs []error
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), prefix)
		pid, _, _ := strings.Cut(rest, "-")
		if !ok || pid == "" {
			continue
		}
		if _, err := os.Stat("/proc/" + pid); err == nil {
			continue // its process still runs
		}
		if out, err := exec.Command("ip", "netns", "del", e.Name()).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("stale namespace %s: %v: %s", e.Name(), err, strings.TrimSpace(string(out))))
		}
	}
	return errs
}
