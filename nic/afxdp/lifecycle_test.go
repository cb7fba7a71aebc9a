package afxdp

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/stretchr/testify/require"
	vt "github.com/vfnic/vfnic/internal/vethtest"
	"github.com/vfnic/vfnic/internal/vethtest/vethconf"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/nic/internal/hostif"
	"golang.org/x/sys/unix"
)

// socketFDs counts the process's open sockets.
var socketFDs = vethconf.SocketFDs

// mappings returns the process's mappings of sockets (the rings) and
// whether any mapping covers addr (the UMEM).
func mappings(t testing.TB, addr uintptr) (sockets int, covered bool) {
	f, err := os.Open("/proc/self/maps")
	require.NoError(t, err)
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		line := s.Text()
		if strings.Contains(line, "socket:[") {
			sockets++
		}
		lo, hi, _ := strings.Cut(strings.Fields(line)[0], "-")
		a, _ := strconv.ParseUint(lo, 16, 64)
		b, _ := strconv.ParseUint(hi, 16, 64)
		if uint64(addr) >= a && uint64(addr) < b {
			covered = true
		}
	}
	require.NoError(t, s.Err())
	return sockets, covered
}

// TestCloseLeavesNothing: after Close no socket, ring or UMEM mapping,
// XDP program or map of the device is left: the process's own listings
// (/proc/self/fd, /proc/self/maps), the kernel's program and map ids, and
// ip link's view of the interface.
func TestCloseLeavesNothing(t *testing.T) {
	v := vt.New(t, 2)
	fds0 := socketFDs(t)
	maps0, _ := mappings(t, 0)
	dev := openIn(t, v.A, "vfx0", nic.Config{QueuePairs: 2})
	umem := uintptrOf(dev.xsks[1].umem.Bytes())
	pi, err := dev.red.prog.Info()
	require.NoError(t, err)
	progID, ok := pi.ID()
	require.True(t, ok)
	mi, err := dev.red.xsks.Info()
	require.NoError(t, err)
	mapID, ok := mi.ID()
	require.True(t, ok)
	require.Contains(t, vt.IP(t, "-n", v.A, "link", "show", "vfx0"), fmt.Sprintf("prog/xdp id %d", progID))
	require.Greater(t, socketFDs(t), fds0)
	maps, covered := mappings(t, umem)
	require.Equal(t, maps0+8, maps, "4 rings of 2 sockets")
	require.True(t, covered)

	require.NoError(t, dev.Close())
	require.NoError(t, dev.Close(), "a second Close does nothing")
	require.Equal(t, fds0, socketFDs(t), "sockets")
	maps, covered = mappings(t, umem)
	require.Equal(t, maps0, maps, "ring mappings")
	require.False(t, covered, "UMEM mapping")
	require.Eventually(t, func() bool {
		p, perr := ebpf.NewProgramFromID(ebpf.ProgramID(progID))
		if perr == nil {
			p.Close() // the fd would keep it
		}
		m, merr := ebpf.NewMapFromID(ebpf.MapID(mapID))
		if merr == nil {
			m.Close()
		}
		return errors.Is(perr, os.ErrNotExist) && errors.Is(merr, os.ErrNotExist) &&
			!strings.Contains(vt.IP(t, "-n", v.A, "link", "show", "vfx0"), "prog/xdp")
	}, 5*time.Second, 10*time.Millisecond, "XDP program %d and map %d gone", progID, mapID)

	// Queues say they are closed.
	_, err = dev.rx[0].Poll(make([]nic.Completion, 1)), dev.rx[0].PostRecv(nil)
	require.ErrorIs(t, err, nic.ErrClosed)
	require.ErrorIs(t, dev.tx[0].Send(make([]byte, 60), nil), nic.ErrClosed)
	_, err = dev.Link()
	require.ErrorIs(t, err, nic.ErrClosed)
}

// TestBusy: a queue open twice is a clear ErrBusy, in this process (the
// registry of open interfaces) and at the kernel (another socket bound to
// the queue); a queue reopened right after Close binds (the kernel's
// asynchronous release is retried).
func TestBusy(t *testing.T) {
	v := vt.New(t, 1)
	dev := openIn(t, v.A, "vfx0", nic.Config{})
	err := vt.In(v.A, func() error { _, err := nic.Open(context.Background(), "afxdp:vfx0", nic.Config{}); return err })
	require.ErrorIs(t, err, ErrBusy)
	require.ErrorContains(t, err, "open already in this process")

	old := BindRetry
	BindRetry = 100 * time.Millisecond
	defer func() { BindRetry = old }()
	err = vt.In(v.A, func() error {
		x, err := newXSK(xskConfig{ifname: "vfx0", ifindex: hostif.IfaceOf(&dev.host).Index, size: 64, txBufs: 64, rxBufs: 64, chunk: 2048})
		if err == nil {
			_ = x.close()
		}
		return err
	})
	require.ErrorIs(t, err, ErrBusy)
	require.ErrorIs(t, err, unix.EBUSY)
	require.ErrorContains(t, err, "still bound after")
	BindRetry = old

	require.NoError(t, dev.Close())
	for range 5 {
		d := openIn(t, v.A, "vfx0", nic.Config{})
		require.NoError(t, d.Close())
	}
}

// TestForeignXDP: an XDP program someone else attached is never replaced:
// Open refuses with ErrXDPInUse; with Config.Force one attached through
// netlink is detached and replaced, one held by a bpf_link cannot be.
func TestForeignXDP(t *testing.T) {
	v := vt.New(t, 1)
	var ifindex int
	require.NoError(t, vt.In(v.A, func() error {
		ifc, err := netInterface("vfx0")
		ifindex = ifc
		return err
	}))
	pass, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "foreign_pass", Type: ebpf.XDP, License: "Dual MIT/GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2), asm.Return()}})
	require.NoError(t, err)
	defer pass.Close()
	open := func(force bool) error {
		return vt.In(v.A, func() error {
			d, err := Open(context.Background(), "vfx0", nic.Config{Force: force})
			if err == nil {
				err = d.Close()
			}
			return err
		})
	}

	// Held by a bpf_link.
	var l link.Link
	require.NoError(t, vt.In(v.A, func() (err error) {
		l, err = link.AttachXDP(link.XDPOptions{Program: pass, Interface: ifindex})
		return err
	}))
	err = open(false)
	require.ErrorIs(t, err, ErrXDPInUse)
	require.ErrorContains(t, err, "Config.Force")
	// Forced: the error says why Force could not take it, and does not
	// send the caller to Force again.
	err = open(true)
	require.ErrorIs(t, err, ErrXDPInUse)
	require.ErrorContains(t, err, "Config.Force could not detach it: it is held by a bpf_link")
	require.NotContains(t, err.Error(), "open with Config.Force")
	require.Contains(t, vt.IP(t, "-n", v.A, "link", "show", "vfx0"), "prog/xdp", "still there")
	require.NoError(t, l.Close())

	// Attached through netlink, as ip link set dev X xdp does.
	require.NoError(t, vt.In(v.A, func() error {
		fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return setLinkXDP(fd, ifindex, int32(pass.FD()), unix.XDP_FLAGS_SKB_MODE)
	}))
	require.ErrorIs(t, open(false), ErrXDPInUse)
	require.Contains(t, vt.IP(t, "-n", v.A, "link", "show", "vfx0"), "xdpgeneric", "refused, not replaced")
	require.NoError(t, open(true), "forced")
	require.Eventually(t, func() bool { return !strings.Contains(vt.IP(t, "-n", v.A, "link", "show", "vfx0"), "prog/xdp") },
		5*time.Second, 10*time.Millisecond, "no program after the forced device closed")
}

// netInterface returns the index of the interface named name in the
// calling thread's namespace.
func netInterface(name string) (int, error) {
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return 0, err
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFINDEX, ifr); err != nil {
		return 0, err
	}
	return int(ifr.Uint32()), nil
}

// TestOpenErrors: names, queues and configurations that cannot be opened
// say why.
func TestOpenErrors(t *testing.T) {
	v := vt.New(t, 1)
	for name, want := range map[string]error{
		"afxdp:vfx9":             ErrNoInterface,
		"afxdp:vfx0@1":           nic.ErrInvalid, // one queue
		"afxdp:vfx0@x":           nic.ErrInvalid,
		"afxdp:":                 nic.ErrInvalid,
		"afxdp:a/b":              nic.ErrInvalid,
		"afxdp:0123456789abcdef": nic.ErrInvalid,
	} {
		err := vt.In(v.A, func() error { _, err := nic.Open(context.Background(), name, nic.Config{}); return err })
		require.ErrorIs(t, err, want, name)
	}
	for _, cfg := range []nic.Config{{BufferSize: 1024}, {QueueSize: 1}, {QueueSize: 64, RxBuffers: 32}, {QueuePairs: 2}} {
		err := vt.In(v.A, func() error { _, err := Open(context.Background(), "vfx0", cfg); return err })
		require.ErrorIs(t, err, nic.ErrInvalid, "%+v", cfg)
	}
	dev := openIn(t, v.A, "vfx0", nic.Config{QueueSize: 100})
	require.Equal(t, 64, dev.Info().QueueSize, "rounded down to a power of two")
	require.ErrorIs(t, dev.BindCQ(nil, 0, nic.Recv), nic.ErrInvalid)
	_, err := dev.Rx(1)
	require.ErrorIs(t, err, nic.ErrInvalid)
	tx, err := dev.Tx(0)
	require.NoError(t, err)
	require.ErrorIs(t, tx.Send(make([]byte, 13), nil), nic.ErrFrameSize)
	require.ErrorIs(t, tx.Send(make([]byte, tx.MaxFrame()+1), nil), nic.ErrFrameSize)
	rx, _ := dev.Rx(0)
	require.ErrorIs(t, rx.Release(0x1234), nic.ErrBadBuffer)
	require.ErrorIs(t, rx.Repost(0x1234, nil), nic.ErrBadBuffer)
}
