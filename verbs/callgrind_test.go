//go:build callgrind

package verbs_test

// Instruction counts of the iterator and of fi_cq Read, for callgrind: the
// host-independent side of BenchmarkFilledRing (whose times vary with the
// load on a shared machine). Each path reads a lap of 4096 completions the
// software device filled, three times: 12288 completions, in irIter (the
// iterator at a caller's batch of 32), irRead32 (Read of 32) and irRead256
// (Read of 256, the iterator's ring-read size). Run
//
//	go test -c -tags callgrind -o /tmp/verbs.ir ./verbs
//	valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.out --collect-atstart=no \
//		--toggle-collect='*.irIter' --toggle-collect='*.irRead32' --toggle-collect='*.irRead256' \
//		/tmp/verbs.ir -test.run TestInstructionCounts
//	callgrind_annotate --inclusive=yes /tmp/cg.out | grep -E 'irIter|irRead(32|256)'
//
// and divide each function's inclusive count by 12288.

import (
	"testing"

	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/verbs"
)

//go:noinline
func irIter(vc *verbs.CQ, lap int) (sum uint64) {
	for i := 0; i < lap; i += 32 {
		if err := vc.StartPoll(); err != nil {
			panic(err)
		}
		for k := 0; ; k++ {
			sum += vc.WRID() + uint64(vc.Status()) + uint64(vc.Opcode()) + uint64(vc.ByteLen())
			if k == 31 {
				break
			}
			if err := vc.NextPoll(); err != nil {
				panic(err)
			}
		}
		vc.EndPoll()
	}
	return sum
}

//go:noinline
func irRead(fi *cq.CQ, ents []cq.Entry, lap int) (sum uint64) {
	for i := 0; i < lap; i += len(ents) {
		n, err := fi.Read(ents)
		if err != nil || n != len(ents) {
			panic(err)
		}
		for j := range ents[:n] {
			e := &ents[j]
			sum += wrid(e.Context) + uint64(e.Flags) + uint64(e.Len)
		}
	}
	return sum
}

// irRead32 and irRead256 tell irRead's two batch sizes apart in the
// profile.
//
//go:noinline
func irRead32(fi *cq.CQ, ents []cq.Entry, lap int) uint64 { return irRead(fi, ents, lap) }

//go:noinline
func irRead256(fi *cq.CQ, ents []cq.Entry, lap int) uint64 { return irRead(fi, ents, lap) }

func TestInstructionCounts(t *testing.T) {
	ents32, ents256 := make([]cq.Entry, 32), make([]cq.Entry, 256)
	for _, mode := range []string{"iter", "read32", "read256"} {
		f := newFilledRing(t, mode == "iter", true)
		for r := 0; r < 3; r++ {
			f.fill(t)
			switch mode {
			case "iter":
				sink += irIter(f.vc, fillLap)
			case "read32":
				sink += irRead32(f.fi, ents32, fillLap)
			case "read256":
				sink += irRead256(f.fi, ents256, fillLap)
			}
		}
		f.close()
	}
}
