package igbvm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/qemu"
)

// Each igb takes two slots 16 above its own for its SR-IOV VFs (QEMU
// reserves them), so igb NICs sit two slots apart.
const (
	slotIGB   = 4 // the igb NIC vfnic drives, on a dgram netdev to the host
	slotEcho  = 6 // igb on hub 1, driven by vfnic echo (TestGuestInterop)
	slotLinux = 8 // igb on hub 1, driven by the guest's Linux igb driver
	echoIP    = "10.0.9.1"
	linuxIP   = "10.0.9.2/24"
	vfnicBin  = "/vfnic/bin/vfnic"
	window    = 64 // host->guest data frames in flight beyond the last ack
	ackEach   = 16 // the receiver acknowledges every ackEach frames
	frames    = 10000
)

// gatedConformance are the conformance tests that skip on igb, each with
// the reason igbCaps gives; any other test skipping in the guest fails
// TestVM.
var gatedConformance = regexp.MustCompile(`^TestGuestConformance/` +
	`(ReadFrom/source=true|MixedSuccessError|ErrDataBuffers|Truncation|MultiRecv|Overrun|Faults)$`)

// TestVM boots a guest with one igb NIC on a dgram netdev served below,
// and two igb NICs on a hub (one for vfnic echo, one for Linux), and runs
// the TestGuest* tests there.
func TestVM(t *testing.T) {
	if qemu.InGuest() {
		t.Skip("host side: boots the guest that runs the TestGuest* tests")
	}
	qemu.RequireVM(t)
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	// Hub 0: the host tests' NIC, conformance NIC A of pair 0, and a
	// dgram port to the host served here.
	nd, err := qemu.NewDgram()
	require.NoError(t, err)
	s, err := newServer(nd)
	require.NoError(t, err)
	defer s.close()
	// The link test has its NIC's link taken down and up from QEMU's
	// monitor, by this server.
	mon, err := qemu.NewMonitor()
	require.NoError(t, err)
	defer mon.Close()
	s.mon = mon
	go s.serve(ctx)
	// Conformance hub 2 has a port to the host too, with its own server.
	nd2, err := qemu.NewDgram()
	require.NoError(t, err)
	s2, err := newServer(nd2)
	require.NoError(t, err)
	defer s2.close()
	go s2.serve(ctx)
	var qemuArgs []string
	for _, w := range []struct {
		hub int
		nd  qemu.Netdev
	}{{0, nd}, {confHubs[1].hub, nd2}} {
		qemuArgs = append(qemuArgs,
			"-netdev", fmt.Sprintf("dgram,id=wire%d,local.type=inet,local.host=127.0.0.1,local.port=%d,remote.type=inet,remote.host=127.0.0.1,remote.port=%d",
				w.hub, w.nd.QEMUPort, w.nd.HostPort),
			"-netdev", fmt.Sprintf("hubport,id=wire%dp,hubid=%d,netdev=wire%d", w.hub, w.hub, w.hub))
	}
	// The interop test runs the vfnic command itself, built static here.
	bin := t.TempDir() + "/vfnic"
	require.NoError(t, qemu.BuildBinary(ctx, "github.com/vfnic/vfnic/cmd/vfnic", bin))
	cfg := qemu.Config{
		NICs: []qemu.NIC{
			{Model: qemu.IGB, Slot: slotIGB, Net: qemu.Hub(0), Bind: qemu.BindVFIO},
			{Model: qemu.IGB, Slot: confHubs[0].slotA, Net: qemu.Hub(0), Bind: qemu.BindVFIO},
			{Model: qemu.IGB, Slot: slotEcho, Net: qemu.Hub(1), Bind: qemu.BindVFIO},
			{Model: qemu.IGB, Slot: slotLinux, Net: qemu.Hub(1), Bind: qemu.BindLinux, IPv4: linuxIP},
			{Model: qemu.IGB, Slot: confHubs[1].slotA, Net: qemu.Hub(confHubs[1].hub), Bind: qemu.BindVFIO},
			{Model: qemu.IGB, Slot: confHubs[1].slotB, Net: qemu.Hub(confHubs[1].hub), Bind: qemu.BindVFIO},
		},
		QEMUArgs: qemuArgs,
		Files:    []qemu.File{{Host: bin, Guest: vfnicBin, Mode: 0o755}},
		Timeout:  5 * time.Minute,
		// With a thread per vCPU this guest froze in about one run of
		// four, in the conformance suite (see qemu.Config.OneTCGThread).
		OneTCGThread: true,
		Monitor:      mon,
	}
	run := "^TestGuest"
	if r := os.Getenv("VFNIC_GUEST_RUN"); r != "" {
		run = r
		cfg.Output = os.Stderr
	}
	// A hung guest test panics with every goroutine's stack before QEMU's
	// timeout. The guest tests take about 3 minutes on a loaded 2-core
	// host (the link flaps, full-size frames and 8/16-pair RSS about 20 s
	// of it).
	args := []string{"-test.timeout=260s"}
	var env []string
	if r := os.Getenv("VFNIC_VERBS_ROUNDS"); r != "" {
		env = append(env, "VFNIC_VERBS_ROUNDS="+r) // the verbs event-loop rounds (TestGuestVerbs)
	}
	rep := qemu.RunGoTestT(t, cfg, qemu.GoTest{Package: "github.com/vfnic/vfnic/tests/igbvm", Run: run, AllowSkip: true, Args: args, Env: env})
	if rep != nil {
		for _, tr := range rep.Tests {
			if tr.Status == qemu.TestSkip && !gatedConformance.MatchString(tr.Name) {
				t.Errorf("guest test %s skipped in the guest, where it must run", tr.Name)
			}
		}
	}
	stop()
	for _, l := range s.logs() {
		t.Logf("host: %s", l)
	}
	for _, e := range append(s.errors(), s2.errors()...) {
		t.Errorf("host: %s", e)
	}
}

// server is the host end of the netdev.
type server struct {
	mon    *qemu.Monitor // QEMU's, for msgLinkFlap; nil on a server without one
	conn   *net.UDPConn
	remote *net.UDPAddr
	mu     sync.Mutex
	log    []string
	errs   []string
	guest  net.HardwareAddr
	acks   chan uint32 // acks of the current host->guest run
	rxSess uint32      // session of the guest->host run being checked
	rxNext uint32
	rxWant uint32
	// the checksum-offload run (msgCsumReq)
	csumSess, csumWant, csumGood, csumBad uint32
}

// csumFrame counts a checksum-offload frame and answers the guest when
// the run is complete.
func (s *server) csumFrame(session uint32, good bool) {
	if session != s.csumSess || s.csumWant == 0 {
		return
	}
	if good {
		s.csumGood++
	} else {
		s.csumBad++
		s.errorf("checksum offload: a frame with a wrong checksum")
	}
	if s.csumGood+s.csumBad == s.csumWant {
		s.logf("checksum offload: %d frames with right checksums, %d wrong", s.csumGood, s.csumBad)
		s.reply(msg{session: session}, msgCsumDone, s.csumGood|s.csumBad<<16)
		s.csumWant = 0
	}
}

func newServer(nd qemu.Netdev) (*server, error) {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: nd.HostPort})
	if err != nil {
		return nil, err
	}
	_ = c.SetReadBuffer(4 << 20)
	return &server{conn: c, remote: &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: nd.QEMUPort},
		acks: make(chan uint32, 1024)}, nil
}

func (s *server) close() { _ = s.conn.Close() }

func (s *server) logf(format string, args ...any) {
	s.mu.Lock()
	s.log = append(s.log, fmt.Sprintf(format, args...))
	s.mu.Unlock()
}

func (s *server) errorf(format string, args ...any) {
	s.mu.Lock()
	s.errs = append(s.errs, fmt.Sprintf(format, args...))
	s.mu.Unlock()
}

func (s *server) logs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.log...)
}
func (s *server) errors() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.errs...)
}

func (s *server) send(f []byte) {
	if _, err := s.conn.WriteToUDP(f, s.remote); err != nil && !errors.Is(err, net.ErrClosed) {
		s.errorf("send: %v", err)
	}
}

func (s *server) reply(m msg, typ uint8, arg uint32) {
	s.send(build(s.guest, hostMAC, typ, m.session, arg, 60))
}

// serve answers the guest until ctx ends.
func (s *server) serve(ctx context.Context) {
	go func() { <-ctx.Done(); s.close() }()
	buf := make([]byte, 65536)
	for {
		n, _, err := s.conn.ReadFromUDP(buf)
		if err != nil {
			return
		}
		f := buf[:n]
		if s.csumWant != 0 { // only a checksum run's frames need decoding as IP
			if sess, good, ok := checkCsum(f); ok {
				s.csumFrame(sess, good)
				continue
			}
		}
		m, err := parse(f)
		if m.typ == 0 && err != nil {
			continue // not ours (the guest's kernel sends nothing on a vfio NIC, but be safe)
		}
		s.guest = append(net.HardwareAddr(nil), f[6:12]...)
		switch m.typ {
		case msgHello:
			s.reply(m, msgHelloAck, 0)
		case msgRxReq:
			go s.sendRun(ctx, m, m.arg, s.guest)
		case msgOversize:
			big := make([]byte, m.arg)
			copy(big[0:6], f[6:12])
			copy(big[6:12], hostMAC)
			binary.BigEndian.PutUint16(big[12:14], 0x88b7) // neither protocol's EtherType
			s.send(big)
			s.send(build(net.HardwareAddr(f[hdrLen:hdrLen+6]), hostMAC, msgOversizeDone, m.session, 0, 60))
		case msgPaced:
			go func(m msg, dst net.HardwareAddr) {
				gap := time.Duration(m.arg&0xffff) * time.Microsecond
				next := time.Now()
				for seq := uint32(0); seq < m.arg>>16; seq++ {
					for time.Now().Before(next) {
					} // spin: sleeps are too coarse for 100us gaps
					s.send(dataFrame(dst, hostMAC, m.session, seq))
					next = next.Add(gap)
				}
			}(m, s.guest)
		case msgCsumReq:
			s.csumSess, s.csumWant, s.csumGood, s.csumBad = m.session, m.arg, 0, 0
		case msgVLANReq:
			s.send(tagged(dataFrame(s.guest, hostMAC, m.session, 0), uint16(m.arg)))
			s.send(dataFrame(s.guest, hostMAC, m.session, 1))
		case msgRSSReq:
			go s.sendRSS(ctx, m, int(m.arg>>16), int(m.arg&0xffff), s.guest)
		case msgLinkFlap:
			go s.linkFlap(ctx, time.Duration(m.arg)*time.Millisecond)
		case msgAck:
			select {
			case s.acks <- m.arg:
			default:
			}
		case msgDelayed:
			go func(m msg, dst net.HardwareAddr) {
				time.Sleep(time.Duration(m.arg) * time.Millisecond)
				s.send(dataFrame(dst, hostMAC, m.session, 0))
			}(m, s.guest)
		case msgTxReq:
			s.rxSess, s.rxNext, s.rxWant = m.session, 0, m.arg
			s.reply(m, msgAck, 0)
		case msgData:
			if m.session != s.rxSess {
				continue
			}
			if err != nil || m.arg != s.rxNext {
				if err == nil {
					err = fmt.Errorf("data frame %d where %d was due", m.arg, s.rxNext)
				}
				s.errorf("guest->host: %v", err)
				s.reply(m, msgNak, s.rxNext)
				continue
			}
			s.rxNext++
			if s.rxNext%ackEach == 0 || s.rxNext == s.rxWant {
				s.reply(m, msgAck, s.rxNext)
			}
			if s.rxNext == s.rxWant {
				s.logf("guest->host: %d frames in order and intact", s.rxWant)
			}
		}
	}
}

// linkFlap takes the link of the host tests' NIC (Config.NICs[0], device
// id nic0) down, and up again after down.
func (s *server) linkFlap(ctx context.Context, down time.Duration) {
	if s.mon == nil {
		s.errorf("link flap asked of a server without a monitor")
		return
	}
	ctx, cancel := context.WithTimeout(ctx, down+20*time.Second)
	defer cancel()
	t0 := time.Now()
	if err := s.mon.SetLink(ctx, "nic0", false); err != nil {
		s.errorf("set_link nic0 off: %v", err)
		return
	}
	time.Sleep(down)
	if err := s.mon.SetLink(ctx, "nic0", true); err != nil {
		s.errorf("set_link nic0 on: %v", err)
		return
	}
	s.logf("link flap: set_link nic0 off, on after %v", time.Since(t0).Round(time.Millisecond))
}

// sendRun sends n data frames to the guest, keeping at most window
// beyond the last count the guest acknowledged.
func (s *server) sendRun(ctx context.Context, m msg, n uint32, dst net.HardwareAddr) {
	for len(s.acks) > 0 {
		<-s.acks
	}
	acked := uint32(0)
	t0 := time.Now()
	for seq := uint32(0); seq < n; seq++ {
		for seq-acked >= window {
			select {
			case a := <-s.acks:
				acked = max(acked, a)
			case <-time.After(10 * time.Second):
				s.errorf("host->guest: no ack beyond %d of %d for 10s", acked, n)
				return
			case <-ctx.Done():
				return
			}
		}
		s.send(dataFrame(dst, hostMAC, m.session, seq))
	}
	s.logf("host->guest: sent %d frames in %v", n, time.Since(t0).Round(time.Millisecond))
}

// sendRSS sends perFlow frames on each of flows UDP flows, interleaved,
// under the same window of acknowledgements as sendRun.
func (s *server) sendRSS(ctx context.Context, m msg, flows, perFlow int, dst net.HardwareAddr) {
	for len(s.acks) > 0 {
		<-s.acks
	}
	acked, sent := uint32(0), uint32(0)
	for seq := 0; seq < perFlow; seq++ {
		for flow := 0; flow < flows; flow++ {
			for sent-acked >= window {
				select {
				case a := <-s.acks:
					acked = max(acked, a)
				case <-time.After(10 * time.Second):
					s.errorf("rss: no ack beyond %d of %d for 10s", acked, flows*perFlow)
					return
				case <-ctx.Done():
					return
				}
			}
			s.send(udpFrame(dst, hostMAC, m.session, flow, seq))
			sent++
		}
	}
	s.logf("rss: sent %d flows of %d frames", flows, perFlow)
}
