package pcapfilter

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/bpf"
)

// matches returns the names of the test frames expr accepts.
func matches(t testing.TB, frames []testFrame, expr string) []string {
	t.Helper()
	f, err := New(expr)
	require.NoError(t, err, expr)
	var got []string
	for _, fr := range frames {
		if f.Match(fr.data) {
			got = append(got, fr.name)
		}
	}
	return got
}

// filterCases are expressions and the test frames each accepts, worked
// out from pcap-filter(7); TestAgainstTcpdump checks the same expressions
// against libpcap itself where tcpdump is installed.
var filterCases = []struct {
	expr string
	want []string
}{
	{"", []string{"tcp4", "tcp4opts", "udp4", "udp4big", "icmp4", "arp", "rarp", "frag4", "sctp4", "tcp6", "udp6", "icmp6", "icmp6frag", "vlan100udp4", "vlan200tcp6", "qinq10-20udp4", "lldp", "short"}},
	{"ip", []string{"tcp4", "tcp4opts", "udp4", "udp4big", "icmp4", "frag4", "sctp4", "short"}},
	{"ip6", []string{"tcp6", "udp6", "icmp6", "icmp6frag"}},
	{"arp", []string{"arp"}},
	{"rarp", []string{"rarp"}},
	{"tcp", []string{"tcp4", "tcp4opts", "tcp6"}},
	{"udp", []string{"udp4", "udp4big", "frag4", "udp6"}},
	{"sctp", []string{"sctp4"}},
	{"icmp", []string{"icmp4"}},
	{"icmp6", []string{"icmp6", "icmp6frag"}},
	{"ip proto 17", []string{"udp4", "udp4big", "frag4"}},
	{"ip6 proto 58", []string{"icmp6", "icmp6frag"}},
	{`proto \udp`, []string{"udp4", "udp4big", "frag4", "udp6"}},
	{"host 10.0.0.1", []string{"tcp4", "udp4", "udp4big", "icmp4", "arp", "frag4", "sctp4"}},
	{"src host 10.0.0.1", []string{"tcp4", "udp4", "arp", "frag4", "sctp4"}},
	{"dst host 10.0.0.1", []string{"udp4big", "icmp4"}},
	{"ip host 10.0.0.2", []string{"tcp4", "tcp4opts", "frag4"}},
	{"arp host 10.0.0.2", []string{"arp"}},
	{"host 172.16.5.5", []string{"rarp"}},
	{"src and dst host 10.0.0.1", nil},
	{"src or dst host 10.0.0.3", []string{"icmp4"}},
	{"host 2001:db8::1", []string{"tcp6", "icmp6", "icmp6frag"}},
	{"dst host 2001:db8::1", []string{"icmp6", "icmp6frag"}},
	{"ip6 src host fe80::1", []string{"udp6"}},
	{"net 10.0.0.0/24", []string{"tcp4", "tcp4opts", "udp4", "udp4big", "icmp4", "arp", "rarp", "frag4", "sctp4"}},
	{"net 10.1", []string{"tcp4opts"}},
	{"dst net 192.168.0.0 mask 255.255.0.0", []string{"udp4"}},
	{"net 2001:db8::/32", []string{"tcp6", "icmp6", "icmp6frag"}},
	{"src net ff00::/8", nil},
	{"dst net ff00::/8", []string{"udp6"}},
	{"port 53", []string{"udp4"}},
	{"udp port 53", []string{"udp4"}},
	{"tcp port 53", nil},
	{"port 8080", []string{"tcp4opts"}},
	{"src port 8080", []string{"tcp4opts"}},
	{"dst port 8080", nil},
	{"port 443", []string{"tcp6"}},
	{"port 3868", []string{"sctp4"}},
	{"portrange 540-550", []string{"udp6"}},
	{"tcp portrange 79-81", []string{"tcp4"}},
	{"dst portrange 40000-40003", []string{"tcp4opts"}},
	{"port 80 or 443", []string{"tcp4", "tcp6"}},
	{"tcp dst port 80 or 443", []string{"tcp4", "tcp6"}},
	{"host 10.0.0.3 or 10.0.0.9", []string{"icmp4", "sctp4"}},
	{"vlan", []string{"vlan100udp4", "vlan200tcp6", "qinq10-20udp4"}},
	{"vlan 100", []string{"vlan100udp4"}},
	{"vlan 100 and udp", []string{"vlan100udp4"}},
	{"vlan 100 and port 53", []string{"vlan100udp4"}},
	{"vlan and ip6", []string{"vlan200tcp6"}},
	{"vlan 200 and host 2001:db8:1::1", []string{"vlan200tcp6"}},
	{"vlan 100 and tcp", nil},
	{"vlan 10 and vlan 20 and udp", []string{"qinq10-20udp4"}},
	{"vlan 20", nil},
	{"udp and vlan", nil}, // the tag is looked for at the untagged payload's place after udp: none
	{"ether host 02:00:00:00:00:0a", []string{"tcp4", "tcp4opts", "udp4", "udp4big", "icmp4", "arp", "rarp", "frag4", "sctp4", "tcp6", "udp6", "icmp6", "icmp6frag", "vlan100udp4", "vlan200tcp6", "qinq10-20udp4", "lldp", "short"}},
	{"ether src 02:00:00:00:00:0b", []string{"icmp4", "tcp6", "udp6", "icmp6", "icmp6frag", "vlan200tcp6"}},
	{"ether dst host 02:00:00:00:00:0b", []string{"tcp4", "tcp4opts", "udp4", "udp4big", "frag4", "sctp4", "vlan100udp4", "qinq10-20udp4", "short"}},
	{"ether broadcast", []string{"arp", "rarp"}},
	{"ether multicast", []string{"arp", "rarp", "lldp"}},
	{"ether proto 0x88cc", []string{"lldp"}},
	{`ether proto \arp`, []string{"arp"}},
	{"less 60", []string{"tcp4", "tcp4opts", "udp4", "icmp4", "arp", "rarp", "frag4", "sctp4", "lldp", "short"}}, // not padded to 60
	{"greater 1000", []string{"udp4big"}},
	{"less 70 and not arp and not ether proto 0x88cc", []string{"tcp4", "tcp4opts", "udp4", "icmp4", "rarp", "frag4", "sctp4", "udp6", "icmp6", "icmp6frag", "vlan100udp4", "short"}},
	{"not ip and not ip6 and not vlan", []string{"arp", "rarp", "lldp"}},
	{"! tcp && ! udp && (ip || ip6)", []string{"icmp4", "sctp4", "icmp6", "icmp6frag"}}, // short: the load past its end refuses it,
	{"icmp or arp and host 10.0.0.1", []string{"icmp4", "arp"}},                         // (icmp or arp) and host: left to right
	{"icmp or (arp and host 10.0.0.2)", []string{"icmp4", "arp"}},
	{"tcp and (port 80 or port 8080) and not src 10.0.0.1", []string{"tcp4opts"}},
}

func TestFilters(t *testing.T) {
	frames := testFrames(t)
	for _, tc := range filterCases {
		require.Equal(t, tc.want, matches(t, frames, tc.expr), "%q", tc.expr)
	}
}

// TestAgainstTcpdump runs every expression of filterCases through libpcap
// ('tcpdump -r in.pcap -w out.pcap EXPR') over the test frames and
// requires the same frames to pass. tcpdump is optional on the host: the
// test says so when it is missing (it is required under CI=true).
func TestAgainstTcpdump(t *testing.T) {
	tcpdump, err := exec.LookPath("tcpdump")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("tcpdump is not installed: apt-get install tcpdump")
		}
		t.Skip("tcpdump is not installed (apt-get install tcpdump): only the hand-worked expectations of TestFilters were checked")
	}
	frames := testFrames(t)
	dir := t.TempDir()
	in := filepath.Join(dir, "in.pcap")
	writePcap(t, in, frames)
	exprs := []string{}
	for _, tc := range filterCases {
		exprs = append(exprs, tc.expr)
	}
	// And some more, compared with libpcap only.
	exprs = append(exprs, "not vlan 100 or udp", "src or dst port 53 and not icmp", "ip6 and not dst net ff00::/8",
		"vlan 200 and ip6 src net 2001:db8:1::/48", "greater 42 and less 100", "src host 10.0.0.1 and (udp or tcp) and not dst port 80",
		"ether dst 02:00:00:00:00:0a and ip6", "ip proto 132", "proto 58", "net 0.0.0.0/0", "src net 2001:db8::/31",
		"vlan or arp", "multicast", "broadcast or less 20")
	for _, expr := range exprs {
		out := filepath.Join(dir, "out.pcap")
		args := []string{"-r", in, "-w", out}
		if expr != "" {
			args = append(args, expr)
		}
		res, err := exec.Command(tcpdump, args...).CombinedOutput()
		var want []string
		if bytes.Contains(res, []byte("expression rejects all packets")) {
			// libpcap's optimizer proves it and refuses the filter; it is
			// valid here, and must take nothing.
			require.Empty(t, matches(t, frames, expr), "%q", expr)
			continue
		}
		require.NoError(t, err, "tcpdump %q: %s", expr, res)
		for _, data := range readPcap(t, out) {
			i := slices.IndexFunc(frames, func(f testFrame) bool { return bytes.Equal(f.data, data) })
			require.GreaterOrEqual(t, i, 0)
			want = append(want, frames[i].name)
		}
		require.Equal(t, want, matches(t, frames, expr), "%q: libpcap's frames first", expr)
	}
}

func writePcap(t testing.TB, path string, frames []testFrame) {
	f, err := os.Create(path)
	require.NoError(t, err)
	defer f.Close()
	w := pcapgo.NewWriter(f)
	require.NoError(t, w.WriteFileHeader(Snaplen, layers.LinkTypeEthernet))
	for i, fr := range frames {
		ci := gopacket.CaptureInfo{Timestamp: time.Unix(int64(i), 0), CaptureLength: len(fr.data), Length: len(fr.data)}
		require.NoError(t, w.WritePacket(ci, fr.data))
	}
}

func readPcap(t testing.TB, path string) [][]byte {
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	r, err := pcapgo.NewReader(f)
	require.NoError(t, err)
	var out [][]byte
	for {
		data, _, err := r.ReadPacketData()
		if err != nil {
			return out
		}
		out = append(out, data)
	}
}

func TestSyntaxErrors(t *testing.T) {
	for _, tc := range []struct {
		expr string
		col  int
		want string
	}{
		{"tcp prot 80", 5, `want "and", "or" or the end of the expression, got "prot"`},
		{"prot 80", 1, `"prot" is not a primitive`},
		{"(tcp prot 80)", 6, `want "and", "or" or ")", got "prot" (did you mean "port"?)`},
		{"tcp prot 80", 5, `did you mean "port"?`},
		{"hots 10.0.0.1", 1, `did you mean "host"?`},
		{"host", 5, `want an IPv4 or IPv6 address after "host", got the end of the expression`},
		{"host and tcp", 6, `want an IPv4 or IPv6 address after "host", got "and"`},
		{"host example.com", 6, "names are not resolved"},
		{"host 02:00:00:00:00:0a", 6, "is a MAC address: say ether host"},
		{"host 10.0.0.256", 6, `want an IPv4 or IPv6 address after "host", got "10.0.0.256"`},
		{"ip6 host 10.0.0.1", 10, "is an IPv4 address: ip6 host wants IPv6"},
		{"ip host ::1", 9, "is an IPv6 address"},
		{"tcp host 10.0.0.1", 10, `"host" does not go with "tcp"`},
		{"port 70000", 6, "want a port number from 0 to 65535"},
		{"port http", 6, "service names are not resolved"},
		{"portrange 10", 11, "want a port range N-M"},
		{"ip port 80", 9, `"port" does not go with "ip"`},
		{"net 10.0.0.1/8", 5, "has bits set outside its /8 mask: did you mean 10.0.0.0/8?"},
		{"net 10.0.0.0 mask 255.0.255.0", 19, "contiguous ones"},
		{"net 1.2.3.4.5", 5, "want a network"},
		{"vlan 4096", 6, "a number from 0 to 4095"},
		{"vlan x", 6, "want a VLAN ID"},
		{"less", 5, "want a frame length"},
		{"ether", 6, "want host, src, dst, proto, broadcast or multicast after \"ether\""},
		{"ether host 10.0.0.1", 12, "want a MAC address"},
		{"ether proto 100", 13, "want an EtherType above 1500"},
		{"ip proto 300", 10, "IP protocol number from 0 to 255"},
		{"(tcp", 5, `want ")" to close the "(" at column 1`},
		{"tcp)", 4, `want "and", "or" or the end of the expression, got ")"`},
		{"(tcp or udp", 12, `want ")" to close`},
		{"tcp and", 8, "want a primitive"},
		{"and tcp", 1, "want a primitive"},
		{"not", 4, "want a primitive"},
		{"tcp udp", 5, `want "and", "or" or the end of the expression, got "udp"`},
		{"tcp & udp", 5, `'&' alone is not an operator`},
		{"tcp[13] & 2 != 0", 4, "packet-data accessors"},
		{"mask 255.0.0.0", 1, "goes after a network"},
		{"ip \x01", 4, "unexpected character"},
		{strings.Repeat("(", 300) + "tcp" + strings.Repeat(")", 300), 257, "nested more than 256 deep"},
	} {
		_, err := Compile(tc.expr, Snaplen)
		require.Error(t, err, "%q", tc.expr)
		require.ErrorIs(t, err, ErrSyntax, "%q", tc.expr)
		var se *SyntaxError
		require.ErrorAs(t, err, &se)
		require.Equal(t, tc.col, se.Offset+1, "%q: %v", tc.expr, err)
		require.Contains(t, err.Error(), tc.want, "%q", tc.expr)
		require.True(t, strings.HasPrefix(err.Error(), fmt.Sprintf("column %d: ", tc.col)), "%v", err)
		require.Equal(t, tc.expr+"\n"+strings.Repeat(" ", se.Offset)+"^", se.Caret())
	}
}

// TestLongJumps: a program longer than a conditional jump reaches (255
// instructions) is laid out with long jumps, and means what it says.
func TestLongJumps(t *testing.T) {
	var hosts []string
	for i := range 60 {
		hosts = append(hosts, fmt.Sprintf("10.0.1.%d", i))
	}
	expr := "udp and (host " + strings.Join(hosts, " or ") + " or 192.168.1.9) and port 53"
	f, err := New(expr)
	require.NoError(t, err)
	require.Greater(t, len(f.Program()), 600)
	var long bool
	for _, in := range f.Program() {
		if j, ok := in.(bpf.Jump); ok && j.Skip > 255 {
			long = true
		}
	}
	require.True(t, long, "the program needed long jumps")
	require.Equal(t, []string{"udp4"}, matches(t, testFrames(t), expr))
	require.Equal(t, expr, f.String())

	_, err = Compile("host "+strings.Repeat("10.0.0.1 or ", 400)+"10.0.0.2", Snaplen)
	require.ErrorIs(t, err, ErrTooLong)
}

// TestProgram: the code is libpcap's for a simple case (tcpdump -d 'ip
// proto 47').
func TestProgram(t *testing.T) {
	prog, err := Compile("ip proto 47", 65535)
	require.NoError(t, err)
	require.Equal(t, []bpf.Instruction{
		bpf.LoadAbsolute{Off: 12, Size: 2},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: 0x800, SkipFalse: 3},
		bpf.LoadAbsolute{Off: 23, Size: 1},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: 47, SkipFalse: 1},
		bpf.RetConstant{Val: 65535},
		bpf.RetConstant{Val: 0},
	}, prog)
	_, err = bpf.Assemble(prog)
	require.NoError(t, err, "the kernel could take it too")
}

func TestMatchAllocatesNothing(t *testing.T) {
	f, err := New("vlan 100 and udp port 53 or host 2001:db8::1")
	require.NoError(t, err)
	fr := testFrames(t)
	require.Zero(t, testing.AllocsPerRun(100, func() {
		for _, x := range fr {
			f.Match(x.data)
		}
	}))
}

func BenchmarkMatch(b *testing.B) {
	f, err := New("vlan 100 and udp port 53")
	require.NoError(b, err)
	fr := testFrames(b)[13].data
	for b.Loop() {
		f.Match(fr)
	}
}

// FuzzCompile: no expression panics the compiler; one it takes compiles
// to a program the VM and the kernel's assembler take, that runs on any
// frame, and whose negation never accepts a frame it accepts. (Both may
// refuse one: a load past the end of a short frame refuses it, in the
// kernel as here.)
func FuzzCompile(f *testing.F) {
	for _, tc := range filterCases {
		f.Add(tc.expr, []byte(nil))
	}
	for _, s := range []string{"tcp prot 80", "(((", "host 1.2.3.4 or", "vlan 1 and vlan 2 and vlan 3 and ip6", "net ::/0",
		"ether src 1:2:3:4:5:6", "portrange 9-1", `ether proto \ip6`, "less 0 || greater 4294967295"} {
		f.Add(s, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0, 0, 1, 0x81, 0, 0, 100, 0x08, 0})
	}
	frames := testFrames(f)
	f.Fuzz(func(t *testing.T, expr string, frame []byte) {
		flt, err := New(expr)
		if err != nil {
			var se *SyntaxError
			if !errors.As(err, &se) && !errors.Is(err, ErrTooLong) {
				t.Fatalf("%q: %v is neither a syntax error nor too long", expr, err)
			}
			if se != nil && (se.Offset < 0 || se.Offset > len(expr)) {
				t.Fatalf("%q: offset %d outside the expression", expr, se.Offset)
			}
			return
		}
		if _, err := bpf.Assemble(flt.Program()); err != nil {
			t.Fatalf("%q: %v", expr, err)
		}
		neg, err := New("not (" + expr + ")")
		if err != nil {
			return // nesting or length limits
		}
		for _, fr := range append(frames, testFrame{"fuzz", frame}) {
			if flt.Match(fr.data) && neg.Match(fr.data) {
				t.Fatalf("%q and its negation both accept %s", expr, fr.name)
			}
		}
	})
}
