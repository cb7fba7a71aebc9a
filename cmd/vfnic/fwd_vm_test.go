package main

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vfnic/vfnic/internal/netns"
	"github.com/vfnic/vfnic/qemu"
)

// The wire of TestGuestCLIFwdLinux: Linux NIC A on hub 2 with vfnic port
// X, vfnic port Y on hub 3 with Linux NIC B. Nothing joins the hubs but
// 'vfnic fwd X Y'.
const (
	fwdLinuxA  = "0000:00:0b.0" // virtio-net (split), the guest's Linux, fwdIPA
	fwdPortX   = "0000:00:0c.0" // 82576 on vfio-pci
	fwdPortY   = "0000:00:0d.0" // virtio-net (split) on vfio-pci
	fwdLinuxB  = "0000:00:0e.0" // virtio-net (split), the guest's Linux, moved to a namespace
	fwdIPA     = "10.77.0.1"
	fwdIPB     = "10.77.0.2"
	fwdTCPSize = 2 << 20 // bytes echoed through fwdConns TCP connections
	fwdConns   = 16      // connections at once
)

// fwdNICs are TestVMTools' NICs for TestGuestCLIFwdLinux.
func fwdNICs() []qemu.NIC {
	return []qemu.NIC{
		{Model: qemu.VirtioNet, Slot: 11, Bind: qemu.BindLinux, IPv4: fwdIPA + "/24", Net: qemu.Hub(2)},
		{Model: qemu.IGB, Slot: 12, Bind: qemu.BindVFIO, Net: qemu.Hub(2)},
		// Not a third 82576: QEMU places an 82576's virtual functions 16
		// slots past it, and slots 24-29 hold those of 8, 10 and 12 while
		// 31 is the chipset's. Nor a multi-queue virtio-net: a hub port
		// has one queue. So fwd runs one queue pair here (several are
		// shown between two 82576s by TestGuestCLISinkRSS's pktgen/sink
		// and on the host by TestForwardQueues).
		{Model: qemu.VirtioNet, Slot: 13, Bind: qemu.BindVFIO, Net: qemu.Hub(3)},
		{Model: qemu.VirtioNet, Slot: 14, Bind: qemu.BindLinux, Net: qemu.Hub(3)},
	}
}

// TestGuestCLIFwdLinux: 'fwd -forward io' between an 82576 and a
// virtio-net port joins two of the kernel's own NICs that share no wire.
// B sits in a network namespace of its own (else the kernel would deliver
// A's packets to B's address locally), so ARP, ping and 16 TCP connections
// at once that echo 2 MiB in all cross vfnic, both ways, and arrive intact.
func TestGuestCLIFwdLinux(t *testing.T) {
	if !qemu.InGuest() {
		t.Skip("needs VFIO: runs inside the guest booted by TestVMTools")
	}
	a, b := linuxIfname(t, fwdLinuxA), linuxIfname(t, fwdLinuxB)
	ns := exec.Command("unshare", "-n", "sleep", "600")
	require.NoError(t, ns.Start())
	t.Cleanup(func() { _ = ns.Process.Kill(); _ = ns.Wait() })
	pid := strconv.Itoa(ns.Process.Pid)
	self, err := os.Readlink("/proc/self/ns/net")
	require.NoError(t, err)
	// unshare may not have run yet: moving B to the old namespace would do nothing.
	for deadline := time.Now().Add(10 * time.Second); ; {
		other, err := os.Readlink("/proc/" + pid + "/ns/net")
		if err == nil && other != self {
			break
		}
		require.True(t, time.Now().Before(deadline), "unshare -n made no namespace (%v)", err)
		time.Sleep(10 * time.Millisecond)
	}
	sh := func(args ...string) {
		t.Helper()
		out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
		require.NoError(t, err, "%s: %s", strings.Join(args, " "), out)
	}
	sh("ip", "link", "set", "dev", b, "netns", pid)
	in := []string{"nsenter", "-t", pid, "-n"}
	sh(append(in, "ip", "addr", "add", fwdIPB+"/24", "dev", b)...)
	sh(append(in, "ip", "link", "set", "dev", b, "up")...)
	t.Logf("Linux %s (%s, %s) <-> vfnic fwd %s %s <-> Linux %s (%s, %s, namespace of pid %s)",
		fwdLinuxA, a, fwdIPA, fwdPortX, fwdPortY, fwdLinuxB, b, fwdIPB, pid)

	fwd := startVfnic(t, "fwd", "-forward", "io", "-progress", "0", fwdPortX, fwdPortY)
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(fwd.output(), "fwd: io forwarding between "+fwdPortX+" and "+fwdPortY); {
		require.True(t, time.Now().Before(deadline), "fwd did not start:\n%s", fwd.output())
		time.Sleep(50 * time.Millisecond)
	}

	// The first pings also resolve each side's MAC through vfnic.
	out, err := exec.Command("ping", "-c", "5", "-W", "10", fwdIPB).CombinedOutput()
	t.Logf("ping %s:\n%s", fwdIPB, out)
	require.NoError(t, err, "ping across fwd")
	require.Regexp(t, `5 packets transmitted, 5 packets received`, string(out))

	ln := listenInNetns(t, pid, "tcp4", net.JoinHostPort(fwdIPB, "5001"))
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	errs := make(chan error, fwdConns)
	for range fwdConns {
		go func() { errs <- echoAcross(net.JoinHostPort(fwdIPB, "5001"), fwdTCPSize/fwdConns) }()
	}
	for range fwdConns {
		require.NoError(t, <-errs, "TCP echo across fwd")
	}

	require.NoError(t, fwd.cmd.Process.Signal(syscall.SIGINT))
	err, ended := fwd.wait(20 * time.Second)
	require.True(t, ended, "fwd still running:\n%s", fwd.output())
	require.NoError(t, err, fwd.output())
	t.Log(fwd.output())
	// Each direction carried the 2 MiB: at least one frame per 1448 bytes
	// (a full TCP segment) into Y from B and out of Y towards B.
	m := regexp.MustCompile(`fwd: ` + regexp.QuoteMeta(fwdPortY) + ` rx (\d+) frames, tx (\d+) frames`).FindStringSubmatch(fwd.output())
	require.NotNil(t, m, "fwd's summary for %s", fwdPortY)
	for i, dir := range []string{"from B", "towards B"} {
		n, _ := strconv.Atoi(m[1+i])
		require.GreaterOrEqual(t, n, fwdTCPSize/1448, "frames %s", dir)
	}
}

// echoAcross sends n random bytes through a TCP connection to an echo
// server at addr and checks that the same bytes come back.
func echoAcross(addr string, n int) error {
	c, err := net.DialTimeout("tcp4", addr, 20*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(90 * time.Second)); err != nil {
		return err
	}
	sent := make([]byte, n)
	_, _ = rand.Read(sent)
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(sent)
		if err == nil {
			err = c.(*net.TCPConn).CloseWrite()
		}
		werr <- err
	}()
	got, err := io.ReadAll(c)
	if err := errors.Join(err, <-werr); err != nil {
		return err
	}
	if !bytes.Equal(sent, got) {
		return fmt.Errorf("%s: %d bytes echoed of %d sent, not the same bytes", c.LocalAddr(), len(got), n)
	}
	return nil
}

// linuxIfname is the kernel's interface name for the NIC at PCI address addr.
func linuxIfname(t *testing.T, addr string) string {
	t.Helper()
	dir := "/sys/bus/pci/devices/" + addr
	m, err := filepath.Glob(dir + "/net/*")
	require.NoError(t, err)
	if len(m) == 0 { // virtio-net's interface hangs off its virtio device
		m, err = filepath.Glob(dir + "/virtio*/net/*")
		require.NoError(t, err)
	}
	require.Len(t, m, 1, "%s has one network interface of the kernel's", addr)
	return filepath.Base(m[0])
}

// listenInNetns listens in the network namespace of process pid; the
// socket keeps the namespace it was made in.
func listenInNetns(t *testing.T, pid, network, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	err := netns.Do("/proc/"+pid+"/ns/net", func() (err error) {
		ln, err = net.Listen(network, addr)
		return err
	})
	require.NoError(t, err, "listen in the namespace of %s", pid)
	return ln
}
