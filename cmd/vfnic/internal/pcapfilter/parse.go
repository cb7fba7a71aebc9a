package pcapfilter

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	suggestpkg "github.com/vfnic/vfnic/cmd/vfnic/internal/suggest"
	"golang.org/x/net/bpf"
)

// Offsets and values of the headers the primitives read.
const (
	ethHeader = 14 // the link-layer payload of an untagged frame

	etherIPv4 = 0x0800
	etherARP  = 0x0806
	etherRARP = 0x8035
	etherIPv6 = 0x86dd

	protoICMP     = 1
	protoTCP      = 6
	protoUDP      = 17
	protoFragment = 44 // IPv6 fragment header
	protoICMPv6   = 58
	protoSCTP     = 132
)

// vlanTPIDs are the tag types "vlan" recognizes, as libpcap: 802.1Q,
// 802.1ad and the pre-standard QinQ 0x9100.
var vlanTPIDs = []uint32{0x8100, 0x88a8, 0x9100}

var (
	protoWords = map[string]bool{"ether": true, "ip": true, "ip6": true, "arp": true, "rarp": true,
		"tcp": true, "udp": true, "sctp": true, "icmp": true, "icmp6": true}
	dirWords  = map[string]bool{"src": true, "dst": true}
	kindWords = map[string]bool{"host": true, "net": true, "port": true, "portrange": true, "proto": true}
	// otherWords are the rest of the keywords: none is a value.
	otherWords = map[string]bool{"vlan": true, "less": true, "greater": true, "broadcast": true, "multicast": true,
		"mask": true, "and": true, "or": true, "not": true}
	// ipProtoNames are the names "proto" takes (libpcap wants them
	// escaped, \tcp, where they are keywords; both forms work here).
	ipProtoNames = map[string]uint32{"icmp": protoICMP, "igmp": 2, "tcp": protoTCP, "udp": protoUDP,
		"icmp6": protoICMPv6, "gre": 47, "esp": 50, "ah": 51, "sctp": protoSCTP}
	etherProtoNames = map[string]uint32{"ip": etherIPv4, "ip6": etherIPv6, "arp": etherARP, "rarp": etherRARP}
)

func isKeyword(s string) bool {
	return protoWords[s] || dirWords[s] || kindWords[s] || otherWords[s]
}

// keywords, for the "did you mean" of an unknown word.
func keywords() []string {
	var ks []string
	for _, m := range []map[string]bool{protoWords, dirWords, kindWords, otherWords} {
		for k := range m {
			ks = append(ks, k)
		}
	}
	return ks
}

// qual are a primitive's qualifiers: protocol, direction, kind.
type qual struct {
	proto, dir, kind string
}

type parser struct {
	expr string
	toks []token
	i    int
	link uint32 // offset of the link-layer payload: 14, plus 4 per vlan before
	last *qual  // the last primitive's qualifiers, for a bare value
}

func (p *parser) peek() (token, bool) {
	if p.i < len(p.toks) {
		return p.toks[p.i], true
	}
	return token{}, false
}

func (p *parser) peekIs(words ...string) bool {
	t, ok := p.peek()
	if !ok {
		return false
	}
	for _, w := range words {
		if t.text == w {
			return true
		}
	}
	return false
}

func (p *parser) next() token { t := p.toks[p.i]; p.i++; return t }

func (p *parser) errAt(t token, format string, args ...any) error {
	return &SyntaxError{Expr: p.expr, Offset: t.pos, Msg: fmt.Sprintf(format, args...)}
}

func (p *parser) errEnd(format string, args ...any) error {
	return &SyntaxError{Expr: p.expr, Offset: len(p.expr), Msg: fmt.Sprintf(format, args...)}
}

// want returns the next token as a value for what follows after, or an
// error saying what was wanted.
func (p *parser) want(what, after string) (token, error) {
	t, ok := p.peek()
	if !ok {
		return t, p.errEnd("want %s after %q, got the end of the expression", what, after)
	}
	if t.text == "(" || t.text == ")" || t.text == "!" || t.text == "&&" || t.text == "||" ||
		(isKeyword(t.text) && !strings.HasPrefix(what, "a protocol")) {
		return t, p.errAt(t, "want %s after %q, got %q", what, after, t.text)
	}
	return p.next(), nil
}

// parseExpr: unary { (and|or) unary }, left to right with equal
// precedence, as libpcap.
func (p *parser) parseExpr(depth int) (node, error) {
	n, err := p.parseUnary(depth)
	if err != nil {
		return nil, err
	}
	for {
		t, ok := p.peek()
		if !ok {
			return n, nil
		}
		var isAnd bool
		switch t.text {
		case "and", "&&":
			isAnd = true
		case "or", "||":
		default:
			return n, nil
		}
		p.next()
		m, err := p.parseUnary(depth)
		if err != nil {
			return nil, err
		}
		if isAnd {
			n = andNode{n, m}
		} else {
			n = orNode{n, m}
		}
	}
}

func (p *parser) parseUnary(depth int) (node, error) {
	t, ok := p.peek()
	if !ok {
		return nil, p.errEnd("want a primitive (host, net, port, a protocol, vlan, ether, less, greater), \"not\" or \"(\", got the end of the expression")
	}
	if depth >= maxDepth {
		return nil, p.errAt(t, "nested more than %d deep", maxDepth)
	}
	switch t.text {
	case "not", "!":
		p.next()
		n, err := p.parseUnary(depth + 1)
		if err != nil {
			return nil, err
		}
		return notNode{n}, nil
	case "(":
		p.next()
		n, err := p.parseExpr(depth + 1)
		if err != nil {
			return nil, err
		}
		c, ok := p.peek()
		if !ok {
			return nil, p.errEnd("want \")\" to close the \"(\" at column %d, got the end of the expression", t.pos+1)
		}
		if c.text != ")" {
			return nil, p.errAt(c, "want \"and\", \"or\" or \")\", got %q%s", c.text, p.misspelt(c))
		}
		p.next()
		return n, nil
	}
	return p.parsePrimitive()
}

func (p *parser) parsePrimitive() (node, error) {
	t := p.next()
	switch t.text {
	case ")", "&&", "||", "and", "or":
		return nil, p.errAt(t, "want a primitive (host, net, port, a protocol, vlan, ether, less, greater), \"not\" or \"(\", got %q", t.text)
	case "vlan":
		return p.parseVLAN()
	case "less", "greater":
		v, err := p.number(t.text, "a frame length", 0xffffffff)
		if err != nil {
			return nil, err
		}
		l := bpf.LoadExtension{Num: bpf.ExtLen}
		if t.text == "less" {
			return notNode{cmpNode{load: l, cond: bpf.JumpGreaterThan, val: v}}, nil
		}
		return cmpNode{load: l, cond: bpf.JumpGreaterOrEqual, val: v}, nil
	case "broadcast":
		return etherAddr(0, net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}), nil
	case "multicast":
		return etherMulticast(), nil
	case "mask":
		return nil, p.errAt(t, "\"mask\" goes after a network: net 10.0.0.0 mask 255.0.0.0")
	}
	p.i-- // t starts the qualifiers, or is a bare value

	var q qual
	if protoWords[t.text] {
		q.proto = p.next().text
		if q.proto == "ether" {
			return p.parseEther()
		}
	}
	if t, ok := p.peek(); ok && dirWords[t.text] {
		q.dir = p.parseDir()
	}
	if t, ok := p.peek(); ok && kindWords[t.text] {
		q.kind = p.next().text
	}
	switch {
	case q.proto != "" && q.dir == "" && q.kind == "":
		return p.protoPrimitive(q.proto), nil
	case q.proto == "" && q.dir == "" && q.kind == "":
		// A bare value: the qualifiers of the primitive before it, or host.
		v := p.next()
		if p.last != nil {
			q = *p.last
		} else {
			q.kind = "host"
		}
		if !looksLikeValue(v.text) {
			return nil, p.errAt(v, "%q is not a primitive (host, net, port, portrange, proto, a protocol, vlan, ether, less, greater) nor an address%s",
				v.text, suggest(v.text, keywords()))
		}
		return p.build(q, v)
	}
	if q.kind == "" {
		q.kind = "host"
	}
	what := map[string]string{"host": "an IPv4 or IPv6 address", "net": "a network (10.0.0.0/8, 10.1, fe80::/10)",
		"port": "a port number", "portrange": "a port range (N-M)", "proto": "a protocol number or name"}[q.kind]
	after := q.kind
	v, err := p.want(what, after)
	if err != nil {
		return nil, err
	}
	return p.build(q, v)
}

// misspelt returns a "did you mean" for a word in the place of a
// keyword, or "".
func (p *parser) misspelt(t token) string {
	if isKeyword(t.text) || looksLikeValue(t.text) {
		return ""
	}
	return suggest(t.text, keywords())
}

// looksLikeValue: a word that could be an address, a network, a number
// or a range (it holds a digit or a colon), not a misspelt keyword.
func looksLikeValue(s string) bool {
	return strings.ContainsAny(s, "0123456789:")
}

// parseDir reads src, dst, "src or dst", "src and dst" (either order).
func (p *parser) parseDir() string {
	d := p.next().text
	if p.i+1 < len(p.toks) {
		op, other := p.toks[p.i].text, p.toks[p.i+1].text
		if dirWords[other] && other != d {
			switch op {
			case "or", "||":
				p.i += 2
				return "src or dst"
			case "and", "&&":
				p.i += 2
				return "src and dst"
			}
		}
	}
	return d
}

// build compiles a qualified primitive with value v and remembers its
// qualifiers for a bare value after it.
func (p *parser) build(q qual, v token) (node, error) {
	var n node
	var err error
	switch q.kind {
	case "host":
		n, err = p.host(q, v)
	case "net":
		n, err = p.netPrimitive(q, v)
	case "port", "portrange":
		n, err = p.port(q, v)
	case "proto":
		n, err = p.proto(q, v)
	}
	if err != nil {
		return nil, err
	}
	p.last = &q
	return n, nil
}

// number reads the value of a numeric primitive (decimal, 0x hex, or 0
// octal, as libpcap) up to max.
func (p *parser) number(after, what string, max uint64) (uint32, error) {
	t, err := p.want(what, after)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseUint(t.text, 0, 32)
	if err != nil || v > max {
		return 0, p.errAt(t, "want %s (a number from 0 to %d) after %q, got %q", what, max, after, t.text)
	}
	return uint32(v), nil
}

func (p *parser) parseVLAN() (node, error) {
	tag := make([]node, len(vlanTPIDs))
	for i, tpid := range vlanTPIDs {
		tag[i] = p.etherType(tpid)
	}
	n := or(tag...)
	if t, ok := p.peek(); ok && !isKeyword(t.text) && t.text != "(" && t.text != ")" && t.text != "!" && t.text != "&&" && t.text != "||" {
		id, err := p.number("vlan", "a VLAN ID", 4095)
		if err != nil {
			return nil, err
		}
		n = and(n, cmpNode{load: bpf.LoadAbsolute{Off: p.link, Size: 2}, mask: 0x0fff, cond: bpf.JumpEqual, val: id})
	}
	// What follows is decoded inside the tag, as libpcap does.
	p.link += 4
	return n, nil
}

func (p *parser) parseEther() (node, error) {
	t, ok := p.peek()
	if !ok {
		return nil, p.errEnd("want host, src, dst, proto, broadcast or multicast after \"ether\", got the end of the expression")
	}
	q := qual{proto: "ether", kind: "host"}
	switch t.text {
	case "broadcast":
		p.next()
		return etherAddr(0, net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}), nil
	case "multicast":
		p.next()
		return etherMulticast(), nil
	case "proto":
		p.next()
		q.kind = "proto"
		v, err := p.want("a protocol number or name (ip, ip6, arp, rarp, 0x88cc)", "ether proto")
		if err != nil {
			return nil, err
		}
		return p.build(q, v)
	case "src", "dst":
		q.dir = p.parseDir()
		if p.peekIs("host") {
			p.next()
		}
	case "host":
		p.next()
	default:
		return nil, p.errAt(t, "want host, src, dst, proto, broadcast or multicast after \"ether\", got %q", t.text)
	}
	v, err := p.want("a MAC address", "ether "+strings.TrimSpace(q.dir+" host"))
	if err != nil {
		return nil, err
	}
	return p.build(q, v)
}

// etherType tests the type field before the link-layer payload.
func (p *parser) etherType(t uint32) node {
	return cmpNode{load: bpf.LoadAbsolute{Off: p.link - 2, Size: 2}, cond: bpf.JumpEqual, val: t}
}

func (p *parser) byteAt(off, v uint32) node {
	return cmpNode{load: bpf.LoadAbsolute{Off: p.link + off, Size: 1}, cond: bpf.JumpEqual, val: v}
}

// ipProto: IPv4 carrying protocol v.
func (p *parser) ipProto(v uint32) node {
	return and(p.etherType(etherIPv4), p.byteAt(9, v))
}

// ip6Proto: IPv6 whose next header is v, or a fragment header followed by
// v, as libpcap checks.
func (p *parser) ip6Proto(v uint32) node {
	return and(p.etherType(etherIPv6), or(p.byteAt(6, v), and(p.byteAt(6, protoFragment), p.byteAt(40, v))))
}

func (p *parser) protoPrimitive(name string) node {
	switch name {
	case "ip":
		return p.etherType(etherIPv4)
	case "ip6":
		return p.etherType(etherIPv6)
	case "arp":
		return p.etherType(etherARP)
	case "rarp":
		return p.etherType(etherRARP)
	case "icmp":
		return p.ipProto(protoICMP)
	case "icmp6":
		return p.ip6Proto(protoICMPv6)
	}
	v := ipProtoNames[name] // tcp, udp, sctp
	return or(p.ipProto(v), p.ip6Proto(v))
}

// dirOf combines the source and destination tests as the direction says.
func dirOf(dir string, src, dst node) node {
	switch dir {
	case "src":
		return src
	case "dst":
		return dst
	case "src and dst":
		return and(src, dst)
	}
	return or(src, dst)
}

// word32 compares the masked 32-bit word at off with v.
func word32(off, v, mask uint32) node {
	c := cmpNode{load: bpf.LoadAbsolute{Off: off, Size: 4}, cond: bpf.JumpEqual, val: v & mask}
	if mask != 0xffffffff {
		c.mask = mask
	}
	return c
}

// prefixAt compares the first bits of the address at off with a's.
func prefixAt(off uint32, a netip.Addr, bits int) node {
	b := a.AsSlice()
	var ns []node
	for i := 0; i < len(b)/4 && bits > 0; i++ {
		w := uint32(b[4*i])<<24 | uint32(b[4*i+1])<<16 | uint32(b[4*i+2])<<8 | uint32(b[4*i+3])
		mask := ^uint32(0)
		if bits < 32 {
			mask = ^(^uint32(0) >> bits)
		}
		ns = append(ns, word32(off+uint32(4*i), w, mask))
		bits -= 32
	}
	if len(ns) == 0 { // a /0 network: every address of the family
		return nil
	}
	return and(ns...)
}

// addrTest is the test of a host or net primitive for prefix.
func (p *parser) addrTest(q qual, v token, pfx netip.Prefix) (node, error) {
	a, bits := pfx.Addr(), pfx.Bits()
	both := func(family node, srcOff, dstOff uint32) node {
		s, d := prefixAt(p.link+srcOff, a, bits), prefixAt(p.link+dstOff, a, bits)
		if s == nil {
			return family
		}
		return and(family, dirOf(q.dir, s, d))
	}
	if a.Is6() {
		switch q.proto {
		case "", "ip6":
			return both(p.etherType(etherIPv6), 8, 24), nil
		}
		return nil, p.errAt(v, "%q is an IPv6 address: %s %s wants IPv4 (drop %q, or say ip6)", v.text, q.proto, q.kind, q.proto)
	}
	ip := both(p.etherType(etherIPv4), 12, 16)
	arp := func(t uint32) node { return both(p.etherType(t), 14, 24) }
	switch q.proto {
	case "":
		return or(ip, both(or(p.etherType(etherARP), p.etherType(etherRARP)), 14, 24)), nil
	case "ip":
		return ip, nil
	case "arp":
		return arp(etherARP), nil
	case "rarp":
		return arp(etherRARP), nil
	case "ip6":
		return nil, p.errAt(v, "%q is an IPv4 address: ip6 %s wants IPv6", v.text, q.kind)
	}
	return nil, p.errAt(v, "%q does not go with %q: %s takes ip, ip6, arp or rarp", q.kind, q.proto, q.kind)
}

func (p *parser) host(q qual, v token) (node, error) {
	if q.proto == "ether" {
		mac, err := net.ParseMAC(v.text)
		if err != nil || len(mac) != 6 {
			return nil, p.errAt(v, "want a MAC address (00:11:22:33:44:55) after \"ether\", got %q", v.text)
		}
		return dirOf(q.dir, etherAddr(6, mac), etherAddr(0, mac)), nil
	}
	a, err := netip.ParseAddr(v.text)
	if err != nil || a.Zone() != "" {
		if mac, err := net.ParseMAC(v.text); err == nil && len(mac) == 6 {
			return nil, p.errAt(v, "%q is a MAC address: say ether host %s", v.text, v.text)
		}
		return nil, p.errAt(v, "want an IPv4 or IPv6 address after %q, got %q (names are not resolved)", q.kind, v.text)
	}
	a = a.Unmap()
	return p.addrTest(q, v, netip.PrefixFrom(a, a.BitLen()))
}

func (p *parser) netPrimitive(q qual, v token) (node, error) {
	bad := func() error {
		return p.errAt(v, "want a network (10.0.0.0/8, 10.1, fe80::/10) after \"net\", got %q", v.text)
	}
	var pfx netip.Prefix
	switch {
	case strings.Contains(v.text, "/"):
		var err error
		if pfx, err = netip.ParsePrefix(v.text); err != nil {
			return nil, bad()
		}
	default:
		a, err := netip.ParseAddr(v.text)
		switch {
		case err == nil && a.Is6():
			pfx = netip.PrefixFrom(a, 128)
		case err == nil:
			pfx = netip.PrefixFrom(a, 32)
		default:
			// libpcap's abbreviations: 10 is 10/8, 172.16 is 172.16/16.
			parts := strings.Split(v.text, ".")
			if len(parts) > 3 {
				return nil, bad()
			}
			var b [4]byte
			for i, s := range parts {
				n, err := strconv.ParseUint(s, 10, 8)
				if err != nil {
					return nil, bad()
				}
				b[i] = byte(n)
			}
			pfx = netip.PrefixFrom(netip.AddrFrom4(b), 8*len(parts))
		}
		if p.peekIs("mask") {
			m := p.next()
			mt, err := p.want("a netmask (255.255.0.0)", "mask")
			if err != nil {
				return nil, err
			}
			ma, err := netip.ParseAddr(mt.text)
			bits := -1
			if err == nil && ma.Is4() && pfx.Addr().Is4() {
				b4 := ma.As4()
				w := uint32(b4[0])<<24 | uint32(b4[1])<<16 | uint32(b4[2])<<8 | uint32(b4[3])
				ones := 0
				for ones < 32 && w&(1<<(31-ones)) != 0 {
					ones++
				}
				if ones == 32 || w<<ones == 0 {
					bits = ones
				}
			}
			if bits < 0 {
				return nil, p.errAt(mt, "want an IPv4 netmask of contiguous ones (255.255.0.0) after %q, got %q", m.text, mt.text)
			}
			pfx = netip.PrefixFrom(pfx.Addr(), bits)
		}
	}
	if pfx.Masked().Addr() != pfx.Addr() {
		return nil, p.errAt(v, "%s has bits set outside its /%d mask: did you mean %s?", v.text, pfx.Bits(), pfx.Masked())
	}
	return p.addrTest(q, v, pfx)
}

func (p *parser) port(q qual, v token) (node, error) {
	var protos []uint32
	switch q.proto {
	case "":
		protos = []uint32{protoSCTP, protoTCP, protoUDP}
	case "tcp", "udp", "sctp":
		protos = []uint32{ipProtoNames[q.proto]}
	default:
		return nil, p.errAt(v, "%q does not go with %q: %s takes tcp, udp or sctp", q.kind, q.proto, q.kind)
	}
	lo, hi, err := p.portRange(q.kind, v)
	if err != nil {
		return nil, err
	}
	test := func(pre []bpf.Instruction, load bpf.Instruction) node {
		if lo == hi {
			return cmpNode{pre: pre, load: load, cond: bpf.JumpEqual, val: lo}
		}
		return and(cmpNode{pre: pre, load: load, cond: bpf.JumpGreaterOrEqual, val: lo},
			notNode{cmpNode{pre: pre, load: load, cond: bpf.JumpGreaterThan, val: hi}})
	}
	anyOf := func(off uint32) node {
		ns := make([]node, len(protos))
		for i, pr := range protos {
			ns[i] = p.byteAt(off, pr)
		}
		return or(ns...)
	}
	// IPv6: the ports right after the fixed header (no extension headers,
	// as libpcap).
	v6 := and(p.etherType(etherIPv6), anyOf(6),
		dirOf(q.dir, test(nil, bpf.LoadAbsolute{Off: p.link + 40, Size: 2}), test(nil, bpf.LoadAbsolute{Off: p.link + 42, Size: 2})))
	// IPv4: first fragments only, ports after the header's IHL words.
	ihl := []bpf.Instruction{bpf.LoadMemShift{Off: p.link}}
	v4 := and(p.etherType(etherIPv4), anyOf(9),
		notNode{cmpNode{load: bpf.LoadAbsolute{Off: p.link + 6, Size: 2}, cond: bpf.JumpBitsSet, val: 0x1fff}},
		dirOf(q.dir, test(ihl, bpf.LoadIndirect{Off: p.link, Size: 2}), test(ihl, bpf.LoadIndirect{Off: p.link + 2, Size: 2})))
	return or(v6, v4), nil
}

// portRange reads N (port) or N-M (portrange; swapped if M < N, as libpcap).
func (p *parser) portRange(kind string, v token) (uint32, uint32, error) {
	num := func(s string) (uint32, bool) {
		n, err := strconv.ParseUint(s, 0, 16)
		return uint32(n), err == nil
	}
	if kind == "port" {
		n, ok := num(v.text)
		if !ok {
			return 0, 0, p.errAt(v, "want a port number from 0 to 65535 after \"port\", got %q (service names are not resolved)", v.text)
		}
		return n, n, nil
	}
	a, b, found := strings.Cut(v.text, "-")
	lo, ok1 := num(a)
	hi, ok2 := num(b)
	if !found || !ok1 || !ok2 {
		return 0, 0, p.errAt(v, "want a port range N-M (ports from 0 to 65535) after \"portrange\", got %q", v.text)
	}
	return min(lo, hi), max(lo, hi), nil
}

func (p *parser) proto(q qual, v token) (node, error) {
	name := strings.TrimPrefix(v.text, `\`)
	if q.proto == "ether" {
		t, ok := etherProtoNames[name]
		if !ok {
			n, err := strconv.ParseUint(name, 0, 16)
			if err != nil || n <= 1500 {
				return nil, p.errAt(v, "want an EtherType above 1500 (0x88cc) or ip, ip6, arp, rarp after \"ether proto\", got %q (802.3 lengths and LLC are not supported)", v.text)
			}
			t = uint32(n)
		}
		return p.etherType(t), nil
	}
	n, ok := ipProtoNames[name]
	if !ok {
		u, err := strconv.ParseUint(name, 0, 8)
		if err != nil {
			return nil, p.errAt(v, "want an IP protocol number from 0 to 255 or a name (tcp, udp, icmp, icmp6, sctp, gre, esp, ah, igmp) after \"proto\", got %q", v.text)
		}
		n = uint32(u)
	}
	switch q.proto {
	case "":
		return or(p.ipProto(n), p.ip6Proto(n)), nil
	case "ip":
		return p.ipProto(n), nil
	case "ip6":
		return p.ip6Proto(n), nil
	}
	return nil, p.errAt(v, "\"proto\" does not go with %q: it takes ip, ip6 or ether", q.proto)
}

// etherAddr compares the 6 bytes at off (0: destination, 6: source).
func etherAddr(off uint32, mac net.HardwareAddr) node {
	hi := uint32(mac[0])<<24 | uint32(mac[1])<<16 | uint32(mac[2])<<8 | uint32(mac[3])
	lo := uint32(mac[4])<<8 | uint32(mac[5])
	return and(word32(off, hi, 0xffffffff),
		cmpNode{load: bpf.LoadAbsolute{Off: off + 4, Size: 2}, cond: bpf.JumpEqual, val: lo})
}

// etherMulticast: the group bit of the destination.
func etherMulticast() node {
	return cmpNode{load: bpf.LoadAbsolute{Off: 0, Size: 1}, cond: bpf.JumpBitsSet, val: 1}
}

// suggest returns ` (did you mean "x"?)` for the keyword nearest to s,
// or "".
func suggest(s string, words []string) string {
	if w := suggestpkg.Closest(s, words); w != "" {
		return fmt.Sprintf(" (did you mean %q?)", w)
	}
	return ""
}
