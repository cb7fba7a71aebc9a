package netstackvm

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"math/big"
	mrand "math/rand/v2"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/require"

	"github.com/vfnic/vfnic/internal/ethtool"
	"github.com/vfnic/vfnic/internal/qmpask"
	"github.com/vfnic/vfnic/lcore"
	"github.com/vfnic/vfnic/netstack"
	"github.com/vfnic/vfnic/nic"
	_ "github.com/vfnic/vfnic/nic/igb"
	_ "github.com/vfnic/vfnic/nic/virtio"
	"github.com/vfnic/vfnic/qemu"
	"github.com/vfnic/vfnic/tests/leakcheck"
)

const (
	bigSize  = 16 << 20
	quicSize = 1 << 20
	dnsName  = "www.vfnic.test."
	dnsA     = "10.0.9.77"
	dnsAAAA  = "fd00:9::77"
	quicALPN = "vfnic-echo"
)

// repeat makes WgetHTTP fetch each URL that many times: a soak for
// stalls (TestVM passes VFNIC_NETSTACK_REPEAT on).
var repeat = flag.Int("netstack.repeat", 1, "fetches of each URL in WgetHTTP")

// servers are the unmodified Go servers on the netstack.
type servers struct {
	big     []byte
	bigSum  string
	http    *http.Server
	dns     *dns.Server
	quic    *quic.Listener
	writeMu sync.Mutex
	writeEr []error // the HTTP handlers' write errors
	done    sync.WaitGroup
}

func (s *servers) writeErrors() []error {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	return append([]error(nil), s.writeEr...)
}

// TestGuestNetstack opens the vfnic NIC, runs the stack and the servers on
// it, and checks each from the Linux side; the last check takes the device
// away under load.
func TestGuestNetstack(t *testing.T) {
	if !qemu.InGuest() {
		t.Skip("needs the guest's NICs: runs inside the QEMU guest booted by TestVM")
	}
	vf, lx := guestPair(t)
	ifc := linuxInterface(t, lx.GuestAddr())
	peerRings(t, ifc)
	// No duplicate address detection: the address works at once.
	sh(t, fmt.Sprintf("echo 0 > /proc/sys/net/ipv6/conf/%s/accept_dad && ip -6 addr add %s dev %s", ifc, linuxIP6, ifc))

	before, err := leakcheck.Snapshot()
	require.NoError(t, err)
	ctx := t.Context()
	dev, err := nic.Open(ctx, vf.GuestAddr(), nic.Config{})
	require.NoError(t, err)
	t.Logf("vfnic NIC: %s (%s), MTU %d", dev.Info().Model, vf.GuestAddr(), dev.Info().MTU)
	addrs := []netip.Prefix{netip.MustParsePrefix(vfnicIP4 + "/24"), netip.MustParsePrefix(vfnicIP6 + "/64")}
	big, bigSum := bigBody()
	// Only igb has checksum offloads here: QEMU offers virtio-net's only
	// to a backend with virtio-net headers (tap), not to its hub.
	if dev.Info().Driver == "igb" && !t.Run("ChecksumOffloadsOff", func(t *testing.T) { offloadsOff(t, dev, addrs, big, bigSum, ifc) }) {
		_ = dev.Close()
		t.FailNow()
	}
	capt := newCapture(4096)
	n, err := netstack.New(dev, netstack.Config{
		Addrs:   []netip.Prefix{netip.MustParsePrefix(vfnicIP4 + "/24"), netip.MustParsePrefix(vfnicIP6 + "/64")},
		Capture: capt, CaptureSnapLen: 96,
	})
	require.NoError(t, err)
	o := n.Offloads()
	rxo, txo := o.RxChecksum, o.TxChecksum
	t.Logf("netstack: link MTU %d; offloads %+v", n.MTU(), o)
	if dev.Info().Driver == "igb" {
		require.True(t, rxo && txo, "igb's checksum offloads in use")
	}
	dg := &diag{n: n, dev: dev, cap: capt, ifc: ifc}
	srv := startServers(t, n, big, bigSum)
	stopMon := monitor(t, n, dev)
	defer func() { stopMon() }()

	ok := t.Run("WgetHTTP", func(t *testing.T) {
		urls := []string{"http://" + vfnicIP4 + "/big", "http://[" + vfnicIP6 + "]/big"}
		for i := 1; i < *repeat; i++ {
			urls = append(urls, urls[:2]...)
		}
		nicStats, tcpStats := n.Stack().Stats().NICs, n.Stack().Stats().TCP
		for _, u := range urls {
			start := time.Now()
			drops0, rto0 := nicStats.TxPacketsDroppedNoBufferSpace.Value(), tcpStats.Timeouts.Value()
			sum := dg.wget(t, u)
			// Losses of the server's own (its qdisc's) and the
			// retransmission timeouts they cost (package netstack's doc).
			t.Logf("wget %s: %d bytes in %v; qdisc drops %d, TCP timeouts %d", u, bigSize, time.Since(start).Round(time.Millisecond),
				nicStats.TxPacketsDroppedNoBufferSpace.Value()-drops0, tcpStats.Timeouts.Value()-rto0)
			require.Equal(t, srv.bigSum, strings.Fields(sum)[0], "SHA-256 of the body wget fetched from %s", u)
		}
		if rxo || txo {
			st := n.Stats()
			t.Logf("checksums: %d frames received with the device's verdict (%d bad), %d sent with the device's checksum",
				st.RxChecksumDevice, st.RxChecksumBad, st.TxChecksumDevice)
			require.NotZero(t, st.RxChecksumDevice, "frames the device verified")
			require.NotZero(t, st.TxChecksumDevice, "frames the device checksummed")
		}
	})
	if !ok {
		// Tell a stall of the adaptive core's sleep from one elsewhere:
		// the same fetch on a busy-polling core.
		stopMon()
		require.NoError(t, n.Close())
		n, err = netstack.New(dev, netstack.Config{
			Mode:  lcore.Busy,
			Addrs: []netip.Prefix{netip.MustParsePrefix(vfnicIP4 + "/24"), netip.MustParsePrefix(vfnicIP6 + "/64")},
		})
		require.NoError(t, err)
		stopMon = monitor(t, n, dev)
		l, err := n.Listen("tcp", ":80")
		require.NoError(t, err)
		go func() { _ = http.Serve(l, srv.http.Handler) }()
		sum := sh(t, "wget -q -O - http://"+vfnicIP4+"/big | sha256sum")
		t.Logf("busy core: wget got sha256 %s (want %s)", strings.Fields(sum)[0], srv.bigSum)
		stopMon()
		_ = n.Close()
		_ = dev.Close()
		t.FailNow()
	}
	ok = t.Run("Nslookup", func(t *testing.T) {
		a := sh(t, "nslookup -type=A "+dnsName+" "+vfnicIP4)
		require.Contains(t, a, "Address: "+dnsA, "A record")
		aaaa := sh(t, "nslookup -type=AAAA "+dnsName+" "+vfnicIP4)
		require.Contains(t, aaaa, "Address: "+dnsAAAA, "AAAA record")
		t.Logf("nslookup: %s A %s, AAAA %s", dnsName, dnsA, dnsAAAA)
	}) && ok
	ok = t.Run("QUICEcho", func(t *testing.T) { quicEcho(t) }) && ok
	ok = t.Run("HTTPSequential", func(t *testing.T) {
		tr := &http.Transport{DisableKeepAlives: true}
		defer tr.CloseIdleConnections()
		cl := &http.Client{Transport: tr, Timeout: 10 * time.Second}
		start := time.Now()
		for i := range 1000 {
			require.NoError(t, getSmall(cl, fmt.Sprintf("http://%s/small?i=%d", vfnicIP4, i)), "request %d", i)
		}
		t.Logf("1000 sequential requests, one connection each: %v, 0 errors", time.Since(start).Round(time.Millisecond))
	}) && ok
	ok = t.Run("HTTPConcurrent", func(t *testing.T) {
		start := time.Now()
		var wg sync.WaitGroup
		errs := make(chan error, 100)
		for c := range 100 {
			wg.Go(func() {
				tr := &http.Transport{}
				defer tr.CloseIdleConnections()
				cl := &http.Client{Transport: tr, Timeout: 30 * time.Second}
				for i := range 5 {
					if err := getSmall(cl, fmt.Sprintf("http://%s/small?c=%d&i=%d", vfnicIP4, c, i)); err != nil {
						errs <- fmt.Errorf("connection %d request %d: %w", c, i, err)
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		t.Logf("100 concurrent connections, 5 requests each: %v", time.Since(start).Round(time.Millisecond))
	}) && ok
	ok = t.Run("DropOneIn100", func(t *testing.T) {
		before := n.Stats()
		retrans := n.Stack().Stats().TCP.Retransmits.Value()
		n.SetDropEvery(100)
		defer n.SetDropEvery(0)
		start := time.Now()
		sum := dg.wget(t, "http://"+vfnicIP4+"/big")
		require.Equal(t, srv.bigSum, strings.Fields(sum)[0], "SHA-256 of the body fetched with 1 frame in 100 dropped")
		after := n.Stats()
		rt := n.Stack().Stats().TCP.Retransmits.Value() - retrans
		t.Logf("16 MiB with 1 in 100 dropped: %v; %d frames dropped received, %d sent; %d TCP retransmits",
			time.Since(start).Round(time.Millisecond), after.RxDropped-before.RxDropped, after.TxDropped-before.TxDropped, rt)
		require.Greater(t, after.TxDropped-before.TxDropped, uint64(50), "frames dropped on purpose")
		require.NotZero(t, rt, "TCP retransmitted what was dropped")
	}) && ok
	if !ok {
		_ = n.Close()
		_ = dev.Close()
		t.FailNow()
	}
	t.Run("Removed", func(t *testing.T) { removed(t, n, dev, vf.GuestAddr(), srv, before) })
}

// bigBody is the 16 MiB body the HTTP server sends, and its SHA-256.
func bigBody() ([]byte, string) {
	b := make([]byte, bigSize)
	r := mrand.NewChaCha8([32]byte{1, 2, 3})
	_, _ = r.Read(b)
	sum := sha256.Sum256(b)
	return b, hex.EncodeToString(sum[:])
}

// offloadsOff runs a stack with the device's checksum offloads turned off
// (where it has them) for one 16 MiB fetch: the stack computes and
// verifies every checksum itself, and the device is asked for none.
func offloadsOff(t *testing.T, dev nic.Device, addrs []netip.Prefix, big []byte, bigSum, ifc string) {
	capt := newCapture(256)
	n, err := netstack.New(dev, netstack.Config{Addrs: addrs, NoRxChecksumOffload: true, NoTxChecksumOffload: true,
		Capture: capt, CaptureSnapLen: 96})
	require.NoError(t, err)
	o := n.Offloads()
	require.False(t, o.RxChecksum || o.TxChecksum, "offloads turned off")
	l, err := n.Listen("tcp", ":80")
	require.NoError(t, err)
	served := make(chan error, 1)
	go func() {
		served <- http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", fmt.Sprint(len(big)))
			_, _ = w.Write(big)
		}))
	}()
	dg := &diag{n: n, dev: dev, cap: capt, ifc: ifc}
	start := time.Now()
	sum := dg.wget(t, "http://"+vfnicIP4+"/big")
	require.Equal(t, bigSum, strings.Fields(sum)[0], "SHA-256 of the body fetched with checksum offloads off")
	st := n.Stats()
	t.Logf("offloads off: 16 MiB in %v; %d frames received, %d sent, none with the device's checksums",
		time.Since(start).Round(time.Millisecond), st.RxFrames, st.TxFrames)
	require.Zero(t, st.RxChecksumDevice+st.TxChecksumDevice, "frames with the device's checksums")
	require.NoError(t, n.Close())
	require.Error(t, <-served, "Serve ends with the Net")
}

// startServers runs net/http, a miekg/dns server and a quic-go echo
// server on n.
func startServers(t *testing.T, n *netstack.Net, big []byte, bigSum string) *servers {
	s := &servers{big: big, bigSum: bigSum}

	mux := http.NewServeMux()
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(len(s.big)))
		if _, err := w.Write(s.big); err != nil {
			s.writeMu.Lock()
			s.writeEr = append(s.writeEr, err)
			s.writeMu.Unlock()
		}
	})
	mux.HandleFunc("/small", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "vfnic "+r.URL.RawQuery+"\n")
	})
	l, err := n.Listen("tcp", ":80")
	require.NoError(t, err)
	s.http = &http.Server{Handler: mux}
	s.done.Go(func() { _ = s.http.Serve(l) })

	pc, err := n.ListenPacket("udp", ":53")
	require.NoError(t, err)
	s.dns = &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		m.Authoritative = true
		for _, qq := range q.Question {
			if !strings.EqualFold(qq.Name, dnsName) {
				continue
			}
			switch qq.Qtype {
			case dns.TypeA:
				rr, _ := dns.NewRR(qq.Name + " 60 IN A " + dnsA)
				m.Answer = append(m.Answer, rr)
			case dns.TypeAAAA:
				rr, _ := dns.NewRR(qq.Name + " 60 IN AAAA " + dnsAAAA)
				m.Answer = append(m.Answer, rr)
			}
		}
		_ = w.WriteMsg(m)
	})}
	s.done.Go(func() { _ = s.dns.ActivateAndServe() })

	qpc, err := n.ListenPacket("udp", ":4433")
	require.NoError(t, err)
	s.quic, err = quic.Listen(qpc, serverTLS(t), &quic.Config{})
	require.NoError(t, err)
	s.done.Go(func() {
		for {
			c, err := s.quic.Accept(context.Background())
			if err != nil {
				return
			}
			go func() {
				st, err := c.AcceptStream(context.Background())
				if err != nil {
					return
				}
				_, _ = io.Copy(st, st)
				_ = st.Close()
			}()
		}
	})
	return s
}

// quicEcho: a quic-go client on the Linux side echoes 1 MiB through the
// quic-go server on vfnic.
func quicEcho(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	start := time.Now()
	c, err := quic.DialAddr(ctx, vfnicIP4+":4433", &tls.Config{InsecureSkipVerify: true, NextProtos: []string{quicALPN}}, &quic.Config{})
	require.NoError(t, err)
	defer c.CloseWithError(0, "done")
	st, err := c.OpenStreamSync(ctx)
	require.NoError(t, err)
	msg := make([]byte, quicSize)
	_, _ = rand.Read(msg)
	werr := make(chan error, 1)
	go func() {
		_, err := st.Write(msg)
		if err == nil {
			err = st.Close()
		}
		werr <- err
	}()
	got, err := io.ReadAll(st)
	require.NoError(t, err)
	require.NoError(t, <-werr)
	require.True(t, bytes.Equal(msg, got), "1 MiB echoed through QUIC: %d bytes back", len(got))
	t.Logf("QUIC echo of 1 MiB: %v", time.Since(start).Round(time.Millisecond))
}

// removed takes the device away under load: the kernel unbinds it from
// vfio-pci while Linux clients download. The server's writes fail with an
// error matching nic.ErrRemoved, the Net stops by itself, every server
// returns, and no goroutine, fd or mapping of the stack is left.
func removed(t *testing.T, n *netstack.Net, dev nic.Device, addr string, s *servers, before leakcheck.Resources) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var clients sync.WaitGroup
	for range 4 {
		clients.Go(func() {
			tr := &http.Transport{}
			defer tr.CloseIdleConnections()
			cl := &http.Client{Transport: tr}
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+vfnicIP4+"/big", nil)
				resp, err := cl.Do(req)
				if err != nil {
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			}
		})
	}
	time.Sleep(2 * time.Second) // downloads under way
	unbound := make(chan error, 1)
	go func() {
		unbound <- os.WriteFile("/sys/bus/pci/drivers/vfio-pci/unbind", []byte(addr), 0)
	}()
	select {
	case <-n.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the Net did not stop after the device was unbound")
	}
	t.Logf("Net stopped: %v", n.Err())
	require.ErrorIs(t, n.Err(), nic.ErrRemoved)
	select {
	case err := <-unbound:
		require.NoError(t, err, "unbind")
	case <-time.After(30 * time.Second):
		t.Fatal("the kernel's unbind did not return: the device was not released")
	}
	// The servers return on their own.
	served := make(chan struct{})
	go func() { s.done.Wait(); close(served) }()
	select {
	case <-served:
	case <-time.After(10 * time.Second):
		t.Fatal("a server did not return after the device was removed")
	}
	errs := s.writeErrors()
	require.NotEmpty(t, errs, "a download was cut by the removal")
	for _, err := range errs {
		require.ErrorIs(t, err, nic.ErrRemoved, "a handler's write error")
	}
	t.Logf("%d handler writes failed, e.g.: %v", len(errs), errs[len(errs)-1])
	cancel()
	clients.Wait()
	_ = s.quic.Close()
	require.NoError(t, n.Close())
	_ = dev.Close()
	// No goroutine of the stack, its cores or its servers is left.
	deadline := time.Now().Add(5 * time.Second)
	for {
		buf := make([]byte, 1<<20)
		stacks := string(buf[:runtime.Stack(buf, true)])
		left := ""
		for _, g := range strings.Split(stacks, "\n\n") {
			if strings.Contains(g, "gvisor.dev/") || strings.Contains(g, "vfnic/lcore") || strings.Contains(g, "vfnic/netstack") || strings.Contains(g, "quic-go") {
				left += g + "\n\n"
			}
		}
		if left == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("goroutines left after the removal:\n%s", left)
		}
		time.Sleep(50 * time.Millisecond)
	}
	var after leakcheck.Resources
	for range 50 {
		var err error
		after, err = leakcheck.Snapshot()
		require.NoError(t, err)
		if after == before {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	require.Equal(t, before, after, "fds and DMA mappings after the removal")
}

// monitor logs the stack's, the device's and TCP's counters every 5
// seconds, so that a stall shows where it is.
func monitor(t *testing.T, n *netstack.Net, dev nic.Device) func() {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tk := time.NewTicker(5 * time.Second)
		defer tk.Stop()
		for {
			select {
			case <-done:
				return
			case <-tk.C:
			}
			st := n.Stats()
			ds := dev.Stats()
			tcp := n.Stack().Stats().TCP
			tq, _ := dev.Tx(0)
			rq, _ := dev.Rx(0)
			t.Logf("monitor: stack %+v; device rx %+v tx %+v; rx outstanding %d (%s), tx outstanding %d (%s); tcp sent %d rcvd %d retrans %d timeouts %d",
				st, ds.Rx, ds.Tx, rq.Outstanding(), ready(rq), tq.Outstanding(), ready(tq), tcp.SegmentsSent.Value(), tcp.ValidSegmentsReceived.Value(),
				tcp.Retransmits.Value(), tcp.Timeouts.Value())
		}
	})
	var once sync.Once
	return func() { once.Do(func() { close(done); wg.Wait() }) }
}

// ready says how many completions the device wrote that nobody read yet
// (nic/virtio's Ready): on a queue whose core sleeps, a non-zero count is
// a lost interrupt, zero a device that delivers nothing.
func ready(q nic.Queue) string {
	r, ok := q.(interface{ Ready(int) int })
	if !ok {
		return "ready unknown"
	}
	return fmt.Sprintf("%d ready", r.Ready(q.Size()))
}

func getSmall(cl *http.Client, u string) error {
	resp, err := cl.Get(u)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != 200 || !strings.HasPrefix(string(b), "vfnic ") {
		return fmt.Errorf("status %d, body %q", resp.StatusCode, b)
	}
	return nil
}

// sh runs a shell command line in the guest and returns its output.
func sh(t *testing.T, cmd string) string {
	t.Helper()
	out, err := run(t.Context(), cmd)
	require.NoError(t, err, "%s:\n%s", cmd, out)
	return out
}

// run runs a shell command line in the guest for up to shTimeout.
func run(ctx context.Context, cmd string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, shTimeout)
	defer cancel()
	c := exec.CommandContext(ctx, "sh", "-c", "set -o pipefail; "+cmd)
	c.WaitDelay = 2 * time.Second // wget keeps the pipe open when sh is killed
	out, err := c.CombinedOutput()
	return string(out), err
}

const (
	shTimeout = 45 * time.Second
	// stallAfter: a 16 MiB fetch not done by then is logged with what
	// each side says, once and again stallAfter later.
	stallAfter = 15 * time.Second
)

// diag is what a stalled transfer is explained with: the stack, its
// capture, and Linux's interface.
type diag struct {
	n   *netstack.Net
	dev nic.Device
	cap *capture
	ifc string
}

// wget fetches url with busybox wget and returns the SHA-256 of the body.
// While it runs longer than stallAfter, it logs both sides' state.
func (d *diag) wget(t *testing.T, url string) string {
	t.Helper()
	cmd := "wget -q -O - " + url + " | sha256sum"
	type result struct {
		out string
		err error
	}
	res := make(chan result, 1)
	go func() {
		out, err := run(t.Context(), cmd)
		res <- result{out, err}
	}()
	tk := time.NewTicker(stallAfter)
	defer tk.Stop()
	for {
		select {
		case r := <-res:
			if r.err != nil {
				t.Logf("%s failed:\n%s", cmd, d.dump())
			}
			require.NoError(t, r.err, "%s:\n%s", cmd, r.out)
			return r.out
		case <-tk.C:
			t.Logf("%s still running after %v:\n%s", cmd, stallAfter, d.dump())
		}
	}
}

// dump describes both sides now.
func (d *diag) dump() string {
	st := d.n.Stats()
	ds := d.dev.Stats()
	tq, _ := d.dev.Tx(0)
	rq, _ := d.dev.Rx(0)
	s := fmt.Sprintf("  endpoint %+v\n  device rx %+v tx %+v; rx outstanding %d (%s), tx outstanding %d (%s)\n",
		st, ds.Rx, ds.Tx, rq.Outstanding(), ready(rq), tq.Outstanding(), ready(tq))
	s += stackDiag(d.n) + linuxDiag(d.ifc)
	if d.dev.Info().Driver == "virtio" {
		// QEMU's view of the Linux NIC's first transmit queue and of
		// vfnic's receive queue, in the host's log.
		qmpask.Ask("status", slotLinux, 1)
		qmpask.Ask("status", slotVfnic, 0)
	}
	if d.cap != nil {
		s += d.cap.tail(80, d.dev.MAC())
	}
	return s
}

// linuxInterface is the name of the network interface Linux made for the
// PCI device at addr (virtio-net's sits under its virtio device).
func linuxInterface(t *testing.T, addr string) string {
	m, err := filepath.Glob("/sys/bus/pci/devices/" + addr + "/net/*")
	require.NoError(t, err)
	if len(m) == 0 {
		m, err = filepath.Glob("/sys/bus/pci/devices/" + addr + "/virtio*/net/*")
		require.NoError(t, err)
	}
	require.Len(t, m, 1, "Linux's interface on %s", addr)
	return filepath.Base(m[0])
}

// peerRings gives Linux's NIC its largest receive ring. QEMU's igb drops
// a frame silently (ICR.RXO, no counter) when the ring of the queue it
// steers to is empty, which happens whenever the guest's NAPI falls
// behind a burst under TCG with the default 256 descriptors; such a burst
// loss sets off the crawl of gVisor's RACK recovery (package netstack's
// doc), which would stall the fetches here for reasons of the peer's.
// DropOneIn100 tests loss recovery on purpose.
func peerRings(t *testing.T, ifc string) {
	t.Helper()
	r, err := ethtool.GetRings(ifc)
	require.NoError(t, err)
	if r.Rx < r.RxMax {
		require.NoError(t, ethtool.SetRings(ifc, r.RxMax, r.Tx))
		// The driver restarts the interface: wait for its link.
		require.Eventually(t, func() bool {
			b, err := os.ReadFile("/sys/class/net/" + ifc + "/carrier")
			return err == nil && strings.TrimSpace(string(b)) == "1"
		}, 20*time.Second, 50*time.Millisecond, "%s's link after its ring resize", ifc)
	}
	t.Logf("Linux's %s: receive ring %d descriptors (was %d), transmit %d", ifc, r.RxMax, r.Rx, r.Tx)
}

// serverTLS is a TLS config with a fresh self-signed certificate.
func serverTLS(t *testing.T) *tls.Config {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), DNSNames: []string{"vfnic"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}, NextProtos: []string{quicALPN}}
}

// guestPair returns the guest's two NICs: vfnic's (vf) and the one left
// to Linux (lx).
func guestPair(t *testing.T) (vf, lx qemu.NIC) {
	t.Helper()
	nics, err := qemu.GuestNICs()
	require.NoError(t, err)
	for _, n := range nics {
		switch n.Bind {
		case qemu.BindLinux:
			lx = n
		default:
			vf = n
		}
	}
	return vf, lx
}
