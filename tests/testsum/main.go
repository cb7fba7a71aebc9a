// Command testsum reads `go test -json` on stdin and prints a summary a
// person can read: one line per package, every VM test and guest test with
// its verdict, the guest kernel each VM run booted, the whole output of any
// failed test, and a closing "N passed, N failed, N skipped" line. It exits
// non-zero when a test or a build failed, or when no test ran.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

type event struct {
	Action     string
	ImportPath string // build-output and build-fail events
	Package    string
	Test       string
	Output     string
	Elapsed    float64
}

type key struct{ pkg, test string }

// isVM reports whether a test is a VM test or one of its guest subtests:
// those are always listed, so the log shows that they really ran.
func isVM(test string) bool {
	top, _, _ := strings.Cut(test, "/")
	return strings.HasPrefix(top, "TestVM")
}

// noteworthy lines of a VM test's log are echoed even when it passes.
func noteworthy(line string) bool {
	return strings.Contains(line, "guest kernel") || strings.Contains(line, "guest: kernel")
}

func summarize(r io.Reader, w io.Writer) int {
	out := map[key][]string{}
	// VM lines wait for their package's verdict so packages running in
	// parallel do not interleave.
	pending := map[string][]string{}
	var pass, fail, skip int
	failedPkgs := 0
	var failed []key
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if err := json.Unmarshal(line, &e); err != nil || e.Action == "" {
			fmt.Fprintln(w, string(line)) // build errors and the like
			continue
		}
		k := key{e.Package, e.Test}
		switch e.Action {
		case "build-output":
			fmt.Fprint(w, e.Output)
		case "build-fail":
			fmt.Fprintf(w, "FAIL %s [build failed]\n", e.ImportPath)
			failedPkgs++
		case "output":
			out[k] = append(out[k], e.Output)
			if e.Test != "" && isVM(e.Test) && noteworthy(e.Output) {
				pending[e.Package] = append(pending[e.Package], "    "+strings.TrimLeft(e.Output, " "))
			}
		case "pass", "fail", "skip":
			if e.Test == "" {
				verdict := map[string]string{"pass": "ok  ", "fail": "FAIL", "skip": "?   "}[e.Action]
				fmt.Fprintf(w, "%s %s\t%.1fs\n", verdict, e.Package, e.Elapsed)
				fmt.Fprint(w, strings.Join(pending[e.Package], ""))
				delete(pending, e.Package)
				if e.Action == "fail" {
					failedPkgs++
					if len(failed) == 0 || failed[len(failed)-1].pkg != e.Package {
						// A package that failed without a failing test (a
						// crash, a build error): show its output.
						failed = append(failed, k)
					}
				}
				continue
			}
			switch e.Action {
			case "pass":
				pass++
			case "fail":
				fail++
				failed = append(failed, k)
			case "skip":
				skip++
			}
			if isVM(e.Test) {
				pending[e.Package] = append(pending[e.Package],
					fmt.Sprintf("    --- %s: %s (%.2fs)\n", strings.ToUpper(e.Action), e.Test, e.Elapsed))
			}
		}
	}
	if len(failed) > 0 {
		fmt.Fprintln(w, "\n=== output of what failed")
		sort.SliceStable(failed, func(i, j int) bool { return failed[i].pkg < failed[j].pkg })
		for _, k := range failed {
			name := k.test
			if name == "" {
				name = "(package)"
			}
			fmt.Fprintf(w, "--- %s %s\n%s", k.pkg, name, strings.Join(out[k], ""))
		}
	}
	fmt.Fprintf(w, "\n%d passed, %d failed, %d skipped\n", pass, fail, skip)
	switch {
	case fail > 0 || failedPkgs > 0:
		return 1
	case pass == 0:
		fmt.Fprintln(w, "testsum: no test ran")
		return 1
	}
	return 0
}

func main() { os.Exit(summarize(os.Stdin, os.Stdout)) }
