package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"

	"github.com/vfnic/vfnic/internal/vethtest"
)

// cliIn runs the command line in network namespace ns, as 'ip netns exec
// ns vfnic ARGS' would.
func cliIn(t *testing.T, ns string, args ...string) (int, string, string) {
	t.Helper()
	var code int
	var out, errw bytes.Buffer
	require.NoError(t, vethtest.In(ns, func() error {
		code = run(args, &out, &errw)
		return nil
	}))
	return code, out.String(), errw.String()
}

// TestHostDevices: the vfnic commands, unchanged, on host interfaces of a
// veth pair between two network namespaces the test makes (vfnic on vfx0
// in A, Linux on vfx1 in B; no interface of the machine is touched), one
// pair for every check: refusals of bad names (usage, exit 2, before
// anything opens) and of a missing interface (exit 1); info on afxdp:
// (text and -json); list's host section and doctor's; echo on afxdp:
// answering Linux's ICMP echo and UDP from B, with list showing the XDP
// program echo attached meanwhile; pktgen on afpacket: counted by a Linux
// socket in B.
func TestHostDevices(t *testing.T) {
	v := vethtest.New(t, 1)
	vethtest.IP(t, "-n", v.B, "addr", "add", "10.0.0.2/24", "dev", "vfx1")
	var macA net.HardwareAddr
	require.NoError(t, vethtest.In(v.A, func() error {
		ifc, err := net.InterfaceByName("vfx0")
		if err == nil {
			macA = ifc.HardwareAddr
		}
		return err
	}))

	t.Run("refusals", func(t *testing.T) {
		for _, tc := range []struct {
			args []string
			code int
			want string
		}{
			{[]string{"info", "afxdp:"}, exitUsage, `interface name ""`},
			{[]string{"info", "afxdp:vfx0@x"}, exitUsage, `queue "x"`},
			{[]string{"info", "afpacket:vfx0@1"}, exitUsage, `want afpacket:IFNAME`},
			{[]string{"echo", "-ip", "10.0.0.1", "afxdp:a/b"}, exitUsage, `want afxdp:IFNAME`},
			{[]string{"pktgen", "-count", "1", "afpacket:"}, exitUsage, `want afpacket:IFNAME`},
			{[]string{"fwd", "afxdp:vfx0", "afxdp:vfx0"}, exitUsage, "afxdp:vfx0 twice"},
			{[]string{"capture", "afxdp:", "udp"}, exitUsage, "comes first"},
			{[]string{"probe", "afxdp:@1"}, exitUsage, `usage: afxdp: interface name "@1"`},
			{[]string{"info", "afudp:vfx0"}, exitUsage, "a host interface is named afxdp:IF, afxdp:IF@QUEUE or afpacket:IF"},
			{[]string{"info", "afxdp:nosuch0"}, exitFailure, "afxdp: no such network interface"},
			{[]string{"info", "afpacket:nosuch0"}, exitFailure, "afpacket: no such network interface"},
			{[]string{"sink", "-duration", "1s", "afxdp:nosuch0@2"}, exitFailure, "afxdp: no such network interface"},
		} {
			code, out, errw := cliIn(t, v.A, tc.args...)
			require.Equal(t, tc.code, code, "%v: %s%s", tc.args, out, errw)
			require.Contains(t, errw, tc.want, "%v", tc.args)
		}
	})

	t.Run("help", func(t *testing.T) {
		for _, cmd := range []string{"echo", "pktgen", "capture", "sink", "fwd", "probe", "info"} {
			code, out, errw := runCLI("help", cmd)
			require.Equal(t, exitOK, code, errw)
			require.Contains(t, out, "afxdp:IF@Q     queue Q (and up) of IF", cmd)
			require.Contains(t, out, "-force detaches an XDP program someone else attached", cmd)
			require.Contains(t, out, "softnic: pair has\nno peer in one vfnic process", cmd)
		}
	})

	t.Run("info", func(t *testing.T) {
		code, out, errw := cliIn(t, v.A, "info", "afxdp:vfx0")
		require.Equal(t, exitOK, code, errw)
		require.Contains(t, out, "afxdp:vfx0: ")
		require.Contains(t, out, "(afxdp driver)")
		require.Contains(t, out, macA.String())
		require.Contains(t, out, "host interface: the kernel keeps it")
		require.Regexp(t, `features +.*\bcopy\b`, out, "veth binds in copy mode")

		code, out, errw = cliIn(t, v.A, "info", "-json", "afpacket:vfx0")
		require.Equal(t, exitOK, code, errw)
		var in infoOutput
		require.NoError(t, json.Unmarshal([]byte(out), &in), out)
		require.Equal(t, "afpacket:vfx0", in.Address)
		require.Equal(t, "afpacket", in.Driver)
		require.Equal(t, macA.String(), in.MAC)
		require.Equal(t, 1, in.QueuePairs)
		require.True(t, in.Link.Up, "%+v", in.Link)

		code, out, errw = cliIn(t, v.A, "probe", "-json", "afxdp:vfx0")
		require.Equal(t, exitOK, code, errw)
		var r probeReport
		require.NoError(t, json.Unmarshal([]byte(out), &r), out)
		require.Equal(t, "afxdp", r.Driver)
		require.NotNil(t, r.Host)
		require.Equal(t, macA.String(), r.Host.MAC)
	})

	t.Run("doctor", func(t *testing.T) {
		// VFIO's checks fail on a host without an IOMMU (exit 1); the host
		// section is there either way.
		_, out, errw := cliIn(t, v.A, "doctor")
		require.Regexp(t, `(?m)^OK +host afxdp +kernel .*AF_XDP sockets and the bpf syscall work`, out, errw)
		require.Regexp(t, `(?m)^OK +host afpacket +kernel .*AF_PACKET sockets work`, out, errw)
		_, out, errw = cliIn(t, v.A, "doctor", "-json")
		var d struct {
			Host []hostCheck `json:"host"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &d), out+errw)
		require.Equal(t, []string{"afxdp", "afpacket"}, []string{d.Host[0].Driver, d.Host[1].Driver})
		require.True(t, d.Host[0].Works && d.Host[1].Works, "as root: %+v", d.Host)
	})

	// list's host section, before echo, while it runs, and after it.
	listHost := func(t *testing.T) hostIface {
		t.Helper()
		code, out, errw := cliIn(t, v.A, "list", "-json")
		require.Equal(t, exitOK, code, errw)
		var lo listOutput
		require.NoError(t, json.Unmarshal([]byte(out), &lo), out)
		require.Len(t, lo.Host, 1, "namespace A has vfx0 only: %+v", lo.Host)
		return lo.Host[0]
	}
	t.Run("list", func(t *testing.T) {
		h := listHost(t)
		require.Equal(t, hostIface{Name: "vfx0", Driver: "veth", MAC: macA.String(), Up: true,
			Names: []string{"afpacket:vfx0", "afxdp:vfx0"}}, h)
		code, out, errw := cliIn(t, v.A, "list")
		require.Equal(t, exitOK, code, errw)
		require.Regexp(t, `(?m)^HOST INTERFACE +DRIVER +MAC +STATE +XDP +OPEN AS$`, out)
		require.Regexp(t, `(?m)^vfx0 +veth +`+macA.String()+` +up +- +afpacket:vfx0 afxdp:vfx0$`, out)
		require.Contains(t, errw, "host interfaces: vfnic drives them through AF_XDP or AF_PACKET")
	})

	t.Run("echo-afxdp", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		var echoOut, echoErr syncBuffer
		echoDone := make(chan error, 1)
		echoCtx, stopEcho := context.WithCancel(ctx)
		defer stopEcho()
		go func() {
			echoDone <- vethtest.In(v.A, func() error {
				return runEcho(echoCtx, []string{"-ip", "10.0.0.1", "-json", "-progress", "0", "afxdp:vfx0"},
					stdio{out: &echoOut, err: &echoErr})
			})
		}()
		ready := regexp.MustCompile(`for 10\.0\.0\.1 at ([0-9a-f:]{17}), .*\(ready\)`)
		for !ready.MatchString(echoErr.String()) {
			select {
			case err := <-echoDone:
				t.Fatalf("echo ended: %v\n%s", err, echoErr.String())
			case <-ctx.Done():
				t.Fatalf("echo not ready: %s", echoErr.String())
			case <-time.After(10 * time.Millisecond):
			}
		}
		require.NotEmpty(t, listHost(t).XDP, "list shows the XDP program echo attached")

		const pings, datagrams = 3, 5
		require.NoError(t, vethtest.In(v.B, func() error { return pingFrom("10.0.0.1", pings) }))
		require.NoError(t, vethtest.In(v.B, func() error { return udpEchoFrom("10.0.0.1:7", datagrams) }))
		stopEcho()
		require.NoError(t, <-echoDone, echoErr.String())
		var s trafficSummary
		require.NoError(t, json.Unmarshal(echoOut.b.Bytes(), &s), echoOut.String())
		t.Logf("echo: rx %+v tx %+v %v", s.Rx, s.Tx, s.Details)
		require.Equal(t, "afxdp", s.Device.Driver)
		require.Equal(t, "afxdp:vfx0", s.Device.Address)
		require.EqualValues(t, pings, s.Details["answered_icmp"])
		require.EqualValues(t, datagrams, s.Details["answered_udp"])
		require.Empty(t, listHost(t).XDP, "echo's XDP program is gone after it")
	})

	t.Run("foreign-xdp", func(t *testing.T) {
		// Someone else's program, held by its bpf_link: refused, with and
		// without -force, and left in place; list marks it.
		pass, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "foreign_pass", Type: ebpf.XDP, License: "Dual MIT/GPL",
			Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2), asm.Return()}}) // XDP_PASS
		require.NoError(t, err)
		defer pass.Close()
		var l link.Link
		require.NoError(t, vethtest.In(v.A, func() (err error) {
			ifc, err := net.InterfaceByName("vfx0")
			if err != nil {
				return err
			}
			l, err = link.AttachXDP(link.XDPOptions{Program: pass, Interface: ifc.Index})
			return err
		}))
		defer l.Close()
		code, out, errw := cliIn(t, v.A, "info", "afxdp:vfx0")
		require.Equal(t, exitFailure, code, out)
		require.Contains(t, errw, "another XDP program is attached")
		require.Contains(t, errw, "vfnic: -force detaches a program attached through netlink")
		code, out, errw = cliIn(t, v.A, "echo", "-ip", "10.0.0.1", "-force", "afxdp:vfx0")
		require.Equal(t, exitFailure, code, out)
		require.Contains(t, errw, "vfnic: -force could not detach it: a program held by another process's bpf_link")
		require.NotEmpty(t, listHost(t).XDP, "still attached")
		code, out, errw = cliIn(t, v.A, "list")
		require.Equal(t, exitOK, code, errw)
		require.Regexp(t, `(?m)^vfx0 +veth +\S+ +up +\w+ \*XDP\* +afpacket:vfx0 afxdp:vfx0$`, out)
		require.Contains(t, errw, "*XDP*: someone else's XDP program is attached; afxdp: refuses the interface without -force")
		code, _, errw = cliIn(t, v.A, "info", "afpacket:vfx0")
		require.Equal(t, exitOK, code, "afpacket works beside an XDP program: %s", errw)
		require.NoError(t, l.Close())
		require.Empty(t, listHost(t).XDP)
	})

	// capture on afxdp: and sink on afpacket: count what a Linux
	// AF_PACKET socket in B sends once they are ready.
	for _, tc := range []struct {
		name  string
		args  []string
		ready string
	}{
		{"capture-afxdp", []string{"capture", "-c", "20", "afxdp:vfx0", "ether", "proto", "0x88b5"}, "capture: writing frames"},
		{"sink-afpacket", []string{"sink", "-count", "20", "-json", "-progress", "0", "afpacket:vfx0"}, "sink: receiving"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const frames = 20
			var out, errw syncBuffer
			done := make(chan int, 1)
			go func() {
				_ = vethtest.In(v.A, func() error {
					done <- run(tc.args, &out, &errw)
					return nil
				})
			}()
			deadline := time.Now().Add(10 * time.Second)
			for !strings.Contains(errw.String()+out.String(), tc.ready) {
				require.True(t, time.Now().Before(deadline), "not ready: %s", errw.String())
				time.Sleep(10 * time.Millisecond)
			}
			require.NoError(t, vethtest.In(v.B, func() error {
				p, err := vethtest.NewPeer("vfx1")
				if err != nil {
					return err
				}
				defer p.Close()
				b := make([]byte, 1514)
				for seq := range uint64(frames) {
					if err := p.Send(vethtest.MakeFrame(b, macA, p.MAC, seq)); err != nil {
						return err
					}
				}
				return nil
			}))
			select {
			case code := <-done:
				require.Equal(t, exitOK, code, errw.String())
			case <-time.After(10 * time.Second):
				t.Fatalf("%s did not stop after %d frames: %s", tc.name, frames, errw.String())
			}
			if tc.name == "capture-afxdp" {
				lines := strings.Split(strings.TrimSpace(out.String()), "\n")
				require.Len(t, lines, frames, out.String())
				require.Contains(t, lines[0], "> "+macA.String()+", ethertype 0x88b5, length 60", "one line per frame, as tcpdump -n")
				return
			}
			var sum trafficSummary
			require.NoError(t, json.Unmarshal([]byte(out.String()), &sum), out.String())
			require.Equal(t, "afpacket", sum.Device.Driver)
			require.Equal(t, uint64(frames), sum.Rx.Frames)
		})
	}

	t.Run("pktgen-afpacket", func(t *testing.T) {
		const frames = 1000
		var macB net.HardwareAddr
		counted := make(chan int, 1)
		started := make(chan error, 1)
		go func() {
			_ = vethtest.In(v.B, func() error {
				p, err := vethtest.NewPeer("vfx1")
				if err != nil {
					started <- err
					return err
				}
				defer p.Close()
				macB = p.MAC
				started <- nil
				counted <- countUDP(p, macB, 9, frames)
				return nil
			})
		}()
		require.NoError(t, <-started)
		code, out, errw := cliIn(t, v.A, "pktgen", "-count", fmt.Sprint(frames), "-rate", "50000", "-dst-mac", macB.String(),
			"-src-ip", "10.0.0.1", "-dst-ip", "10.0.0.2", "-port", "9", "-json", "-progress", "0", "afpacket:vfx0")
		require.Equal(t, exitOK, code, errw)
		var s trafficSummary
		require.NoError(t, json.Unmarshal([]byte(out), &s), out)
		require.Equal(t, "afpacket", s.Device.Driver)
		require.Equal(t, uint64(frames), s.Tx.Frames)
		require.Equal(t, frames, <-counted, "the Linux socket on vfx1 received each frame pktgen sent")
	})
}

// pingFrom sends n ICMP echo requests to ip from a raw socket of the
// calling thread's namespace (as ping does) and checks each reply.
func pingFrom(ip string, n int) error {
	c, err := icmp.ListenPacket("ip4:icmp", "0.0.0.0")
	if err != nil {
		return err
	}
	defer c.Close()
	dst := &net.IPAddr{IP: net.ParseIP(ip)}
	buf := make([]byte, 1500)
	for seq := 1; seq <= n; seq++ {
		body := &icmp.Echo{ID: 0x7f7f, Seq: seq, Data: []byte(fmt.Sprintf("vfnic ping %d", seq))}
		req, err := (&icmp.Message{Type: ipv4.ICMPTypeEcho, Body: body}).Marshal(nil)
		if err != nil {
			return err
		}
		if _, err := c.WriteTo(req, dst); err != nil {
			return err
		}
		for {
			_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
			k, from, err := c.ReadFrom(buf)
			if err != nil {
				return fmt.Errorf("ping %d: %w", seq, err)
			}
			m, err := icmp.ParseMessage(1, buf[:k])
			if err != nil || m.Type != ipv4.ICMPTypeEchoReply || from.String() != ip {
				continue // our own request, or another host's traffic
			}
			e, ok := m.Body.(*icmp.Echo)
			if !ok || e.ID != body.ID || e.Seq != seq || !bytes.Equal(e.Data, body.Data) {
				return fmt.Errorf("ping %d: reply %+v", seq, m.Body)
			}
			break
		}
	}
	return nil
}

// udpEchoFrom sends n datagrams to addr from the calling thread's
// namespace and checks that each comes back intact.
func udpEchoFrom(addr string, n int) error {
	c, err := net.Dial("udp4", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	buf := make([]byte, 2048)
	for i := range n {
		msg := []byte(strings.Repeat(fmt.Sprintf("datagram %d ", i), 20))
		if _, err := c.Write(msg); err != nil {
			return err
		}
		_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
		k, err := c.Read(buf)
		if err != nil {
			return fmt.Errorf("datagram %d: %w", i, err)
		}
		if !bytes.Equal(buf[:k], msg) {
			return fmt.Errorf("datagram %d: echoed %q", i, buf[:k])
		}
	}
	return nil
}

// countUDP counts the IPv4 UDP frames to mac and port that p receives
// until want have come or none came for a second.
func countUDP(p *vethtest.Peer, mac net.HardwareAddr, port uint16, want int) int {
	buf := make([]byte, 2048)
	got := 0
	for got < want {
		n, err := p.Recv(buf)
		if err != nil || n == 0 {
			return got
		}
		f := buf[:n]
		if n < 42 || !bytes.Equal(f[:6], mac) || binary.BigEndian.Uint16(f[12:]) != 0x0800 || f[23] != 17 {
			continue
		}
		ihl := int(f[14]&0xf) * 4
		if 14+ihl+4 <= n && binary.BigEndian.Uint16(f[14+ihl+2:]) == port {
			got++
		}
	}
	return got
}
