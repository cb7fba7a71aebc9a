package qemu

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/vfnic/vfnic/internal/netns"
)

// Tap wires (NetTap): a network namespace of the run's own holds one
// bridge per wire and one tap device per NIC, so that no interface of the
// machine is touched. Each tap is opened with virtio-net headers
// (IFF_VNET_HDR) by a thread that entered the namespace, and its
// descriptor handed to QEMU, which stays in the machine's namespace (its
// dgram sockets need the machine's 127.0.0.1).

// TapNamespacePrefix starts the name of each namespace Run makes for tap
// wires: "vfnic-tap-PID-N". One left by a process that was killed (its
// PID gone) is removed by the next run that makes one.
const TapNamespacePrefix = "vfnic-tap-"

var tapSeq atomic.Int32

// tapWires are the taps of a run's NetTap NICs, in NIC order, and the
// namespace they are in.
type tapWires struct {
	ns    string
	files []*os.File
}

// assignTapFDs gives each NetTap NIC the descriptor number QEMU will find
// its tap on: 3, 4, ... in NIC order (exec.Cmd.ExtraFiles). It returns
// how many there are.
func assignTapFDs(nics []NIC) int {
	k := 0
	for i := range nics {
		if nics[i].Net.Kind == NetTap {
			nics[i].Net.fd = 3 + k
			k++
		}
	}
	return k
}

// bridgeName and tapName are the interface names in the namespace
// (IFNAMSIZ allows 15 bytes; wires have at most 12).
func bridgeName(wire string) string { return "br-" + wire }
func tapName(index int) string      { return fmt.Sprintf("vt%d", index) }

// openTapWires makes the namespace, a tap for each NetTap NIC of nics and
// a bridge for each wire, with every device up and IPv6 off (no neighbour
// discovery or router solicitations of the namespace's own on the wire).
// The caller closes the result, which removes the namespace.
func openTapWires(nics []NIC) (_ *tapWires, err error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("%w: tap wires need root (a network namespace, tap devices, a bridge)", ErrBadConfig)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, fmt.Errorf("%w: tap wires need the ip command (iproute2): %v", ErrBadConfig, err)
	}
	removeStaleTapNamespaces()
	w := &tapWires{ns: fmt.Sprintf("%s%d-%d", TapNamespacePrefix, os.Getpid(), tapSeq.Add(1))}
	if err := ipCmd("netns", "add", w.ns); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, w.Close())
		}
	}()
	wires := map[string][]string{}
	err = inNamespace(w.ns, func() error {
		for _, k := range []string{"all", "default"} {
			err := os.WriteFile("/proc/sys/net/ipv6/conf/"+k+"/disable_ipv6", []byte("1"), 0)
			if err != nil && !errors.Is(err, os.ErrNotExist) { // no IPv6 in this kernel: nothing to turn off
				return fmt.Errorf("qemu: turn IPv6 off in namespace %s: %w", w.ns, err)
			}
		}
		for i, n := range nics {
			if n.Net.Kind != NetTap {
				continue
			}
			f, err := openTap(tapName(i))
			if err != nil {
				return err
			}
			w.files = append(w.files, f)
			wires[n.Net.Wire] = append(wires[n.Net.Wire], tapName(i))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(wires))
	for wire := range wires {
		names = append(names, wire)
	}
	sort.Strings(names)
	for _, wire := range names {
		br := bridgeName(wire)
		// No STP (ports forward at once) and no multicast snooping (IPv6
		// neighbour discovery is flooded like broadcast, with no querier).
		if err := ipCmd("-n", w.ns, "link", "add", br, "type", "bridge", "stp_state", "0", "mcast_snooping", "0"); err != nil {
			return nil, err
		}
		for _, tap := range wires[wire] {
			if err := ipCmd("-n", w.ns, "link", "set", tap, "master", br, "up"); err != nil {
				return nil, err
			}
		}
		if err := ipCmd("-n", w.ns, "link", "set", br, "up"); err != nil {
			return nil, err
		}
	}
	return w, nil
}

// openTap creates tap device name in the calling thread's namespace with
// virtio-net headers on, and returns its descriptor. The device lives as
// long as a descriptor on it is open (QEMU's, once it started).
func openTap(name string) (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("qemu: open /dev/net/tun: %w", err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("qemu: tap %s: %w", name, err)
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("qemu: create tap %s (TUNSETIFF): %w", name, err)
	}
	return os.NewFile(uintptr(fd), "/dev/net/tun:"+name), nil
}

// Close closes the run's descriptors of the taps (QEMU's own keep them
// while it runs) and removes the namespace with its bridges.
func (w *tapWires) Close() error {
	var errs []error
	for _, f := range w.files {
		errs = append(errs, f.Close())
	}
	w.files = nil
	if w.ns != "" {
		if out, err := exec.Command("ip", "netns", "del", w.ns).CombinedOutput(); err != nil && !strings.Contains(string(out), "No such file") {
			errs = append(errs, fmt.Errorf("qemu: ip netns del %s: %v: %s", w.ns, err, strings.TrimSpace(string(out))))
		}
		w.ns = ""
	}
	return errors.Join(errs...)
}

// ipCmd runs the ip command.
func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("qemu: ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// inNamespace runs f on a thread in network namespace ns.
func inNamespace(ns string, f func() error) error { return netns.Do(netns.Named(ns), f) }

// removeStaleTapNamespaces removes the tap namespaces of processes that
// ended without removing theirs (killed): TapNamespacePrefix+"PID-..."
// whose PID is gone.
func removeStaleTapNamespaces() { _ = netns.RemoveStale(TapNamespacePrefix) }
