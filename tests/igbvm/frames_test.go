package igbvm

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gopacket/gopacket/pcapgo"
	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/nic/igb"
	"golang.org/x/sys/unix"
)

// linuxNIC is the guest's Linux igb on hub 1 (slot 8) with a raw
// AF_PACKET socket bound to it.
type linuxNIC struct {
	name string
	mac  net.HardwareAddr
	idx  int
	fd   int
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// openLinuxNIC finds the Linux igb's interface, sets its MTU (restored at
// cleanup) and opens a raw socket on it.
func openLinuxNIC(t *testing.T, mtu int) *linuxNIC {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/sys/bus/pci/devices/%s/net", addrOf(slotLinux)))
	require.NoError(t, err, "the Linux igb's interface")
	require.Len(t, ents, 1)
	ifc, err := net.InterfaceByName(ents[0].Name())
	require.NoError(t, err)
	l := &linuxNIC{name: ifc.Name, mac: ifc.HardwareAddr, idx: ifc.Index}
	if ifc.MTU != mtu {
		out, err := exec.Command("ip", "link", "set", "dev", l.name, "mtu", fmt.Sprint(mtu)).CombinedOutput()
		require.NoError(t, err, "ip link set mtu %d: %s", mtu, out)
		t.Cleanup(func() { _ = exec.Command("ip", "link", "set", "dev", l.name, "mtu", fmt.Sprint(ifc.MTU)).Run() })
	}
	// igb resets the device for a new MTU: wait for its link.
	for i := 0; ; i++ {
		st, _ := os.ReadFile("/sys/class/net/" + l.name + "/operstate")
		if strings.TrimSpace(string(st)) == "up" {
			break
		}
		require.Less(t, i, 100, "%s not up after 10 s", l.name)
		time.Sleep(100 * time.Millisecond)
	}
	l.fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(htons(unix.ETH_P_ALL)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = unix.Close(l.fd) })
	require.NoError(t, unix.Bind(l.fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: l.idx}))
	require.NoError(t, unix.SetsockoptTimeval(l.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 100000}))
	return l
}

func (l *linuxNIC) send(t *testing.T, f []byte) {
	t.Helper()
	require.NoError(t, unix.Sendto(l.fd, f, 0, &unix.SockaddrLinklayer{Ifindex: l.idx, Halen: 6}), "raw send of %d bytes", len(f))
}

// recv returns the next frame the socket took in whose bytes [off:off+4]
// are "IGBV", or nil when none came by the deadline.
func (l *linuxNIC) recv(t *testing.T, deadline time.Time, off int) []byte {
	buf := make([]byte, 4096)
	for time.Now().Before(deadline) {
		n, from, err := unix.Recvfrom(l.fd, buf, 0)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue
		}
		require.NoError(t, err)
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
			continue // our own sends
		}
		if n >= off+4 && string(buf[off:off+4]) == "IGBV" {
			return append([]byte(nil), buf[:n]...)
		}
	}
	return nil
}

// qinq is a size-byte frame with two VLAN tags, outer EtherType outer
// (0x8100, or 802.1ad's 0x88a8) with TCI 100 and inner 802.1Q with TCI
// 200, and the test header after them (type msgData, arg id).
func qinq(dst, src net.HardwareAddr, outer uint16, session, id uint32, size int) []byte {
	inner := make([]byte, size-8)
	fill(inner, dst, src, msgData, session, id)
	f := append([]byte(nil), inner[:12]...)
	f = binary.BigEndian.AppendUint16(f, outer)
	f = binary.BigEndian.AppendUint16(f, 100)
	f = binary.BigEndian.AppendUint16(f, 0x8100)
	f = binary.BigEndian.AppendUint16(f, 200)
	return append(f, inner[12:]...)
}

// TestGuestFullSizeFrames sends 1522-byte double-tagged frames (outer
// 802.1Q and outer 802.1ad) from the guest's Linux igb through a raw
// socket (MTU 1508, so AF_PACKET takes 1522 bytes whatever the tags) to a vfnic igb, which
// must receive them with the default Config, with VLAN stripping (the
// outer 802.1Q tag then in the offload, 1518 bytes left), and through
// `vfnic capture`; then has the vfnic igb send 1518- and 1522-byte frames
// (MTU + nic.FrameOverhead), which the Linux NIC must receive intact.
func TestGuestFullSizeFrames(t *testing.T) {
	guestOnly(t)
	lx := openLinuxNIC(t, 1508)
	session := uint32(time.Now().UnixNano())&0x7fffffff | 1
	addr := addrOf(slotEcho)
	var vfnicMAC net.HardwareAddr

	// frames are the double-tagged frames Linux sends, by id.
	frames := func(dst net.HardwareAddr) map[uint32][]byte {
		return map[uint32][]byte{
			1: qinq(dst, lx.mac, 0x8100, session, 1, 1522),
			2: qinq(dst, lx.mac, 0x88a8, session, 2, 1522),
		}
	}
	for _, strip := range []bool{false, true} {
		t.Run(fmt.Sprintf("receive/strip=%v", strip), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			dev, err := igb.Open(ctx, addr, igb.Config{VLANStrip: strip})
			require.NoError(t, err)
			defer func() { require.NoError(t, dev.Close()) }()
			vfnicMAC = dev.MAC()
			rx, err := dev.RxQueue(0)
			require.NoError(t, err)
			for rx.PostRecv(nil) == nil {
			}
			require.NoError(t, rx.Flush())
			want := frames(vfnicMAC)
			got := map[uint32]bool{}
			comps := make([]nic.Completion, 32)
			for try := 0; try < 10 && len(got) < len(want); try++ {
				for id, f := range want {
					if !got[id] {
						lx.send(t, f)
					}
				}
				deadline := time.Now().Add(500 * time.Millisecond)
				for len(got) < len(want) && time.Now().Before(deadline) {
					n, err := rx.SRead(context.Background(), comps, 1, time.Until(deadline))
					if errors.Is(err, nic.ErrTimeout) {
						break
					}
					require.NoError(t, err)
					for _, c := range comps[:n] {
						require.NoError(t, c.Err)
						f := c.Data
						o, err := rx.Offload(c.Buf)
						require.NoError(t, err)
						for id, wf := range want {
							outer := binary.BigEndian.Uint16(wf[12:])
							switch {
							case bytes.Equal(f, wf):
								require.False(t, o.VLANStripped, "frame %d arrived whole: nothing stripped", id)
								require.False(t, strip && outer == 0x8100, "strip=%v: frame %d kept its 802.1Q outer tag", strip, id)
								t.Logf("strip=%v: frame %d (outer %#x) arrived whole, %d bytes", strip, id, outer, len(f))
								got[id] = true
							case bytes.Equal(f, append(append([]byte(nil), wf[:12]...), wf[16:]...)):
								require.True(t, strip, "a tag removed without stripping")
								require.True(t, o.VLANStripped)
								require.Equal(t, uint16(100), o.VLAN, "the outer TCI")
								t.Logf("strip=%v: frame %d (outer %#x) arrived with its outer tag stripped (TCI %d), %d bytes", strip, id, outer, o.VLAN, len(f))
								got[id] = true
							}
						}
						require.NoError(t, rx.Repost(c.Buf, nil))
					}
					require.NoError(t, rx.Flush())
				}
			}
			require.Len(t, got, len(want), "strip=%v: the 1522-byte double-tagged frames arrived (got %v)", strip, got)
		})
	}

	t.Run("capture", func(t *testing.T) {
		require.NotNil(t, vfnicMAC, "the receive subtests ran")
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		pcap := filepath.Join(t.TempDir(), "qinq.pcap")
		out := newLockedBuffer()
		cmd := exec.CommandContext(ctx, vfnicBin, "capture", "-w", pcap, "-duration", "40s", addr)
		cmd.Stdout, cmd.Stderr = out, out
		require.NoError(t, cmd.Start())
		stopped := false
		defer func() { // when the test fails before it stops capture
			if !stopped {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
			}
		}()
		for i := 0; !strings.Contains(out.String(), "capture: writing"); i++ {
			require.Less(t, i, 300, "vfnic capture did not start:\n%s", out.String())
			time.Sleep(100 * time.Millisecond)
		}
		want := frames(vfnicMAC)
		for try := 0; try < 5; try++ {
			for _, f := range want {
				lx.send(t, f)
			}
			time.Sleep(300 * time.Millisecond)
		}
		require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
		err := cmd.Wait()
		stopped = true
		t.Logf("vfnic capture (%v):\n%s", err, out.String())
		f, err := os.Open(pcap)
		require.NoError(t, err)
		defer f.Close()
		pr, err := pcapgo.NewReader(f)
		require.NoError(t, err)
		next := func() ([]byte, error) { b, _, err := pr.ReadPacketData(); return b, err }
		got := map[uint32]int{}
		for {
			b, err := next()
			if err == io.EOF {
				break
			}
			require.NoError(t, err)
			for id, wf := range want {
				if bytes.Equal(b, wf) {
					got[id]++
				}
			}
		}
		t.Logf("capture: the 1522-byte double-tagged frames in the pcap, by id: %v (each sent 5 times)", got)
		require.Len(t, got, len(want), "capture wrote both frames")
	})

	t.Run("send", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		dev, err := igb.Open(ctx, addr, igb.Config{})
		require.NoError(t, err)
		defer func() { require.NoError(t, dev.Close()) }()
		tx, err := dev.TxQueue(0)
		require.NoError(t, err)
		require.Equal(t, dev.Info().MTU+nic.FrameOverhead, tx.MaxFrame(), "transmit takes MTU + FrameOverhead, as nic.Info says")
		comps := make([]nic.Completion, 8)
		for _, size := range []int{1518, 1522} {
			f := build(lx.mac, dev.MAC(), msgData, session, uint32(size), size)
			got := false
			for try := 0; try < 10 && !got; try++ {
				require.NoError(t, tx.Send(f, size), "Send of %d bytes", size)
				require.NoError(t, tx.Flush())
				deadline := time.Now().Add(time.Second)
				for !got {
					b := lx.recv(t, deadline, 14)
					if b == nil {
						break
					}
					got = bytes.Equal(b, f)
				}
				for tx.Outstanding() > 0 {
					n, err := tx.SRead(context.Background(), comps, 1, 5*time.Second)
					require.NoError(t, err)
					for _, c := range comps[:n] {
						require.NoError(t, c.Err)
						require.Equal(t, size, c.Len)
					}
				}
			}
			t.Logf("send: a %d-byte frame from vfnic arrived intact at the Linux NIC: %v", size, got)
			require.True(t, got, "the %d-byte frame arrived intact", size)
		}
	})
}
