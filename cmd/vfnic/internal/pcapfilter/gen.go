package pcapfilter

import "golang.org/x/net/bpf"

// node is a predicate on a frame: a tree of and, or, not over
// comparisons, which assemble turns into jumps.
type node interface{ isNode() }

type andNode struct{ l, r node }
type orNode struct{ l, r node }
type notNode struct{ x node }

// cmpNode loads a value (after pre, which sets X for an indirect load),
// masks it when mask is not zero, and compares it with val.
type cmpNode struct {
	pre  []bpf.Instruction
	load bpf.Instruction
	mask uint32
	cond bpf.JumpTest
	val  uint32
}

func (andNode) isNode() {}
func (orNode) isNode()  {}
func (notNode) isNode() {}
func (cmpNode) isNode() {}

// and and or fold their operands left to right, as libpcap does.
func and(ns ...node) node {
	n := ns[0]
	for _, m := range ns[1:] {
		n = andNode{n, m}
	}
	return n
}

func or(ns ...node) node {
	n := ns[0]
	for _, m := range ns[1:] {
		n = orNode{n, m}
	}
	return n
}

// item is an instruction of the program being laid out: a plain
// instruction, a conditional jump to labels, or a label's place.
type item struct {
	kind  itemKind
	ins   bpf.Instruction // plain
	cond  bpf.JumpTest    // cond
	val   uint32          // cond
	t, f  int             // cond: labels
	label int             // label
}

type itemKind uint8

const (
	plain itemKind = iota
	condJump
	label
)

type gen struct {
	items  []item
	labels int
}

func (g *gen) newLabel() int { g.labels++; return g.labels - 1 }

func (g *gen) place(l int) { g.items = append(g.items, item{kind: label, label: l}) }

// emit appends the code of n, which jumps to label t when n holds and to
// f when it does not. Every label is placed after the jumps to it, so all
// jumps go forward, as classic BPF requires.
func (g *gen) emit(n node, t, f int) {
	switch n := n.(type) {
	case andNode:
		mid := g.newLabel()
		g.emit(n.l, mid, f)
		g.place(mid)
		g.emit(n.r, t, f)
	case orNode:
		mid := g.newLabel()
		g.emit(n.l, t, mid)
		g.place(mid)
		g.emit(n.r, t, f)
	case notNode:
		g.emit(n.x, f, t)
	case cmpNode:
		for _, in := range n.pre {
			g.items = append(g.items, item{kind: plain, ins: in})
		}
		g.items = append(g.items, item{kind: plain, ins: n.load})
		if n.mask != 0 {
			g.items = append(g.items, item{kind: plain, ins: bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: n.mask}})
		}
		g.items = append(g.items, item{kind: condJump, cond: n.cond, val: n.val, t: t, f: f})
	}
}

// assemble lays out the program of n: accepted frames return snaplen,
// others 0. A conditional jump reaches at most 255 instructions; one that
// must go further becomes "jump if true 0, else 1; ja T; ja F" (ja takes a
// 32-bit offset), and the layout is redone until every jump fits.
func assemble(n node, snaplen uint32) []bpf.Instruction {
	g := &gen{}
	accept, reject := g.newLabel(), g.newLabel()
	g.emit(n, accept, reject)
	g.place(accept)
	g.items = append(g.items, item{kind: plain, ins: bpf.RetConstant{Val: snaplen}})
	g.place(reject)
	g.items = append(g.items, item{kind: plain, ins: bpf.RetConstant{Val: 0}})

	long := make([]bool, len(g.items))
	pos := make([]int, len(g.items))
	at := make([]int, g.labels)
	for {
		pc := 0
		for i, it := range g.items {
			pos[i] = pc
			switch {
			case it.kind == label:
				at[it.label] = pc
			case it.kind == condJump && long[i]:
				pc += 3
			default:
				pc++
			}
		}
		grown := false
		for i, it := range g.items {
			if it.kind == condJump && !long[i] && (at[it.t]-pos[i]-1 > 255 || at[it.f]-pos[i]-1 > 255) {
				long[i], grown = true, true
			}
		}
		if !grown {
			break
		}
	}
	var prog []bpf.Instruction
	for i, it := range g.items {
		switch it.kind {
		case plain:
			prog = append(prog, it.ins)
		case condJump:
			if long[i] {
				prog = append(prog, bpf.JumpIf{Cond: it.cond, Val: it.val, SkipTrue: 0, SkipFalse: 1},
					bpf.Jump{Skip: uint32(at[it.t] - pos[i] - 2)},
					bpf.Jump{Skip: uint32(at[it.f] - pos[i] - 3)})
				continue
			}
			prog = append(prog, bpf.JumpIf{Cond: it.cond, Val: it.val,
				SkipTrue: uint8(at[it.t] - pos[i] - 1), SkipFalse: uint8(at[it.f] - pos[i] - 1)})
		}
	}
	return prog
}
