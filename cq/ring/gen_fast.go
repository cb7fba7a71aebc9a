//go:build ignore

// gen_fast.go writes fast_gen.go: readPhaseRun, the fast path's per-entry
// loop (the body below), once per CQ format and kind of entry (fields of
// natural widths, masked fields, an id and a length alone, and the ring
// shapes of this module's drivers: shapes below), each a named function a
// profile shows. Fields outside the format are stored as
// constant zeros and natural-width fields are read with plain loads, which
// the compiler folds from the constants each copy declares. Run it with
// go generate ./cq/ring.
package main

import (
	"bytes"
	"go/format"
	"log"
	"os"
	"text/template"
)

// Usage: go run gen_fast.go [output file, default fast_gen.go]

type loop struct {
	Name, Doc string
	Size      int    // 1, 2, 4, 8: FormatContext, Msg, Data, Tagged
	Natural   bool   // id, length, buffer offset and data are 32, 32, 32 and 64 bits
	IDLen     bool   // the entry has an id and a length and nothing else (virtio)
	Shape     *shape // the layout's geometry as constants, or nil: read from fastPath
}

// word is a field's offset from the ownership word and its mask, as
// fastPlan has them.
type word struct {
	Off  int
	Mask uint64
}

// shape is the geometry of a ring layout that a driver of this module
// declares, given its own copies of the loop with every offset and mask a
// constant, as a C reader has them from its struct: no field offset is
// loaded and masks of a field's natural width disappear. A ring whose
// compiled plan is exactly one of these takes its copy (newFastPath); the
// drivers' tests check that their layouts do (RingSource.Loop), and any
// other layout reads the same values from fastPath in the loops above.
// Offsets are from the ownership word (fastPlan.rebase), absent fields
// included, as compilePlan and rebase produce them.
type shape struct {
	Name, Doc              string
	Kind                   string // "Natural" or "IDLen": the loop kind it refines
	ESz                    int
	OMask                  uint32
	ID, Queue, Len, BufOff word
	Data, Tag              word
	St, Op, Fl             int
}

const full32, full64 = 1<<32 - 1, 1<<64 - 1

var shapes = []*shape{
	{Name: "VirtioPacked", Doc: "virtio's packed ring (nic/virtio.PackedLayout: 16-byte descriptors, the id in the ownership word)",
		Kind: "IDLen", ESz: 16, OMask: 0x8080 << 16,
		ID: word{0, 0xffff}, Queue: word{-12, 0}, Len: word{-4, full32}, BufOff: word{-12, 0},
		Data: word{-12, 0}, Tag: word{-12, 0}, St: -12, Op: -12, Fl: -12},
	{Name: "VirtioUsed", Doc: "virtio's split used ring (nic/virtio.SplitLayout: 8-byte elements after the index)",
		Kind: "IDLen", ESz: 8, OMask: 0,
		ID: word{0, full32}, Queue: word{0, 0}, Len: word{4, full32}, BufOff: word{0, 0},
		Data: word{0, 0}, Tag: word{0, 0}, St: 0, Op: 0, Fl: 0},
	{Name: "Sim", Doc: "the software device's 64-byte entry (nic/sim.Layout)",
		Kind: "Natural", ESz: 64, OMask: 1 << 31,
		ID: word{-60, full32}, Queue: word{-56, 0xffff}, Len: word{-52, full32}, BufOff: word{-16, full32},
		Data: word{-44, full64}, Tag: word{-36, full64}, St: -53, Op: -54, Fl: -48},
}

func main() {
	var loops []loop
	kinds := []string{"Natural", "Masked", "IDLen"}
	for _, sh := range shapes {
		kinds = append(kinds, sh.Name)
	}
	for _, f := range []struct {
		name string
		size int
	}{{"Context", 1}, {"Msg", 2}, {"Data", 4}, {"Tagged", 8}} {
		for _, w := range kinds {
			l := loop{Name: "readPhase" + f.name + w, Size: f.size}
			kind, doc := w, map[string]string{
				"Natural": "fields of natural widths",
				"Masked":  "fields read with a mask",
				"IDLen":   "entries of an id and a length alone (virtio's used rings), read with a mask",
			}[w]
			for _, sh := range shapes {
				if sh.Name == w {
					l.Shape, kind, doc = sh, sh.Kind, sh.Doc
				}
			}
			l.Natural, l.IDLen, l.Doc = kind == "Natural", kind == "IDLen", "Format"+f.name+", "+doc
			loops = append(loops, l)
		}
	}
	var b bytes.Buffer
	data := struct {
		Loops  []loop
		Shapes []*shape
		Kinds  []string
	}{loops, shapes, kinds}
	if err := template.Must(template.New("fast").Funcs(funcs).Parse(loopTemplate)).Execute(&b, data); err != nil {
		log.Fatal(err)
	}
	src, err := format.Source(b.Bytes())
	if err != nil {
		log.Fatalf("%v\n%s", err, b.Bytes())
	}
	out := "fast_gen.go"
	if len(os.Args) > 1 {
		out = os.Args[1]
	}
	if err := os.WriteFile(out, src, 0o644); err != nil {
		log.Fatal(err)
	}
}

// funcs write a field's load at ow: w32 (32 bits) and w64 (64 bits) take
// the name of the word32 or word64 that places the field and whether it
// has its natural width (no mask).
var funcs = template.FuncMap{
	"w32": func(w string, natural bool) string { return fieldLoad(w, "32", natural) },
	"w64": func(w string, natural bool) string { return fieldLoad(w, "64", natural) },
}

func fieldLoad(w, bits string, natural bool) string {
	e := "le" + bits + "(*(*uint" + bits + ")(unsafe.Add(ow, " + w + ".off)))"
	if !natural {
		e += " & " + w + ".mask"
	}
	return e
}

// loopTemplate is readPhaseRun. It fills the count (at least 1) entries
// from first, reading the ring from byte eoff, and does not reach past the
// end of the ring. It returns why it stopped, unless it filled them all
// the entry it stopped at, and the cursor's free-queue tail (returned
// rather than stored, so that the loop needs no register for fp after its
// last use). Each entry: the ownership word loaded
// atomically, then the queue, the id against the posted slot, the status,
// opcode and length; then the completion, and the slot's release. Each
// copy is not inlined, so that its loop has the registers to itself.
//
// After the loops: the kinds and shapes newFastPath matches, the loop
// names, and the switch that calls the selected copy.
const loopTemplate = `{{define "w"}}{off: {{.Off}}, mask: {{.Mask}}}{{end -}}
// Code generated by gen_fast.go; DO NOT EDIT.

package ring

import (
	"sync/atomic"
	"unsafe"

	"github.com/vfnic/vfnic/cq"
)
{{range .Loops}}
{{- $q := "fp.plan.queue"}}{{$bo := "fp.plan.bufOff"}}{{$data := "fp.plan.data"}}{{$tag := "fp.plan.tag"}}
{{- $st := "fp.plan.st"}}{{$op := "fp.plan.op"}}{{$fl := "fp.plan.fl"}}
{{- if .Shape}}{{$q = "pq"}}{{$bo = "pbo"}}{{$data = "pdata"}}{{$tag = "ptag"}}{{$st = "pst"}}{{$op = "pop"}}{{$fl = "pfl"}}{{end}}
// {{.Name}} is readPhaseRun for {{.Doc}}.
//
//go:noinline
func {{.Name}}(fp *fastPath, first *cq.Entry, count int, eoff uintptr) (*cq.Entry, int, uint32) {
	const fsize = {{.Size}} // 1, 2, 4, 8: context, msg, data, tagged
	const idlen = {{.IDLen}} // no queue, codes, buffer offset, data or tag: constants 0
{{- with .Shape}}
	// Shape {{.Name}}: the geometry is constants.
	const esz, omask = {{.ESz}}, {{.OMask}}
	pid, pq := word32{{template "w" .ID}}, word32{{template "w" .Queue}}
	pln, pbo := word32{{template "w" .Len}}, word32{{template "w" .BufOff}}
	pdata, ptag := word64{{template "w" .Data}}, word64{{template "w" .Tag}}
	const pst, pop, pfl = {{.St}}, {{.Op}}, {{.Fl}}
	_, _, _, _, _ = pq, pbo, pdata, ptag, pst+pop+pfl
{{- else}}
	// Loaded once: the loop's stores may alias fastPath as far as the
	// compiler knows, so it would load them again for every entry.
	esz, omask := fp.esz, fp.omask
	pid, pln := fp.plan.id, fp.plan.ln
{{- end}}
	want := fp.want
	ftl := fp.cur.ftl
	why := runFull
	// ow points at the entry's ownership word, the fields at offsets from
	// it; neither it nor ent ever points past the ring or past ents, as
	// the test for the last entry comes before the steps.
	ow := unsafe.Add(fp.base, eoff+fp.own)
	ent := first
	var s *slot
	var ln uint32
	last := (*cq.Entry)(unsafe.Add(unsafe.Pointer(first), uintptr(count-1)*unsafe.Sizeof(cq.Entry{})))
	if idlen && fp.cur.queue != 0 {
		// Every entry is queue 0's: take its table once.
		fp.cur.enter(fp.src, fp.tabs, 0)
		ftl = fp.cur.ftl
	}
run:
	for {
		// The inner loop reads entries of the cursor's queue; an entry of
		// another queue leaves it, so that the change of tables, a call,
		// sits outside the loop's straight path. Each helper it calls
		// shares its line with an instruction of the loop's own: the
		// compiler emits a NOP to mark an inlined call, unless such an
		// instruction carries the mark (the fields are loaded in place for
		// that reason).
		comp, queue := fp.cur.comp, fp.cur.queue // in registers
		if idlen {
			queue = 0 // a constant: the table taken above is queue 0's
		}
		for {
			own := atomic.LoadUint32((*uint32)(ow))
			if (own^want)&omask != 0 {
				why = runStopped
				break run
			}
			if !idlen && {{w32 $q false}} != queue {
				break
			}
{{- if and .Shape (eq .Shape.ID.Off 0)}}
			id := le32(own) & pid.mask // the id shares the ownership word: loaded once
{{- else}}
			id := {{w32 "pid" .Natural}}
{{- end}}
			// An unbound queue's completer (noSlots) refuses every id
			// here, and stageHead tells a bad queue from a bad id.
			if s = comp.at(id); !s.outstanding(id) {
				why = runFailed
				break run
			}
			var codes cq.Flags
			var off uint32
			if !idlen {
				codes = fp.status[code(ow, {{$st}})] | fp.op[code(ow, {{$op}})]
				off = {{w32 $bo .Natural}}
			}
			if ln = {{w32 "pln" .Natural}}; codes&s.refuse != 0 || !fits(ln, off, s.len) {
				why = runFailed
				break run
			}
			// Each field is stored as soon as it is known, so that fewer
			// values are live at once (the loop is short of registers).
			ent.Context = s.ctx
			ent.Queue = queue // 0 in idlen loops, which take queue 0's table
			// Post stored the posted flags completed (entryFlags); the
			// codes may add a flag that needs it again.
			fl := s.flags
			if !idlen {
				fl = entryFlags(fl | codes | fp.bits[code(ow, {{$fl}})])
			}
			// Fields outside the format stay zero (constants once
			// compiled).
			var eFlags cq.Flags
			var eLen int
			if fsize >= 2 { // FormatMsg and up
				eFlags, eLen = fl, int(ln)
			}
			ent.Flags, ent.Len = eFlags, eLen
			var eBuf uintptr
			var eData, eTag uint64
			if fsize >= 4 && idlen { // FormatData and up: the flags are the posted ones
				eBuf = s.rbuf
			} else if fsize >= 4 {
				eBuf = recvBuf(fl, s.buf+uintptr(off))
				if fl&cq.FlagRemoteCQData != 0 {
					eData = {{w64 $data .Natural}}
				}
			}
			if fsize >= 8 && !idlen && fl&(cq.FlagTagged|cq.FlagRecv) == cq.FlagTagged|cq.FlagRecv {
				eTag = {{w64 $tag false}}
			}
			ent.Buf, ent.Data, ent.Tag = eBuf, eData, eTag
			if !s.multi || fl&cq.FlagMultiRecv != 0 {
				ftl = comp.release(s, id, ftl)
			}
			if ent == last {
				return last, runFull, ftl
			}
			ow = unsafe.Add(ow, esz)
			ent = (*cq.Entry)(unsafe.Add(unsafe.Pointer(ent), unsafe.Sizeof(cq.Entry{})))
		}
		// The entry at ow names another queue: take its table, then read
		// the entry again from the top.
		fp.cur.ftl = ftl
		fp.cur.enter(fp.src, fp.tabs, {{w32 $q false}})
		ftl = fp.cur.ftl
	}
	return ent, why, ftl
}
{{end}}
// The kinds of loop, each with a copy per format (fastPath.sel).
const (
{{- range $i, $k := .Kinds}}
	loop{{$k}}{{if eq $i 0}} = iota{{end}}
{{- end}}
	loopKinds
)

// loopShapes are the shapes' geometries (gen_fast.go), by kind, which
// newFastPath compares a ring's compiled plan with.
var loopShapes = [...]struct {
	kind  int
	refines int // the kind whose values it makes constants
	esz   uintptr
	omask uint32
	plan  fastPlan
}{
{{- range .Shapes}}
	{kind: loop{{.Name}}, refines: loop{{.Kind}}, esz: {{.ESz}}, omask: {{.OMask}}, plan: fastPlan{
		id: word32{{template "w" .ID}}, queue: word32{{template "w" .Queue}},
		ln: word32{{template "w" .Len}}, bufOff: word32{{template "w" .BufOff}},
		data: word64{{template "w" .Data}}, tag: word64{{template "w" .Tag}},
		st: {{.St}}, op: {{.Op}}, fl: {{.Fl}}}},
{{- end}}
}

// loopNames names the copies by fastPath.sel (RingSource.Loop).
var loopNames = [...]string{
{{- range .Loops}}
	"{{.Name}}",
{{- end}}
}

// loopFunc is a copy of readPhaseRun.
type loopFunc func(fp *fastPath, first *cq.Entry, count int, eoff uintptr) (*cq.Entry, int, uint32)

// loops are the copies by fastPath.sel.
var loops = [...]loopFunc{
{{- range .Loops}}
	{{.Name}},
{{- end}}
}
`
