package netstack

import (
	"io"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"

	"github.com/vfnic/vfnic/nic/softnic"
)

// TestGSO: with Config.GSO the stack's routes out of the NIC have
// gVisor's software GSO, so TCP builds segments larger than the MSS;
// without it (the default) they do not. Either way 8 MiB echoed over IPv4 and
// IPv6 arrive intact, with one frame in 100 dropped by both ends so that
// large segments are retransmitted in part, and no frame longer than the
// MTU reaches the device (the software wire would refuse it: every frame
// posted was sent).
func TestGSO(t *testing.T) {
	for _, gso := range []bool{true, false} {
		t.Run(map[bool]string{true: "on", false: "off"}[gso], func(t *testing.T) {
			cfg := func(c *Config) { c.GSO, c.DropEvery = gso, 100 }
			p := newPairWith(t, cfg, cfg)
			for _, n := range []*Net{p.a, p.b} {
				require.Equal(t, gso, n.Offloads().GSO, "Offloads().GSO")
			}
			for _, r := range []struct {
				local, remote tcpip.Address
				proto         tcpip.NetworkProtocolNumber
			}{
				{tcpip.AddrFrom4(addrA4.Addr().As4()), tcpip.AddrFrom4(addrB4.Addr().As4()), ipv4.ProtocolNumber},
				{tcpip.AddrFrom16(addrA6.Addr().As16()), tcpip.AddrFrom16(addrB6.Addr().As16()), ipv6.ProtocolNumber},
			} {
				route, terr := p.a.Stack().FindRoute(nicID, r.local, r.remote, r.proto, false)
				require.Nil(t, terr)
				require.Equal(t, gso, route.HasGVisorGSOCapability(), "route %v -> %v has software GSO", r.local, r.remote)
				require.False(t, route.HasHostGSOCapability())
				route.Release()
			}
			echoTCP(t, p, 8<<20, 60*time.Second)
			for _, e := range []struct {
				n   *Net
				dev *softnic.Device
			}{{p.a, p.devA}, {p.b, p.devB}} {
				require.NotZero(t, e.n.Stats().TxDropped, "frames dropped on purpose")
				require.Eventually(t, func() bool {
					return e.dev.Wire().Stats(e.dev.End()).Sent == e.n.Stats().TxFrames
				}, 5*time.Second, 10*time.Millisecond, "every frame posted was sent (none over the MTU): %s", p.diag())
			}
			require.NotZero(t, p.a.Stack().Stats().TCP.Retransmits.Value()+p.b.Stack().Stats().TCP.Retransmits.Value())
		})
	}
}

// BenchmarkTCPBulk sends 1 MiB per operation over one TCP connection
// between two stacks on a software pair, with GSO and GRO on and off, and
// reports the process's CPU time per MiB beside the rate (both stacks and
// the software wire run in this process).
func BenchmarkTCPBulk(b *testing.B) {
	for _, c := range []struct{ gso, gro bool }{{true, true}, {true, false}, {false, true}, {false, false}} {
		on := map[bool]string{true: "on", false: "off"}
		b.Run("gso="+on[c.gso]+"/gro="+on[c.gro], func(b *testing.B) {
			cfg := func(cf *Config) { cf.GSO, cf.NoGRO = c.gso, !c.gro }
			p := newPairWith(b, cfg, cfg)
			l, err := p.b.Listen("tcp", ":9")
			require.NoError(b, err)
			defer l.Close()
			done := make(chan int64, 1)
			go func() {
				c, err := l.Accept()
				if err != nil {
					done <- -1
					return
				}
				defer c.Close()
				n, _ := io.Copy(io.Discard, c)
				done <- n
			}()
			c, err := p.a.Dial("tcp", "10.9.0.2:9")
			require.NoError(b, err)
			chunk := make([]byte, 1<<20)
			b.SetBytes(int64(len(chunk)))
			cpu0 := cpuTime(b)
			b.ResetTimer()
			for range b.N {
				if _, err := c.Write(chunk); err != nil {
					b.Fatal(err)
				}
			}
			require.NoError(b, c.(*TCPConn).CloseWrite())
			got := <-done
			b.StopTimer()
			require.Equal(b, int64(b.N)*int64(len(chunk)), got, "bytes received")
			b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N), "cpu-ns/MiB")
			_ = c.Close()
		})
	}
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	require.NoError(tb, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestGRO: with GRO on (the default) a receive queue hands the stack
// fewer packets than the frames it received during a bulk transfer, the
// in-order segments of a burst coalesced; with Config.NoGRO one packet per
// frame. Either way 8 MiB echoed over IPv4 and IPv6 arrive intact and no
// coalesced packet fails a checksum (the stack does not check them
// again: their checksums are the first segment's).
func TestGRO(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(map[bool]string{true: "on", false: "off"}[on], func(t *testing.T) {
			cfg := func(c *Config) { c.NoGRO = !on }
			p := newPairWith(t, cfg, cfg)
			t.Cleanup(func() {
				if t.Failed() {
					t.Log(p.diag())
					t.Log("A: ", statDump(p.a))
					t.Log("B: ", statDump(p.b))
				}
			})
			require.Equal(t, on, p.b.Offloads().GRO, "Offloads().GRO")
			echoTCP(t, p, 8<<20, 60*time.Second)
			for _, n := range []*Net{p.a, p.b} {
				frames := n.Stats().RxFrames
				pkts := n.Stack().NICInfo()[nicID].Stats.Rx.Packets.Value()
				t.Logf("%d frames received, %d packets to the stack", frames, pkts)
				if on {
					require.Less(t, pkts, frames, "segments coalesced")
				} else {
					require.Equal(t, frames, pkts)
				}
				require.Zero(t, n.Stack().Stats().TCP.ChecksumErrors.Value())
				require.Zero(t, n.Stack().Stats().IP.MalformedPacketsReceived.Value())
			}
		})
	}
}
