//go:build callgrind

package verbs_test

// Instruction counts of the iterator and of fi_cq Read, for callgrind: the
// host-independent side of BenchmarkFilledRing (whose times vary with the
// load on a shared machine). Each path reads a lap of 4096 completions the
// software device filled, three times: 12288 completions, in irIter (the
// iterator at a caller's batch of 32), irRead32 (Read of 32) and irRead256
// (Read of 256). Run
//
//	go test -c -tags callgrind -o /tmp/verbs.ir ./verbs
//	GODEBUG=asyncpreemptoff=1 valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.out --collect-atstart=no \
//		--toggle-collect='*.irIter' --toggle-collect='*.irRead32' --toggle-collect='*.irRead256' \
//		/tmp/verbs.ir -test.run TestInstructionCounts
//	callgrind_annotate --inclusive=yes /tmp/cg.out | grep -E 'irIter|irRead(32|256)'
//
// and divide each function's inclusive count by 12288. (Without
// asyncpreemptoff, callgrind sometimes fails an assertion on the runtime's
// preemption signal.) The loops are BenchmarkFilledRing's own (iterLap,
// readLap).
//
// Per completion: irIter 115.8, irRead32 96.4, irRead256 89.1 instructions
// (irIter was 115.4 before EndPoll's guard against a call outside a batch
// and load's test for completions taken aside by the solicited-only
// filter: a dozen instructions per batch of 32).
// The ring read costs the iterator about what it costs Read of 32 (80.1
// against 78.8), its loop more (34.3 against readLap's 17.5): the status
// and opcode accessors, the cursor kept in the CQ (a load, an add, a bound
// test and a store), and the join of NextPoll's inlined nil with its slow path's error before
// the caller tests it (two zeroings, a jump and a test: Go threads jumps
// only through boolean phis, ssa/shortcircuit.go). Threading that by
// hand, with a test-only bool fast path called before NextPoll, saved 1.9
// (measured with reads of 256, when irIter was 108.5).

import (
	"testing"

	"github.com/vfnic/vfnic/cq"
	"github.com/vfnic/vfnic/verbs"
)

// irIter, irRead32 and irRead256 tell the paths apart in the profile.
//
//go:noinline
func irIter(vc *verbs.CQ, lap int) (uint64, error) { return iterLap(vc, lap, 32) }

//go:noinline
func irRead32(fi *cq.CQ, ents []cq.Entry, lap int) (uint64, error) { return readLap(fi, ents, lap) }

//go:noinline
func irRead256(fi *cq.CQ, ents []cq.Entry, lap int) (uint64, error) { return readLap(fi, ents, lap) }

func TestInstructionCounts(t *testing.T) {
	ents32, ents256 := make([]cq.Entry, 32), make([]cq.Entry, 256)
	for _, mode := range []string{"iter", "read32", "read256"} {
		f := newFilledRing(t, mode == "iter", true)
		for r := 0; r < 3; r++ {
			f.fill(t)
			var sum uint64
			var err error
			switch mode {
			case "iter":
				sum, err = irIter(f.vc, fillLap)
			case "read32":
				sum, err = irRead32(f.fi, ents32, fillLap)
			case "read256":
				sum, err = irRead256(f.fi, ents256, fillLap)
			}
			if err != nil {
				t.Fatalf("%s: %v", mode, err)
			}
			sink += sum
		}
		f.close()
	}
}
