package afxdp

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"net/http"
	"net/netip"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"unsafe"

	"github.com/miekg/dns"
	"github.com/stretchr/testify/require"
	vt "github.com/vfnic/vfnic/internal/vethtest"
	"github.com/vfnic/vfnic/netstack"
	"github.com/vfnic/vfnic/nic"
	"golang.org/x/sys/unix"
)

// TestNetstackHTTPDNS: an unmodified net/http server on netstack over an
// afxdp device on vfnic's end of a veth pair answers Linux's own curl in
// the peer's namespace: small pages, and a 4 MiB body whose digest
// matches (TCP through the XDP redirect and AF_XDP rings both ways). An
// unmodified github.com/miekg/dns server beside it gives busybox
// nslookup the A and AAAA records of a name (UDP).
func TestNetstackHTTPDNS(t *testing.T) {
	vt.NeedRoot(t)
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Skip("no curl: the Linux client of this test")
	}
	v := vt.New(t, 1)
	vt.IP(t, "-n", v.B, "addr", "add", "10.99.0.2/24", "dev", "vfx1")
	// Linux leaves a veth's TCP checksums to the "device" (CHECKSUM_PARTIAL):
	// through XDP they would reach netstack unfinished. As ethtool -K tx off.
	require.NoError(t, vt.In(v.B, func() error { return txChecksum("vfx1", false) }))
	dev := openIn(t, v.A, "vfx0", nic.Config{})
	n, err := netstack.New(dev, netstack.Config{Addrs: []netip.Prefix{netip.MustParsePrefix("10.99.0.1/24")}})
	require.NoError(t, err)
	defer n.Close()
	l, err := n.Listen("tcp", "10.99.0.1:80")
	require.NoError(t, err)
	big := bytes.Repeat([]byte("vfnic over AF_XDP\n"), 4<<20/18)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/big" {
			_, _ = w.Write(big)
			return
		}
		fmt.Fprintf(w, "hello %s\n", r.URL.Path)
	})}
	go func() { _ = srv.Serve(l) }()
	defer srv.Close()

	get := func(path string) []byte {
		out, err := exec.Command("ip", "netns", "exec", v.B, curl, "-sS", "--max-time", "20", "http://10.99.0.1"+path).Output()
		if ee, ok := err.(*exec.ExitError); ok {
			t.Logf("netstack %+v; device %+v", n.Stats(), dev.Stats())
			t.Fatalf("curl %s: %v: %s", path, err, ee.Stderr)
		}
		require.NoError(t, err)
		return out
	}
	for i := range 5 {
		require.Equal(t, fmt.Sprintf("hello /page%d\n", i), string(get(fmt.Sprintf("/page%d", i))))
	}
	body := get("/big")
	require.Equal(t, len(big), len(body))
	require.Equal(t, sha256.Sum256(big), sha256.Sum256(body))

	pc, err := n.ListenPacket("udp", "10.99.0.1:53")
	require.NoError(t, err)
	const name, a, aaaa = "vfnic.test.", "10.99.7.7", "2001:db8::7"
	dnsSrv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		m.Authoritative = true
		for _, qq := range q.Question {
			var rr dns.RR
			switch {
			case !strings.EqualFold(qq.Name, name):
			case qq.Qtype == dns.TypeA:
				rr, _ = dns.NewRR(qq.Name + " 60 IN A " + a)
			case qq.Qtype == dns.TypeAAAA:
				rr, _ = dns.NewRR(qq.Name + " 60 IN AAAA " + aaaa)
			}
			if rr != nil {
				m.Answer = append(m.Answer, rr)
			}
		}
		_ = w.WriteMsg(m)
	})}
	go func() { _ = dnsSrv.ActivateAndServe() }()
	defer dnsSrv.Shutdown()
	busybox, err := exec.LookPath("busybox")
	require.NoError(t, err, "busybox: its nslookup is the Linux client")
	out, err := exec.Command("ip", "netns", "exec", v.B, busybox, "nslookup", strings.TrimSuffix(name, "."), "10.99.0.1").CombinedOutput()
	t.Logf("nslookup:\n%s", out)
	require.NoError(t, err)
	require.Regexp(t, `Address:\s+`+regexp.QuoteMeta(a), string(out), "the A record")
	require.Regexp(t, `Address:\s+`+regexp.QuoteMeta(aaaa), string(out), "the AAAA record")

	st := n.Stats()
	t.Logf("netstack: %d frames in, %d out, %d dropped; device %s", st.RxFrames, st.TxFrames, st.RxDropped+st.TxDropped,
		strings.Join(dev.Info().Features, ","))
}

// txChecksum turns an interface's transmit checksum offload on or off
// (ETHTOOL_STXCSUM, what ethtool -K IF tx on|off does), in the calling
// thread's namespace.
func txChecksum(ifname string, on bool) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	val := struct{ cmd, data uint32 }{cmd: unix.ETHTOOL_STXCSUM}
	if on {
		val.data = 1
	}
	var ifr struct {
		name [unix.IFNAMSIZ]byte
		data uintptr
		_    [16]byte
	}
	copy(ifr.name[:], ifname)
	ifr.data = uintptr(unsafe.Pointer(&val))
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr))); e != 0 {
		return fmt.Errorf("ETHTOOL_STXCSUM on %s: %w", ifname, e)
	}
	return nil
}
