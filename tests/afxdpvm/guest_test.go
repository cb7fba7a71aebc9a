package afxdpvm

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/stretchr/testify/require"

	vt "github.com/vfnic/vfnic/internal/vethtest"
	"github.com/vfnic/vfnic/nic"
	_ "github.com/vfnic/vfnic/nic/afxdp"
	"github.com/vfnic/vfnic/qemu"
	"github.com/vfnic/vfnic/tests/leakcheck"
)

const (
	frames = 10_000
	window = 128 // frames in flight, below the rings' 256: nobody drops for lack of room
)

// TestGuestZeroCopy opens afxdp on the first NIC, which must bind in
// zero-copy mode, exchanges frames with a Linux AF_PACKET socket on the
// second, and closes it leaving nothing behind: the process's listings
// (/proc/self/fd, /proc/self/maps) and the kernel's (its XDP programs, its
// AF_XDP sockets through sock_diag).
func TestGuestZeroCopy(t *testing.T) {
	if !qemu.InGuest() {
		t.Skip("needs the guest's NICs: runs inside the QEMU guest booted by TestVM")
	}
	vfIf, lxIf := guestInterface(t, slotVfnic), guestInterface(t, slotLinux)
	kver, err := os.ReadFile("/proc/sys/kernel/osrelease")
	require.NoError(t, err)
	t.Logf("kernel %s; vfnic on %s, Linux on %s", strings.TrimSpace(string(kver)), vfIf, lxIf)

	p, err := vt.NewPeer(lxIf)
	require.NoError(t, err)
	defer p.Close()

	before, err := leakcheck.Snapshot()
	require.NoError(t, err)
	socks0, ringMaps0 := sockets(t)
	progs0 := xdpPrograms(t)
	xs0, err := xdpSockets()
	require.NoError(t, err)

	dev, err := nic.Open(context.Background(), "afxdp:"+vfIf, nic.Config{})
	require.NoError(t, err)
	closed := false
	defer func() {
		if !closed {
			_ = dev.Close()
		}
	}()
	info := dev.Info()
	t.Logf("%s: %v", info.Model, info.Features)
	require.Contains(t, info.Features, "zero-copy", "the socket fell back to copy mode")
	require.NotContains(t, info.Features, "copy")
	require.Contains(t, info.Features, "xdp-native")
	// The kernel's word: its listing of AF_XDP sockets has vfnic's, on
	// the interface's queue 0, with a zero-copy UMEM.
	ifc, err := net.InterfaceByName(vfIf)
	require.NoError(t, err)
	xs, err := xdpSockets()
	require.NoError(t, err)
	require.Len(t, xs, len(xs0)+1, "the kernel's AF_XDP sockets: %v", xs)
	x := xs[slices.IndexFunc(xs, func(x xsock) bool { return !slices.Contains(xs0, x) })]
	t.Logf("the kernel lists %v", x)
	require.Equal(t, xsock{Ino: x.Ino, Ifindex: uint32(ifc.Index), Queue: 0, ZeroCopy: true, HasUmem: true}, x)
	// Receive buffers from the start: a NIC on a QEMU hub that has none
	// holds up the other NIC's transmit queue (Linux's watchdog fires).
	rx, err := dev.Rx(0)
	require.NoError(t, err)
	for rx.PostRecv(nil) == nil {
	}
	require.NoError(t, rx.Flush())

	t.Run("send", func(t *testing.T) {
		tx, err := dev.Tx(0)
		require.NoError(t, err)
		vt.SendFrames(t, tx, dev.MAC(), p, frames, window)
	})
	t.Run("receive", func(t *testing.T) {
		vt.RecvFrames(t, rx, dev.MAC(), p, frames, window, nil)
	})

	progs := xdpPrograms(t)
	require.Greater(t, len(progs), len(progs0), "vfnic's XDP program while open")
	socks, ringMaps := sockets(t)
	require.Greater(t, socks, socks0)
	require.Equal(t, ringMaps0+4, ringMaps, "the socket's 4 rings mapped")

	closed = true
	require.NoError(t, dev.Close())
	socks, ringMaps = sockets(t)
	require.Equal(t, socks0, socks, "sockets after Close")
	require.Equal(t, ringMaps0, ringMaps, "ring mappings after Close")
	after, err := leakcheck.Snapshot()
	require.NoError(t, err)
	require.Equal(t, before, after, "fds and mappings after Close")
	// The kernel frees a detached program once its last reference goes,
	// which may be a moment after Close.
	require.Eventually(t, func() bool { return slices.Equal(xdpPrograms(t), progs0) },
		5*time.Second, 10*time.Millisecond, "XDP programs after Close (before Open: %v)", progs0)
	// The kernel releases a closed socket asynchronously too.
	require.Eventually(t, func() bool {
		xs, err := xdpSockets()
		require.NoError(t, err)
		return slices.Equal(xs, xs0)
	}, 5*time.Second, 10*time.Millisecond, "the kernel's AF_XDP sockets after Close (before Open: %v)", xs0)
}

// guestInterface returns the name Linux gave the virtio-net NIC in slot.
func guestInterface(t *testing.T, slot int) string {
	t.Helper()
	addr := qemu.NIC{Slot: slot}.GuestAddr()
	m, err := filepath.Glob("/sys/bus/pci/devices/" + addr + "/virtio*/net/*")
	require.NoError(t, err)
	require.Len(t, m, 1, "Linux's interface on %s", addr)
	return filepath.Base(m[0])
}

// sockets counts the process's open sockets (/proc/self/fd) and its
// mappings of sockets (/proc/self/maps: an AF_XDP socket's rings).
func sockets(t *testing.T) (fds, maps int) {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(l, "socket:") {
			fds++
		}
	}
	b, err := os.ReadFile("/proc/self/maps")
	require.NoError(t, err)
	return fds, strings.Count(string(b), "socket:[")
}

// xdpPrograms lists the ids of the kernel's XDP programs, in order.
func xdpPrograms(t *testing.T) []ebpf.ProgramID {
	t.Helper()
	var ids []ebpf.ProgramID
	for id := ebpf.ProgramID(0); ; {
		next, err := ebpf.ProgramGetNextID(id)
		if errors.Is(err, os.ErrNotExist) {
			return ids
		}
		require.NoError(t, err)
		id = next
		p, err := ebpf.NewProgramFromID(id)
		if errors.Is(err, os.ErrNotExist) {
			continue // freed since
		}
		require.NoError(t, err)
		pi, err := p.Info()
		p.Close()
		require.NoError(t, err)
		if pi.Type == ebpf.XDP {
			ids = append(ids, id)
		}
	}
}
