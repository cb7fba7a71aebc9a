// Package pcapfilter compiles tcpdump's filter expressions (pcap-filter(7))
// for Ethernet frames to classic BPF and runs them in Go, with
// golang.org/x/net/bpf's virtual machine: no cgo, no libpcap.
//
// It covers the primitives people type most, with libpcap's meaning (the
// programs are those 'tcpdump -d' prints, up to the order of tests):
//
//	[src|dst|src or dst|src and dst] host ADDR      IPv4 (IP, ARP, RARP) or IPv6
//	[ip|ip6|arp|rarp] [DIR] host ADDR
//	[DIR] net NET[/LEN] | net NET mask MASK         IPv4 or IPv6
//	[tcp|udp|sctp] [DIR] port N | portrange N-M
//	ip | ip6 | arp | rarp | tcp | udp | sctp | icmp | icmp6
//	[ip|ip6] proto N|NAME
//	ether host|src|dst MAC, ether proto N|NAME, ether broadcast|multicast
//	broadcast, multicast (Ethernet's)
//	vlan [ID]                                        802.1Q, 802.1ad, QinQ tags
//	less N, greater N                                frame length
//	not, !, and, &&, or, ||, ( )
//
// As in libpcap, "and" and "or" have equal precedence and associate left
// to right, "not" binds tightest; a bare value takes the qualifiers of the
// primitive before it ("port 80 or 443", "host a or b"), or means "host";
// each "vlan" moves the decoding offsets of everything after it by the
// 4-byte tag, so "vlan 100 and udp" looks for UDP inside the tag.
// Names are not resolved (give addresses and port numbers), and the
// packet-data accessors (tcp[13] & 2) are refused with an error that says
// so. Every refusal is a *SyntaxError with the column of the offending word.
package pcapfilter

import (
	"errors"
	"fmt"

	"golang.org/x/net/bpf"
)

// Snaplen is what the compiled programs return for an accepted frame, as
// tcpdump's default snap length: the whole frame.
const Snaplen = 262144

// MaxInstructions is the longest program Compile produces: the Linux
// kernel's limit for a classic BPF program (BPF_MAXINSNS), so that every
// program it returns could also be attached to a socket.
const MaxInstructions = 4096

// maxDepth bounds the nesting of parentheses and "not"s.
const maxDepth = 256

// ErrTooLong is returned for an expression whose program would exceed
// MaxInstructions.
var ErrTooLong = errors.New("filter expression too long")

// Compile returns the classic BPF program of expr for Ethernet frames:
// it returns snaplen for a frame that matches, 0 for one that does not.
// An empty expression matches every frame.
func Compile(expr string, snaplen uint32) ([]bpf.Instruction, error) {
	toks, err := lex(expr)
	if err != nil {
		return nil, err
	}
	if len(toks) == 0 {
		return []bpf.Instruction{bpf.RetConstant{Val: snaplen}}, nil
	}
	p := &parser{expr: expr, toks: toks, link: ethHeader}
	n, err := p.parseExpr(0)
	if err != nil {
		return nil, err
	}
	if t, ok := p.peek(); ok {
		return nil, p.errAt(t, "want \"and\", \"or\" or the end of the expression, got %q%s", t.text, p.misspelt(t))
	}
	prog := assemble(n, snaplen)
	if len(prog) > MaxInstructions {
		return nil, fmt.Errorf("%w: %d instructions, more than %d", ErrTooLong, len(prog), MaxInstructions)
	}
	return prog, nil
}

// Filter is a compiled expression, ready to test frames. It keeps no
// state between calls: goroutines may share one.
type Filter struct {
	expr string
	prog []bpf.Instruction
	vm   *bpf.VM
}

// New compiles expr (see Compile).
func New(expr string) (*Filter, error) {
	prog, err := Compile(expr, Snaplen)
	if err != nil {
		return nil, err
	}
	vm, err := bpf.NewVM(prog)
	if err != nil {
		// The compiler emits only forward jumps inside the program and ends
		// it with a return: this is a bug here, not in the expression.
		return nil, fmt.Errorf("pcapfilter: %q compiled to a program the VM refuses: %v", expr, err)
	}
	return &Filter{expr: expr, prog: prog, vm: vm}, nil
}

// Match reports whether frame, an Ethernet frame from its destination
// MAC on, matches. A frame too short for a field the program reads does
// not match, as in the kernel.
func (f *Filter) Match(frame []byte) bool {
	n, err := f.vm.Run(frame)
	return err == nil && n > 0
}

// Program returns the compiled program (tcpdump -d's listing is
// bpf.Instruction's String of each).
func (f *Filter) Program() []bpf.Instruction { return f.prog }

// String returns the expression.
func (f *Filter) String() string { return f.expr }
