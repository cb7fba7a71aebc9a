package netstack

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gvisor.dev/gvisor/pkg/tcpip"

	"github.com/vfnic/vfnic/nic"
	"github.com/vfnic/vfnic/nic/softnic"
)

var (
	addrA4 = netip.MustParsePrefix("10.9.0.1/24")
	addrB4 = netip.MustParsePrefix("10.9.0.2/24")
	addrA6 = netip.MustParsePrefix("fd00:9::1/64")
	addrB6 = netip.MustParsePrefix("fd00:9::2/64")
)

type pair struct {
	a, b       *Net
	devA, devB *softnic.Device
}

// newPair runs two stacks on the two ends of a wire; cfgB adjusts B's
// config. Both are closed at the end of the test. The rings are long: a
// sender's burst (a window's worth, in batches of 47) overflowing a
// 256-slot receive ring before the receiving core wakes up cost whole
// retransmission timeouts, which made 1 MiB transfers take seconds.
func newPair(t *testing.T, cfgB func(*Config)) *pair {
	t.Helper()
	return newPairWith(t, nil, cfgB)
}

// newPairWith is newPair with A's config adjusted by cfgA too.
func newPairWith(t testing.TB, cfgA, cfgB func(*Config)) *pair {
	t.Helper()
	devA, devB, err := softnic.Pair(nic.Config{QueueSize: 1024})
	require.NoError(t, err)
	ca := Config{Addrs: []netip.Prefix{addrA4, addrA6}}
	cb := Config{Addrs: []netip.Prefix{addrB4, addrB6}}
	if cfgA != nil {
		cfgA(&ca)
	}
	if cfgB != nil {
		cfgB(&cb)
	}
	a, err := New(devA, ca)
	require.NoError(t, err)
	b, err := New(devB, cb)
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, a.Close())
		require.NoError(t, b.Close())
		_ = devA.Close()
		_ = devB.Close()
	})
	return &pair{a: a, b: b, devA: devA, devB: devB}
}

// value is a counter's value; gVisor leaves some counters nil.
func value(c *tcpip.StatCounter) uint64 {
	if c == nil {
		return 0
	}
	return c.Value()
}

// diag describes both ends, for a failure message.
func (p *pair) diag() string {
	d := func(n *Net, dev *softnic.Device) string {
		tcp := n.Stack().Stats().TCP
		tx, _ := dev.Tx(0)
		rx, _ := dev.Rx(0)
		ip := n.Stack().Stats().IP
		nic := n.Stack().NICInfo()[nicID].Stats
		return fmt.Sprintf("%s (wire %+v); %+v; device %+v; rx outstanding %d, tx outstanding %d; tcp sent %d rcvd %d retrans %d timeouts %d senderr %d; ip sent %d errors %d; nic tx %d nobufspace %d",
			dev.Info().Address, dev.Wire().Stats(dev.End()), n.Stats(), dev.Stats(), rx.Outstanding(), tx.Outstanding(), tcp.SegmentsSent.Value(),
			tcp.ValidSegmentsReceived.Value(), tcp.Retransmits.Value(), tcp.Timeouts.Value(), tcp.SegmentSendErrors.Value(),
			ip.PacketsSent.Value(), ip.OutgoingPacketErrors.Value(), value(nic.Tx.Packets), value(nic.TxPacketsDroppedNoBufferSpace))
	}
	return "A: " + d(p.a, p.devA) + "\nB: " + d(p.b, p.devB)
}

func randBytes(t *testing.T, n int) []byte {
	b := make([]byte, n)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return b
}

// echo serves one connection of l: it copies what it reads back.
func echo(l net.Listener) {
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
}

// echoTCP echoes n random bytes over TCP from A through an echo server
// on B's port 7 and back, over IPv4 and over IPv6 (a subtest each), each
// within timeout.
func echoTCP(t *testing.T, p *pair, n int, timeout time.Duration) {
	t.Helper()
	l, err := p.b.Listen("tcp", ":7")
	require.NoError(t, err)
	defer l.Close()
	echo(l)
	body := randBytes(t, n)
	for _, dst := range []string{"10.9.0.2:7", "[fd00:9::2]:7"} {
		t.Run(dst, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			c, err := p.a.DialContext(ctx, "tcp", dst)
			require.NoError(t, err, p.diag())
			defer c.Close()
			require.NoError(t, c.SetDeadline(time.Now().Add(timeout)))
			roundTrip(t, c, body)
		})
	}
}

// roundTrip writes body on c (from a goroutine) and reads the echo.
func roundTrip(t *testing.T, c net.Conn, body []byte) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		_, err := c.Write(body)
		errc <- err
	}()
	got := make([]byte, len(body))
	_, err := io.ReadFull(c, got)
	require.NoError(t, err)
	require.NoError(t, <-errc)
	require.Equal(t, sha256.Sum256(body), sha256.Sum256(got))
}

func TestTCPEcho(t *testing.T) {
	// The echoing side writes through the fifo qdisc, then through its
	// polling core (Config.CoreTransmit).
	for _, core := range []bool{false, true} {
		t.Run(map[bool]string{false: "qdisc", true: "core"}[core], func(t *testing.T) {
			p := newPair(t, func(c *Config) { c.CoreTransmit = core })
			echoTCP(t, p, 4<<20, 30*time.Second)
			st := p.a.Stats()
			require.NotZero(t, st.RxFrames)
			require.NotZero(t, st.TxFrames)
			require.NotZero(t, p.b.Stats().TxFrames)
			require.Equal(t, 1500, p.a.MTU())
		})
	}
}

func TestUDP(t *testing.T) {
	p := newPair(t, nil)
	pc, err := p.b.ListenPacket("udp", ":53")
	require.NoError(t, err)
	defer pc.Close()
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if _, err := pc.WriteTo(buf[:n], from); err != nil {
				return
			}
		}
	}()
	for _, dst := range []string{"10.9.0.2:53", "[fd00:9::2]:53"} {
		c, err := p.a.Dial("udp", dst)
		require.NoError(t, err)
		require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
		for i := range 20 {
			msg := []byte(fmt.Sprintf("datagram %d to %s", i, dst))
			_, err := c.Write(msg)
			require.NoError(t, err)
			buf := make([]byte, 100)
			n, err := c.Read(buf)
			require.NoError(t, err)
			require.Equal(t, msg, buf[:n])
		}
		require.NoError(t, c.Close())
	}
}

func TestHTTP(t *testing.T) {
	p := newPair(t, nil)
	body := randBytes(t, 1<<20)
	l, err := p.b.Listen("tcp", ":80")
	require.NoError(t, err)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write(body)
	})}
	go func() { _ = srv.Serve(l) }()
	defer srv.Close()
	tr := &http.Transport{DialContext: p.a.DialContext}
	defer tr.CloseIdleConnections()
	cl := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	for _, u := range []string{"http://10.9.0.2/", "http://[fd00:9::2]/"} {
		for range 3 {
			resp, err := cl.Get(u)
			require.NoError(t, err, p.diag())
			got, err := io.ReadAll(resp.Body)
			require.NoError(t, err, p.diag())
			require.NoError(t, resp.Body.Close())
			require.True(t, bytes.Equal(body, got))
		}
	}
}

// TestDeadlines: read and accept deadlines end with os.ErrDeadlineExceeded
// (a net.Error whose Timeout is true), as on *net.TCPConn.
func TestDeadlines(t *testing.T) {
	p := newPair(t, nil)
	l, err := p.b.ListenTCP(&net.TCPAddr{Port: 9})
	require.NoError(t, err)
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	c, err := p.a.Dial("tcp", "10.9.0.2:9")
	require.NoError(t, err)
	defer c.Close()
	sc := <-accepted
	defer sc.Close()

	require.NoError(t, c.SetReadDeadline(time.Now().Add(50*time.Millisecond)))
	_, err = c.Read(make([]byte, 1))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	require.True(t, ne.Timeout())
	// Clearing the deadline makes reads work again.
	require.NoError(t, c.SetReadDeadline(time.Time{}))
	_, err = sc.Write([]byte("x"))
	require.NoError(t, err)
	b := make([]byte, 1)
	_, err = io.ReadFull(c, b)
	require.NoError(t, err)

	pc, err := p.b.ListenUDP(nil)
	require.NoError(t, err)
	defer pc.Close()
	require.NoError(t, pc.SetReadDeadline(time.Now().Add(20*time.Millisecond)))
	_, _, err = pc.ReadFrom(make([]byte, 10))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
}

// TestDialCancel: a dial whose SYNs are lost ends when its context does.
func TestDialCancel(t *testing.T) {
	p := newPair(t, nil)
	p.devA.Wire().SetFaults(softnic.Faults{Drop: 1})
	defer p.devA.Wire().SetFaults(softnic.Faults{})
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	_, err := p.a.DialContext(ctx, "tcp", "10.9.0.2:80")
	require.ErrorIs(t, err, context.Canceled)
	require.Less(t, time.Since(start), 10*time.Second)

	ctx2, cancel2 := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel2()
	_, err = p.a.DialContext(ctx2, "tcp6", "[fd00:9::2]:80")
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestBadAddresses(t *testing.T) {
	p := newPair(t, nil)
	_, err := p.a.Dial("tcp", "example.com:80")
	require.ErrorIs(t, err, ErrNotIPLiteral)
	_, err = p.a.Dial("tcp4", "[fd00:9::2]:80")
	require.ErrorIs(t, err, os.ErrInvalid)
	_, err = p.a.Listen("udp", ":1")
	require.Error(t, err)
	_, err = p.a.ListenPacket("ip", ":1")
	require.Error(t, err)
	_, err = p.a.Dial("tcp", ":80")
	require.ErrorIs(t, err, os.ErrInvalid)
	_, err = New(nil, Config{})
	require.ErrorIs(t, err, os.ErrInvalid)
}

// TestDropRetransmit: with one received frame in 100 dropped in B's
// endpoint, received and sent, 8 MiB each way still arrive intact: TCP
// recovers the losses.
func TestDropRetransmit(t *testing.T) {
	p := newPair(t, func(c *Config) { c.DropEvery = 100 })
	l, err := p.b.Listen("tcp", ":7")
	require.NoError(t, err)
	defer l.Close()
	echo(l)
	c, err := p.a.Dial("tcp", "10.9.0.2:7")
	require.NoError(t, err)
	defer c.Close()
	roundTrip(t, c, randBytes(t, 8<<20))
	require.NotZero(t, p.b.Stats().RxDropped)
	require.NotZero(t, p.b.Stats().TxDropped)
	require.NotZero(t, p.a.Stack().Stats().TCP.Retransmits.Value())
}

// TestFaultyWire: with the software wire dropping, corrupting,
// reordering and duplicating frames both ways, 2 MiB echoed over TCP
// (IPv4 and IPv6) arrive intact: the stack's checksums catch the
// corruption, and TCP recovers the rest.
func TestFaultyWire(t *testing.T) {
	p := newPair(t, nil)
	w := p.devA.Wire()
	l, err := p.b.Listen("tcp", ":7")
	require.NoError(t, err)
	defer l.Close()
	echo(l)
	w.SetFaults(softnic.Faults{Drop: 0.01, Corrupt: 0.01, Reorder: 0.02, Duplicate: 0.01, Seed: 29})
	body := randBytes(t, 1<<20)
	for _, dst := range []string{"10.9.0.2:7", "[fd00:9::2]:7"} {
		t.Run(dst, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			c, err := p.a.DialContext(ctx, "tcp", dst)
			require.NoError(t, err)
			defer c.Close()
			require.NoError(t, c.SetDeadline(time.Now().Add(60*time.Second)))
			roundTrip(t, c, body)
		})
	}
	// An unmodified net/http server and client, over the same faults.
	hl, err := p.b.Listen("tcp", ":80")
	require.NoError(t, err)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(body) })}
	go func() { _ = srv.Serve(hl) }()
	defer srv.Close()
	tr := &http.Transport{DialContext: p.a.DialContext}
	defer tr.CloseIdleConnections()
	cl := &http.Client{Transport: tr, Timeout: 60 * time.Second}
	for range 2 {
		resp, err := cl.Get("http://10.9.0.2/")
		require.NoError(t, err)
		got, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, sha256.Sum256(body), sha256.Sum256(got))
	}
	w.SetFaults(softnic.Faults{})
	for end := range 2 {
		st := w.Stats(end)
		t.Logf("frames sent by end %d: %+v", end, st)
		require.NotZero(t, st.Dropped, "end %d", end)
		require.NotZero(t, st.Corrupted, "end %d", end)
		require.NotZero(t, st.Reordered, "end %d", end)
		require.NotZero(t, st.Duplicated, "end %d", end)
	}
	tcpA, tcpB := p.a.Stack().Stats().TCP, p.b.Stack().Stats().TCP
	require.NotZero(t, tcpA.ChecksumErrors.Value()+tcpB.ChecksumErrors.Value(), "corrupted segments caught by the checksum")
	require.NotZero(t, tcpA.Retransmits.Value()+tcpB.Retransmits.Value())
}

// goroutinesSettle waits until the goroutine count is back to n.
func goroutinesSettle(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > n {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines, %d before:\n%s", runtime.NumGoroutine(), n, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestClose: Close wakes a blocked Accept and Read with errors matching
// net.ErrClosed, later calls fail the same way, and every goroutine of
// the Net ends.
func TestClose(t *testing.T) {
	base := runtime.NumGoroutine()
	devA, devB, err := softnic.Pair(nic.Config{QueueSize: 64})
	require.NoError(t, err)
	a, err := New(devA, Config{Addrs: []netip.Prefix{addrA4}})
	require.NoError(t, err)
	b, err := New(devB, Config{Addrs: []netip.Prefix{addrB4}})
	require.NoError(t, err)
	l, err := b.Listen("tcp4", "10.9.0.2:80")
	require.NoError(t, err)
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	c, err := a.Dial("tcp", "10.9.0.2:80")
	require.NoError(t, err)
	sc := <-accepted

	errs := make(chan error, 2)
	go func() { _, err := sc.Read(make([]byte, 10)); errs <- err }()
	go func() { _, err := l.Accept(); errs <- err }()
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, b.Close())
	for range 2 {
		select {
		case err := <-errs:
			require.ErrorIs(t, err, net.ErrClosed)
		case <-time.After(5 * time.Second):
			t.Fatal("Close did not wake a blocked call")
		}
	}
	<-b.Done()
	require.ErrorIs(t, b.Err(), net.ErrClosed)
	_, err = b.Listen("tcp", ":81")
	require.ErrorIs(t, err, net.ErrClosed)
	_, err = b.Dial("tcp", "10.9.0.1:80")
	require.ErrorIs(t, err, net.ErrClosed)
	require.NoError(t, b.Close(), "a second Close")
	_ = c.Close()
	require.NoError(t, a.Close())
	require.NoError(t, devA.Close())
	require.NoError(t, devB.Close())
	goroutinesSettle(t, base)
}

// TestRemoved: the device taken back under load stops the Net by itself;
// the server's connection fails with an error matching nic.ErrRemoved,
// and no goroutine is left.
func TestRemoved(t *testing.T) {
	base := runtime.NumGoroutine()
	devA, devB, err := softnic.Pair(nic.Config{QueueSize: 64})
	require.NoError(t, err)
	a, err := New(devA, Config{Addrs: []netip.Prefix{addrA4}})
	require.NoError(t, err)
	b, err := New(devB, Config{Addrs: []netip.Prefix{addrB4}})
	require.NoError(t, err)
	l, err := b.Listen("tcp", ":80")
	require.NoError(t, err)
	werr := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			werr <- err
			return
		}
		defer c.Close()
		buf := make([]byte, 64<<10)
		for {
			if _, err := c.Write(buf); err != nil {
				werr <- err
				return
			}
		}
	}()
	c, err := a.Dial("tcp", "10.9.0.2:80")
	require.NoError(t, err)
	_, err = io.CopyN(io.Discard, c, 1<<20) // under load
	require.NoError(t, err)
	require.NoError(t, devB.Remove())
	select {
	case err := <-werr:
		require.ErrorIs(t, err, nic.ErrRemoved)
		t.Logf("server write after removal: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the server's write did not fail after the removal")
	}
	select {
	case <-b.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the Net did not stop")
	}
	require.ErrorIs(t, b.Err(), nic.ErrRemoved)
	_, err = l.Accept()
	require.ErrorIs(t, err, nic.ErrRemoved)
	require.NoError(t, b.Close())
	_ = c.Close()
	require.NoError(t, a.Close())
	require.NoError(t, devA.Close())
	goroutinesSettle(t, base)
}

func TestConfigErrors(t *testing.T) {
	devA, _, err := softnic.Pair(nic.Config{QueueSize: 16})
	require.NoError(t, err)
	for _, cfg := range []Config{
		{QueueLen: -1},
		{Addrs: []netip.Prefix{{}}},
		{Routes: []Route{{Dst: netip.MustParsePrefix("10.0.0.0/8"), Gateway: netip.MustParseAddr("fd00::1")}}},
	} {
		_, err := New(devA, cfg)
		require.ErrorIs(t, err, os.ErrInvalid, "%+v", cfg)
	}
	_, err = New(devA, Config{CPUs: []int{1 << 20}})
	require.Error(t, err)
	require.NoError(t, devA.Close())
	_, err = New(devA, Config{})
	require.ErrorIs(t, err, nic.ErrClosed)
	_ = errors.New
}

// lockedBuffer is a bytes.Buffer safe for the capture's writers.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// TestCapture: Config.Capture gets a pcap stream with both directions'
// frames, Ethernet headers first, cut to the snap length.
func TestCapture(t *testing.T) {
	var buf lockedBuffer
	p := newPair(t, func(c *Config) { c.Capture, c.CaptureSnapLen = &buf, 64 })
	l, err := p.b.Listen("tcp", ":7")
	require.NoError(t, err)
	defer l.Close()
	echo(l)
	c, err := p.a.Dial("tcp", "10.9.0.2:7")
	require.NoError(t, err)
	roundTrip(t, c, randBytes(t, 64<<10))
	require.NoError(t, c.Close())

	buf.mu.Lock()
	b := append([]byte(nil), buf.b.Bytes()...)
	buf.mu.Unlock()
	require.GreaterOrEqual(t, len(b), 24)
	require.Equal(t, uint32(0xa1b2c3d4), binary.LittleEndian.Uint32(b[0:]), "pcap magic")
	require.Equal(t, uint32(64), binary.LittleEndian.Uint32(b[16:]), "snap length")
	require.Equal(t, uint32(1), binary.LittleEndian.Uint32(b[20:]), "Ethernet link type")
	var rx, tx, long int
	for r := b[24:]; len(r) > 0; {
		require.GreaterOrEqual(t, len(r), 16)
		incl, orig := int(binary.LittleEndian.Uint32(r[8:])), int(binary.LittleEndian.Uint32(r[12:]))
		require.LessOrEqual(t, incl, 64)
		require.Equal(t, min(orig, 64), incl)
		require.GreaterOrEqual(t, len(r), 16+incl)
		f := r[16 : 16+incl]
		switch string(f[6:12]) { // the source MAC
		case string(p.devB.MAC()):
			tx++
		default:
			rx++
		}
		if orig > 1000 {
			long++
		}
		r = r[16+incl:]
	}
	require.NotZero(t, rx, "frames B received")
	require.NotZero(t, tx, "frames B sent")
	require.NotZero(t, long, "full-size segments, cut to 64 bytes")
	require.NoError(t, p.b.Stats().CaptureErr)
}

// TestDefaultQueueLen: by default each transmit queue holds a whole send
// buffer of one TCP connection in full-sized packets, so that a lone
// connection never loses a burst to its own qdisc; an explicit QueueLen is
// kept.
func TestDefaultQueueLen(t *testing.T) {
	require.Equal(t, 3018, defaultQueueLen(4<<20, 1500), "gVisor's 4 MiB send buffer at MTU 1500")
	require.Equal(t, DefaultQueueLen, defaultQueueLen(1<<20, 9000), "never below DefaultQueueLen")
	require.Equal(t, DefaultQueueLen, defaultQueueLen(4<<20, 60), "an MTU below the headers")
	for _, c := range []struct {
		cfg  Config
		want int
	}{
		{Config{CoreTransmit: true}, defaultQueueLen(4<<20, 1500)},
		{Config{CoreTransmit: true, TCPSendBuffer: BufferSizes{Max: 16 << 20}}, defaultQueueLen(16<<20, 1500)},
		{Config{CoreTransmit: true, QueueLen: 50}, 50},
	} {
		dev, peer, err := softnic.Pair(nic.Config{QueueSize: 16})
		require.NoError(t, err)
		n, err := New(dev, c.cfg)
		require.NoError(t, err)
		require.Equal(t, c.want, n.ep.tx[0].qlen, "%+v", c.cfg)
		require.NoError(t, n.Close())
		require.NoError(t, dev.Close())
		require.NoError(t, peer.Close())
	}
}
