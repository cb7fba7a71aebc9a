package qemu

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vfnic/vfnic/internal/vethtest"
)

func TestTapNICArgs(t *testing.T) {
	nics, err := ParseNICs("virtio,net=tap:w0 e1000e,net=hub:1 virtio,bind=linux,ip=10.0.0.2/24,net=tap:w0 igb,net=tap:other")
	require.NoError(t, err)
	require.Equal(t, Tap("w0"), nics[0].Net)
	require.Equal(t, "virtio-net-pci,packed=off,net=tap:w0;e1000e,net=hub:1;virtio-net-pci,packed=off,bind=linux,ip=10.0.0.2/24,net=tap:w0;igb,net=tap:other",
		FormatNICs(nics))
	resolved, err := ResolveNICs(nics)
	require.NoError(t, err)
	require.Equal(t, 3, assignTapFDs(resolved), "tap NICs")
	var got []string
	for i, n := range resolved {
		got = append(got, strings.Join(n.qemuArgs(i), " "))
	}
	require.Equal(t, []string{
		"-netdev tap,id=n0,fd=3 -device virtio-net-pci,id=nic0,bus=pcie.0,addr=0x04,mac=52:54:00:12:34:04,netdev=n0,disable-legacy=on,iommu_platform=on,packed=off,ats=on",
		"-netdev hubport,id=n1,hubid=1 -device e1000e,id=nic1,bus=pcie.0,addr=0x05,mac=52:54:00:12:34:05,netdev=n1",
		"-netdev tap,id=n2,fd=4 -device virtio-net-pci,id=nic2,bus=pcie.0,addr=0x06,mac=52:54:00:12:34:06,netdev=n2,disable-legacy=on,iommu_platform=on,packed=off,ats=on",
		"-netdev tap,id=n3,fd=5 -device igb,id=nic3,bus=pcie.0,addr=0x07,mac=52:54:00:12:34:07,netdev=n3",
	}, got)
}

// needTapRoot skips a test that makes tap wires without root, the ip
// command and /dev/net/tun, or fails it under CI=true.
func needTapRoot(t *testing.T) {
	t.Helper()
	vethtest.NeedRootAnd(t, "tap wire test", "/dev/net/tun")
}

// TestTapWires makes the wires of three tap NICs (two on one wire, one
// alone) the way Run does, without a guest: the namespace holds a bridge
// per wire with the taps on it, a frame written with its virtio-net
// header into one tap of a wire comes out of the other with its header,
// nothing reaches the lone wire, the machine's namespace has none of the
// devices, and Close removes the namespace. A namespace named for a
// process that is gone is removed when the next wires are made.
func TestTapWires(t *testing.T) {
	needTapRoot(t)
	stale := TapNamespacePrefix + "999999999-1" // no such PID
	require.NoError(t, ipCmd("netns", "add", stale))
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", stale).Run() })

	nics, err := ResolveNICs([]NIC{{Model: VirtioNet, Net: Tap("a")}, {Model: VirtioNet, Net: Hub(0)},
		{Model: VirtioNet, Net: Tap("a")}, {Model: VirtioNet, Net: Tap("b")}})
	require.NoError(t, err)
	require.Equal(t, 3, assignTapFDs(nics))
	w, err := openTapWires(nics)
	require.NoError(t, err)
	ns := w.ns
	defer w.Close()
	_, err = os.Stat("/run/netns/" + stale)
	require.ErrorIs(t, err, os.ErrNotExist, "the stale namespace was removed")
	require.Len(t, w.files, 3)

	out, err := exec.Command("ip", "-n", ns, "-o", "link", "show", "master", "br-a").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "vt0")
	require.Contains(t, string(out), "vt2")
	out, err = exec.Command("ip", "-n", ns, "-o", "link", "show", "master", "br-b").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "vt3")
	out, err = exec.Command("ip", "-o", "link", "show").CombinedOutput()
	require.NoError(t, err)
	require.NotContains(t, string(out), "br-a", "the machine's namespace has no wire")

	// A broadcast frame with a zero virtio-net header (12 bytes: QEMU
	// sets the header size on its fd; this one is the kernel's default
	// of 10 until then).
	hdr := make([]byte, 10)
	frame := append(bytes.Repeat([]byte{0xff}, 6), 0x02, 0, 0, 0, 0, 1, 0x88, 0xb5)
	frame = append(frame, []byte("vfnic tap wire test")...)
	for len(frame) < 60 {
		frame = append(frame, 0)
	}
	_, err = w.files[0].Write(append(hdr, frame...))
	require.NoError(t, err)
	got := readTap(t, w.files[1], 2*time.Second, frame[12:14])
	require.NotNil(t, got, "the frame crossed wire a")
	require.Equal(t, frame, got[len(hdr):], "frame after its header")
	require.Nil(t, readTap(t, w.files[2], 300*time.Millisecond, frame[12:14]), "nothing on wire b")

	require.NoError(t, w.Close())
	_, err = os.Stat("/run/netns/" + ns)
	require.ErrorIs(t, err, os.ErrNotExist, "Close removed the namespace")
}

// readTap reads frames from a tap until one of EtherType et arrives
// (the kernel may send others) or the timeout passes (nil).
func readTap(t *testing.T, f *os.File, timeout time.Duration, et []byte) []byte {
	t.Helper()
	fd := int(f.Fd())
	require.NoError(t, unix.SetNonblock(fd, true))
	deadline := time.Now().Add(timeout)
	buf := make([]byte, 2048)
	for time.Now().Before(deadline) {
		n, err := unix.Read(fd, buf)
		if err == unix.EAGAIN {
			time.Sleep(5 * time.Millisecond)
			continue
		}
		require.NoError(t, err)
		if n >= 10+14 && bytes.Equal(buf[10+12:10+14], et) {
			return append([]byte(nil), buf[:n]...)
		}
	}
	return nil
}
