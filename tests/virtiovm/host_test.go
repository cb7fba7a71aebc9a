package virtiovm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/qemu"
	"github.com/vfnic/vfnic/qemu/hostnet"
	"golang.org/x/sys/unix"
)

// Guest topology: PCI slots of the NICs.
const (
	slotPacked = 4 // virtio-net, packed rings, left unbound: Open binds it
	slotSplit  = 5 // virtio-net, split rings, bound to vfio-pci by /init
	slotLinux  = 6 // virtio-net driven by the guest's Linux driver
	linuxIP    = "10.0.3.15/24"
)

// The conformance suite's wires: two QEMU hubs, each with a pair of
// virtio-net NICs bound to vfio-pci (A sends, B receives) and a dgram port
// to the host, which sends B the frames no vfnic queue can send (longer
// than the MTU).
var confHubs = []struct{ hub, slotA, slotB int }{{1, 7, 8}, {2, 9, 10}}

// gatedConformance are the conformance tests that skip on virtio, each
// with the reason virtioCaps gives; any other test skipping in the guest
// fails TestVM.
var gatedConformance = regexp.MustCompile(`^TestGuestConformance(Packed|Split)/` +
	`(ReadFrom/source=true|MixedSuccessError|ErrDataBuffers|Truncation|MultiRecv|Overrun|Faults)$`)

// TestVM boots a guest with three virtio-net NICs, each on its own dgram
// netdev served by the host side below, and two pairs of virtio-net NICs
// on QEMU hubs for the conformance suite, each hub with a dgram port to
// the host; it runs the TestGuest* tests there.
func TestVM(t *testing.T) {
	if qemu.InGuest() {
		t.Skip("host side: boots the guest that runs the TestGuest* tests")
	}
	qemu.RequireVM(t)
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	names := map[int]string{slotPacked: "packed", slotSplit: "split", slotLinux: "linux"}
	var nics []qemu.NIC
	var servers []*server
	for _, slot := range []int{slotPacked, slotSplit, slotLinux} {
		nd, err := qemu.NewDgram()
		require.NoError(t, err)
		s, err := newServer(names[slot], nd)
		require.NoError(t, err)
		defer s.close()
		go s.serve(ctx)
		servers = append(servers, s)
		n := qemu.NIC{Model: qemu.VirtioNet, Slot: slot, Net: nd, Packed: slot != slotSplit}
		switch slot {
		case slotPacked:
			n.Bind = qemu.BindNone
		case slotSplit:
			n.Bind = qemu.BindVFIO
		case slotLinux:
			n.Bind, n.IPv4 = qemu.BindLinux, linuxIP
		}
		nics = append(nics, n)
	}
	// mq=on makes the device offer MQ and a control queue, which the
	// driver then uses to set the receive mode and the pair count.
	// Named threads let the rate benchmarks' host side tell the vCPUs'
	// CPU time from the main loop's, which emulates the devices.
	qemuArgs := []string{"-global", "virtio-net-pci.mq=on", "-name", "vfnic,debug-threads=on"}
	for _, h := range confHubs {
		nd, err := qemu.NewDgram()
		require.NoError(t, err)
		s, err := newServer(fmt.Sprintf("hub%d", h.hub), nd)
		require.NoError(t, err)
		defer s.close()
		go s.serve(ctx)
		servers = append(servers, s)
		wire := fmt.Sprintf("wire%d", h.hub)
		qemuArgs = append(qemuArgs,
			"-netdev", fmt.Sprintf("dgram,id=%s,local.type=inet,local.host=127.0.0.1,local.port=%d,remote.type=inet,remote.host=127.0.0.1,remote.port=%d",
				wire, nd.QEMUPort, nd.HostPort),
			"-netdev", fmt.Sprintf("hubport,id=%sp,hubid=%d,netdev=%s", wire, h.hub, wire))
		for _, slot := range []int{h.slotA, h.slotB} {
			nics = append(nics, qemu.NIC{Model: qemu.VirtioNet, Slot: slot, Net: qemu.Hub(h.hub), Packed: true, Bind: qemu.BindVFIO})
		}
	}
	cfg := qemu.Config{
		NICs:     nics,
		QEMUArgs: qemuArgs,
		// The guest reads the TSC, not the HPET (qemu.BaseKernelArgs), so
		// the Go runtime's clock reads do not stall on QEMU's big lock.
		Timeout: 4 * time.Minute,
	}
	run := "^TestGuest"
	if r := os.Getenv("VFNIC_GUEST_RUN"); r != "" {
		run = r // for working on one guest test: its raw output is shown
		cfg.Output = os.Stderr
	}
	var env []string
	if r := os.Getenv("VFNIC_VERBS_ROUNDS"); r != "" {
		env = append(env, "VFNIC_VERBS_ROUNDS="+r) // the verbs event-loop rounds (TestGuestVerbs*)
		cfg.Timeout = 20 * time.Minute
	}
	rep := qemu.RunGoTestT(t, cfg, qemu.GoTest{Package: "github.com/vfnic/vfnic/tests/virtiovm", Run: run, AllowSkip: true, Env: env})
	if rep != nil {
		for _, tr := range rep.Tests {
			if tr.Status == qemu.TestSkip && !gatedConformance.MatchString(tr.Name) {
				t.Errorf("guest test %s skipped in the guest, where it must run", tr.Name)
			}
		}
	}
	stop()
	for _, s := range servers {
		for _, l := range s.logs() {
			t.Logf("host %s: %s", s.name, l)
		}
		for _, e := range s.errors() {
			t.Errorf("host %s: %v", s.name, e)
		}
	}
	if rep != nil && rep.Result != nil {
		t.Logf("guest kernel %s, run took %v", rep.Result.KernelVersion, rep.Result.Duration.Round(time.Millisecond))
	}
}

// server is the host end of one NIC's dgram netdev: it answers the guest
// tests' control frames, sends and checks data frames, and remembers what
// went wrong for TestVM to report.
type server struct {
	name    string
	fd      int                // blocking UDP socket, outside the Go runtime's poller
	dstAddr unix.SockaddrInet4 // QEMU's socket
	closing atomic.Bool
	closed  sync.Once

	mu       sync.Mutex
	session  uint32
	guestMAC net.HardwareAddr
	expect   struct {
		on               bool
		count, next, bad uint32
		firstErr         error
		outOfSession     uint32
	}
	bench struct {
		on          bool
		n           uint32
		first, last time.Time
	}
	errs []error
	log  []string

	benchCPU cpuSnap      // at the transmit benchmark's start
	qpid     atomic.Int32 // QEMU's pid, found on first use

	acked  atomic.Uint32
	ackCh  chan struct{}
	cancel context.CancelFunc // of the running sender, if any
	wg     sync.WaitGroup
}

func newServer(name string, nd qemu.Netdev) (*server, error) {
	// A plain blocking socket rather than a net.UDPConn: a socket in the
	// runtime's epoll set wakes the thread sleeping in epoll_wait for
	// every datagram that arrives, a few microseconds of CPU each, which
	// at the transmit benchmark's rates took half a core from QEMU.
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Port: nd.HostPort, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("bind 127.0.0.1:%d: %w", nd.HostPort, err)
	}
	// 10,000 frames from the guest must never be dropped here, even if
	// this goroutine is starved by QEMU for a while: a large buffer (root
	// may exceed rmem_max) holds them all.
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 64<<20) != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 8<<20)
	}
	return &server{name: name, fd: fd, dstAddr: unix.SockaddrInet4{Port: nd.QEMUPort, Addr: [4]byte{127, 0, 0, 1}},
		ackCh: make(chan struct{}, 1)}, nil
}

// close stops serve (it polls with a timeout and sees closing) and the
// sender, then closes the socket.
func (s *server) close() {
	s.closing.Store(true)
	s.stopSender()
	s.wg.Wait()
	s.closed.Do(func() { unix.Close(s.fd) })
}

func (s *server) fail(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.errs = append(s.errs, fmt.Errorf(format, args...))
}

func (s *server) logf(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.log = append(s.log, fmt.Sprintf(format, args...))
}

func (s *server) errors() []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]error(nil), s.errs...)
}

func (s *server) logs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.log...)
}

// reply sends a control frame to the guest.
func (s *server) reply(m msg) {
	s.mu.Lock()
	dst, sess := s.guestMAC, s.session
	s.mu.Unlock()
	m.session = sess
	s.write(build(dst, hostMAC, m, minFrame))
}

func (s *server) write(f []byte) bool {
	// Sendto encodes the address into the Sockaddr it is given: senders on
	// several goroutines each need their own copy.
	dst := s.dstAddr
	for {
		err := unix.Sendto(s.fd, f, 0, &dst)
		if err == nil {
			return true
		}
		// Loopback UDP only fails transiently (ENOBUFS under memory
		// pressure); anything else means the socket is gone.
		if !errors.Is(err, syscall.ENOBUFS) && !errors.Is(err, syscall.EAGAIN) {
			return false
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// batchRead is how many datagrams one recvmmsg takes at most.
const batchRead = 256

// serve reads the guest's frames until ctx ends.
func (s *server) serve(ctx context.Context) {
	s.wg.Add(1)
	defer s.wg.Done()
	r := hostnet.NewBatchReader(s.fd, batchRead, 2048)
	for {
		if ctx.Err() != nil || s.closing.Load() {
			s.stopSender()
			return
		}
		n, err := r.Read()
		if err != nil {
			s.fail("read: %v", err)
			s.stopSender()
			return
		}
		for i := range n {
			s.handle(ctx, r.Datagram(i))
		}
		// While the guest streams frames for the transmit benchmark, a
		// wake-up per datagram would cost this process more CPU time than
		// QEMU spends sending it; waiting a little lets them queue up
		// (the socket buffer holds far more) and be read in batches.
		s.mu.Lock()
		streaming := s.bench.on
		s.mu.Unlock()
		switch {
		case n == batchRead:
		case streaming:
			ts := unix.NsecToTimespec(int64(500 * time.Microsecond))
			_ = unix.Nanosleep(&ts, nil)
		default:
			// Wait for a datagram, waking now and then to see ctx.
			_, _ = unix.Poll([]unix.PollFd{{Fd: int32(s.fd), Events: unix.POLLIN}}, 50)
		}
	}
}

func (s *server) stopSender() {
	s.mu.Lock()
	c := s.cancel
	s.cancel = nil
	s.mu.Unlock()
	if c != nil {
		c()
	}
}

func (s *server) handle(ctx context.Context, f []byte) {
	m, ok := peek(f)
	if !ok {
		return // not ours (IPv6 neighbour discovery from a Linux NIC, ...)
	}
	if m.typ == msgOversizeReq {
		s.oversize(m)
		return
	}
	if m.typ == msgHello {
		s.stopSender()
		s.mu.Lock()
		s.session, s.guestMAC = m.session, append(net.HardwareAddr(nil), f[6:12]...)
		s.expect.on, s.bench.on = false, false
		s.mu.Unlock()
		s.acked.Store(0)
		s.reply(msg{typ: msgHelloAck})
		return
	}
	s.mu.Lock()
	current := m.session == s.session
	s.mu.Unlock()
	if !current {
		s.mu.Lock()
		s.expect.outOfSession++
		s.mu.Unlock()
		return // left over from an earlier test on this NIC
	}
	switch m.typ {
	case msgAck:
		s.acked.Store(m.args[0])
		select {
		case s.ackCh <- struct{}{}:
		default:
		}
	case msgSendReq:
		s.startSender(ctx, func(ctx context.Context) { s.sendWindowed(ctx, m.args[0], m.args[1]) })
	case msgBlastReq:
		s.startSender(ctx, func(ctx context.Context) { s.blast(ctx, time.Duration(m.args[0])*time.Millisecond, m.args[1]) })
	case msgDelayedReq:
		s.startSender(ctx, func(ctx context.Context) {
			select {
			case <-ctx.Done():
			case <-time.After(time.Duration(m.args[0]) * time.Millisecond):
				s.mu.Lock()
				dst, sess := s.guestMAC, s.session
				s.mu.Unlock()
				s.write(dataFrame(dst, hostMAC, sess, 0))
			}
		})
	case msgExpectReq:
		s.mu.Lock()
		s.expect.on, s.expect.count, s.expect.next, s.expect.bad, s.expect.firstErr = true, m.args[0], 0, 0, nil
		s.mu.Unlock()
		s.reply(msg{typ: msgExpectAck})
	case msgData:
		s.data(f, m)
	case msgResultReq:
		s.mu.Lock()
		e := s.expect
		s.expect.on = false
		s.mu.Unlock()
		if e.next != e.count || e.bad != 0 {
			s.fail("guest sent %d frames: %d arrived in order and intact, %d bad (first: %v)", e.count, e.next, e.bad, e.firstErr)
		} else {
			s.logf("received all %d frames from the guest in order and intact", e.count)
		}
		s.reply(msg{typ: msgResult, args: [3]uint32{e.next, e.bad}})
	case msgBenchTxStart:
		s.mu.Lock()
		s.bench.on, s.bench.n = true, 0
		s.benchCPU = takeCPU(s.qemu())
		s.mu.Unlock()
		s.reply(msg{typ: msgBenchTxAck})
	case msgBenchTxEnd:
		s.mu.Lock()
		b := s.bench
		s.bench.on = false
		cpu := takeCPU(s.qemu()).since(s.benchCPU)
		s.mu.Unlock()
		us := uint32(b.last.Sub(b.first).Microseconds())
		s.logf("transmit benchmark: guest sent %d, host received %d 64-byte frames, %.0f frames/s; %s", m.args[0], b.n, spanRate(b.n, us), cpu)
		s.reply(msg{typ: msgBenchResult, args: [3]uint32{b.n, us}})
	}
}

// data checks a data frame from the guest.
func (s *server) data(f []byte, m msg) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.bench.on {
		now := time.Now()
		if s.bench.n == 0 {
			s.bench.first = now
		}
		s.bench.last = now
		s.bench.n++
		return
	}
	if !s.expect.on {
		s.fail("unexpected data frame seq %d", m.seq)
		return
	}
	e := &s.expect
	err := checkData(f, hostMAC, s.guestMAC, s.session, e.next)
	if err == nil {
		e.next++
		return
	}
	e.bad++
	if e.firstErr == nil {
		e.firstErr = err
	}
}

// oversize sends the frame a msgOversizeReq asks for, then says so. The
// request carries everything (no session), so that the guest needs no
// conversation on a wire whose receiver belongs to a test.
func (s *server) oversize(m msg) {
	dst, reply := argMACs(m.args)
	if m.seq < minFrame || m.seq > 9000 {
		s.fail("oversize request for %d bytes", m.seq)
		return
	}
	s.write(build(dst, hostMAC, msg{typ: msgData, session: m.session}, int(m.seq)))
	s.write(build(reply, hostMAC, msg{typ: msgOversizeDone, session: m.session}, minFrame))
	s.logf("sent a %d-byte frame to %v (longer than its receive buffers)", m.seq, dst)
}

// qemu returns the pid of the QEMU process this server talks to, or 0.
func (s *server) qemu() int {
	if s.qpid.Load() == 0 {
		s.qpid.Store(int32(qemuPID(s.dstAddr.Port)))
	}
	return int(s.qpid.Load())
}

func (s *server) startSender(ctx context.Context, fn func(context.Context)) {
	s.stopSender()
	sctx, cancel := context.WithCancel(ctx)
	s.mu.Lock()
	s.cancel = cancel
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		fn(sctx)
	}()
}

// sendWindowed sends count data frames, never more than window beyond the
// guest's last acknowledgement, so that QEMU's socket buffer cannot
// overflow: a frame that is lost anyway makes the guest test fail.
func (s *server) sendWindowed(ctx context.Context, count, window uint32) {
	s.mu.Lock()
	dst, sess := s.guestMAC, s.session
	s.mu.Unlock()
	frames := make([][]byte, count)
	for i := range frames {
		frames[i] = dataFrame(dst, hostMAC, sess, uint32(i))
	}
	start := time.Now()
	waitAck := func(until uint32) bool {
		timer := time.NewTimer(15 * time.Second)
		defer timer.Stop()
		for s.acked.Load() < until {
			select {
			case <-ctx.Done():
				return false
			case <-timer.C:
				s.fail("guest stopped acknowledging at %d of %d frames", s.acked.Load(), count)
				return false
			case <-s.ackCh:
			}
		}
		return true
	}
	for seq := uint32(0); seq < count; seq++ {
		if seq >= window && !waitAck(seq-window+1) {
			return
		}
		if !s.write(frames[seq]) {
			return
		}
	}
	if !waitAck(count) {
		return
	}
	el := time.Since(start)
	s.logf("sent %d frames (window %d) to the guest in %v: %.0f frames/s", count, window, el.Round(time.Millisecond), float64(count)/el.Seconds())
	s.reply(msg{typ: msgSendDone, args: [3]uint32{count}})
}

// blast sends 64-byte data frames for d, keeping QEMU's socket supplied
// (hostnet.Feed),
// then reports how many (several times, once QEMU has had time to drain
// its socket), with the guest's round number so that a late report is not
// taken for the next round's.
func (s *server) blast(ctx context.Context, d time.Duration, round uint32) {
	s.mu.Lock()
	dst, sess := s.guestMAC, s.session
	s.mu.Unlock()
	f := build(dst, hostMAC, msg{typ: msgData, session: sess}, minFrame)
	w := hostnet.NewBatchWriter(s.fd, s.dstAddr, f, 64)
	cpu0, sock0 := takeCPU(s.qemu()), hostnet.Socket(s.dstAddr.Port)
	fs := hostnet.Feed(ctx, w, s.dstAddr.Port, d)
	n, checks, empty := fs.Sent, fs.Checks, fs.Empty
	us := uint32(fs.Elapsed.Microseconds())
	cpu, sock := takeCPU(s.qemu()).since(cpu0), hostnet.Socket(s.dstAddr.Port)
	s.logf("receive benchmark: host sent %d 64-byte frames in %v; QEMU's socket dropped %d, was found empty at %d of %d checks and holds %d bytes; %s",
		n, time.Duration(us)*time.Microsecond, sock.Drops-sock0.Drops, empty, checks, sock.Queued, cpu)
	for range 10 {
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
		s.reply(msg{typ: msgBlastDone, args: [3]uint32{uint32(n), us, round}})
	}
}
