package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vfnic/vfnic/cq"
)

// Small counts: a ring of 512 entries (the smallest the producer takes)
// and 20000 completions, so every mode wraps the ring many times.
const (
	testEntries = 512
	testCount   = 20000
)

// needGCC skips the test when gcc is missing, except under CI=true, where
// the C reference must be checked.
func needGCC(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("gcc not found (CI=true): the C reference cannot be checked; install it with apt-get install gcc")
		}
		t.Skip("gcc not found: skipping the C reference check; install it with apt-get install gcc")
	}
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("bash not found: run.sh cannot run")
	}
}

// goBin is the go command run.sh builds with: go test puts its own first
// in PATH.
func goBin(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go not found in PATH: %v", err)
	}
	return p
}

// parseLine reads a reader's "key=value ..." line.
func parseLine(t *testing.T, line string) map[string]string {
	t.Helper()
	kv := map[string]string{}
	for _, f := range strings.Fields(line) {
		k, v, ok := strings.Cut(f, "=")
		require.True(t, ok, "field %q in %q", f, line)
		kv[k] = v
	}
	return kv
}

// expectDigest is the digest both readers must report with -k for
// completions 0..n-1: per completion the buffer index, the flags cq gives
// a RECV (with HAS_DATA on sim's layout) on a posted FlagRecv|FlagMsg
// buffer, the length, the buffer offset and the data, as producer.c writes
// them (ring.h); the virtio layouts carry no data.
func expectDigest(n uint64, entries uint64, layout string) string {
	const postLen, prime = 2048, 0x100000001b3
	flags := uint64(cq.FlagRecv | cq.FlagMsg | cq.FlagRemoteCQData)
	if layout != "sim" {
		flags = uint64(cq.FlagRecv | cq.FlagMsg)
	}
	h := uint64(0xcbf29ce484222325)
	for s := uint64(0); s < n; s++ {
		slot := s % entries
		data := s
		if layout != "sim" {
			data = 0
		}
		for _, x := range []uint64{slot, flags, 64 + s&1023, slot * postLen, data} {
			h = (h ^ x) * prime
		}
	}
	return fmt.Sprintf("%016x", h)
}

// expectDriverDigest is the digest the C driver work (reader -D) must
// report with -k for completions 0..n-1 on layout (packed, split, igb):
// per completion the buffer index, the offsets of Buf and of Data from
// the first buffer (past virtio-net's 12-byte header; igb has none), the
// frame length in Data, Data's capacity to the buffer's end, Len, the
// queue index, and igb's two write-back words kept for the buffer (the
// packet-info word, which producer.c sets to the sequence number, and the
// status DD|EOP with the length above it).
func expectDriverDigest(n, entries uint64, layout string) string {
	const postLen, prime = 2048, 0x100000001b3
	hdr := uint64(12)
	if layout == "igb" {
		hdr = 0
	}
	h := uint64(0xcbf29ce484222325)
	for s := uint64(0); s < n; s++ {
		b, wire := s%entries, 64+s&1023
		xs := []uint64{b, b*postLen + hdr, b*postLen + hdr, wire - hdr, postLen - hdr, wire - hdr, 0}
		if layout == "igb" {
			xs = append(xs, s, 3|wire<<32)
		}
		for _, x := range xs {
			h = (h ^ x) * prime
		}
	}
	return fmt.Sprintf("%016x", h)
}

// runPair runs the producer and one reader on a fresh file; for mode
// "local" the reader alone. extra are the reader's locking flags.
func runPair(ctx context.Context, t *testing.T, out, reader, layout, mode string, batch int, extra ...string) string {
	t.Helper()
	bin := filepath.Join(out, reader)
	b := strconv.Itoa(batch)
	if mode == "local" {
		args := append([]string{"-l", "-L", layout, "-n", strconv.Itoa(testEntries), "-c", strconv.Itoa(testCount), "-b", b, "-k"}, extra...)
		o, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
		require.NoError(t, err, "%s: %s", reader, o)
		return strings.TrimSpace(string(o))
	}
	f := filepath.Join(t.TempDir(), "ring")
	var perr bytes.Buffer
	prod := exec.CommandContext(ctx, filepath.Join(out, "producer"), "-f", f, "-L", layout, "-n", strconv.Itoa(testEntries),
		"-m", mode, "-c", strconv.Itoa(testCount), "-t", "10")
	prod.Stderr = &perr
	require.NoError(t, prod.Start())
	args := append([]string{"-f", f, "-b", b, "-k", "-t", "10"}, extra...)
	o, rerr := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	werr := prod.Wait()
	require.NoError(t, rerr, "%s: %s (producer: %s)", reader, o, perr.String())
	require.NoError(t, werr, "producer: %s", perr.String())
	return strings.TrimSpace(string(o))
}

// TestReadersAgree builds the benchmark with run.sh (which also runs a
// tiny table: its output is checked for every row), then runs the C and
// the Go reader on every layout, in every mode, with and without locking,
// with the digest on and checks that both report every completion, in
// order, with the same converted fields, equal to what the producer wrote.
// Correctness only: no timing is asserted.
func TestReadersAgree(t *testing.T) {
	needGCC(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	out := t.TempDir()

	cmd := exec.CommandContext(ctx, "bash", "run.sh")
	cmd.Env = append(os.Environ(), "OUT="+out, "ENTRIES="+strconv.Itoa(testEntries),
		"COUNT="+strconv.Itoa(testCount), "REPEAT=1", "BATCHES=1 32",
		"GO="+goBin(t))
	table, err := cmd.CombinedOutput()
	require.NoError(t, err, "run.sh:\n%s", table)
	layouts := []string{"sim", "packed", "split"}
	for _, layout := range layouts {
		for _, mode := range []string{"filled", "stream", "local", "stream-mutex"} {
			m, lock := strings.TrimSuffix(mode, "-mutex"), "none"
			if m != mode {
				lock = "mutex"
			}
			for _, batch := range []string{"1", "32"} {
				require.Regexp(t, `(?m)^`+layout+` +`+m+` +`+lock+` +`+batch+` +[0-9.]+ +[0-9.]+ +[0-9.]+x +[0-9.]+x +0\.0000$`, string(table),
					"run.sh's table has no row for %s %s lock %s batch %s with zero Go allocations", layout, m, lock, batch)
			}
			require.Regexp(t, `(?m)^batch 32, `+layout+` `+m+`, lock `+lock+`: Go [0-9.]+ ns, C [0-9.]+ ns per completion: Go/C = [0-9.]+x, (within|above) the 1\.(10|25)x target$`,
				string(table))
		}
	}
	for _, layout := range []string{"packed", "split", "igb"} {
		name := "virtio-" + layout
		if layout == "igb" {
			name = "igb"
		}
		for _, mode := range []string{"local", "filled"} {
			require.Regexp(t, `(?m)^`+name+` +`+mode+`( +[0-9.]+){3}( +[0-9.]+x){3} +0$`, string(table),
				"run.sh's table has no driver row for %s %s with both C references and zero Go allocations", layout, mode)
			require.Regexp(t, `(?m)^batch 32, driver `+layout+` `+mode+`: Go Poll [0-9.]+ ns, C driver work [0-9.]+ ns per completion: Go/C = [0-9.]+x, (within|above) the 1\.10x target \(C ring reader [0-9.]+ ns: [0-9.]+x\)$`,
				string(table))
		}
	}

	for _, layout := range layouts {
		for _, mode := range []string{"filled", "stream", "local"} {
			want := uint64(testCount)
			if mode != "stream" { // whole laps
				want = (want + testEntries - 1) / testEntries * testEntries
			}
			digest := expectDigest(want, testEntries, layout)
			for _, batch := range []int{1, 8, 256} {
				for _, reader := range []string{"reader", "goreader"} {
					for _, locked := range []bool{false, true} {
						var extra []string
						lock := "none"
						switch {
						case locked && reader == "reader":
							extra, lock = []string{"-T"}, "mutex"
						case locked:
							lock = "mutex"
						case reader == "goreader":
							extra = []string{"-s"}
						}
						kv := parseLine(t, runPair(ctx, t, out, reader, layout, mode, batch, extra...))
						name := fmt.Sprintf("%s layout=%s mode=%s batch=%d lock=%s", reader, layout, mode, batch, lock)
						require.Equal(t, layout, kv["layout"], name)
						require.Equal(t, lock, kv["locking"], name)
						require.Equal(t, mode, kv["mode"], name)
						require.Equal(t, strconv.Itoa(batch), kv["batch"], name)
						require.Equal(t, "ok", kv["order"], name)
						require.Equal(t, strconv.FormatUint(want, 10), kv["completions"], name)
						require.Equal(t, digest, kv["digest"], name)
						if reader == "reader" {
							require.Equal(t, "ring", kv["work"], name)
						}
						if reader == "goreader" {
							require.Equal(t, "0.0000", kv["allocs_per_completion"], name)
						}
					}
				}
			}
		}
	}

	// The C driver work (-D) on the driver rows' layouts: every
	// completion, in order, its record, lending and igb's kept words as
	// the digest says, and its counters and counts checked by the reader
	// itself at the end (it fails otherwise).
	for _, layout := range []string{"packed", "split", "igb"} {
		for _, mode := range []string{"filled", "stream", "local"} {
			want := uint64(testCount)
			if mode != "stream" {
				want = (want + testEntries - 1) / testEntries * testEntries
			}
			digest := expectDriverDigest(want, testEntries, layout)
			for _, batch := range []int{1, 32} {
				for _, lock := range []string{"none", "mutex"} {
					extra := []string{"-D"}
					if lock == "mutex" {
						extra = append(extra, "-T")
					}
					kv := parseLine(t, runPair(ctx, t, out, "reader", layout, mode, batch, extra...))
					name := fmt.Sprintf("reader -D layout=%s mode=%s batch=%d lock=%s", layout, mode, batch, lock)
					require.Equal(t, "driver", kv["work"], name)
					require.Equal(t, layout, kv["layout"], name)
					require.Equal(t, lock, kv["locking"], name)
					require.Equal(t, mode, kv["mode"], name)
					require.Equal(t, "ok", kv["order"], name)
					require.Equal(t, strconv.FormatUint(want, 10), kv["completions"], name)
					require.Equal(t, digest, kv["digest"], name)
				}
			}
		}
	}
}
