#!/usr/bin/env bash
# run.sh: vfnic's completion path against a C reference (see README.md).
#
# Builds bench/c/producer.c and bench/c/reader.c with gcc -O2 and
# bench/goreader with go, then for each mode (filled, stream, local) and
# batch size runs the producer with the C reader and with the Go reader
# (local: the readers alone), REPEAT times each, alternating, and prints one
# table of medians: C and Go ns per completion and the Go/C ratio, then the
# batch-32 ratios against the target.
#
# Settings (environment): OUT (build folder, default bench/out), ENTRIES
# (ring size, 4096), COUNT (completions per run, 2000000), REPEAT (7),
# BATCHES ("1 8 32 256"), MODES ("filled stream local"), SHM (folder for the ring
# file, /dev/shm), GO (go command).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
OUT=${OUT:-$here/out}
ENTRIES=${ENTRIES:-4096}
COUNT=${COUNT:-2000000}
REPEAT=${REPEAT:-7}
BATCHES=${BATCHES:-"1 8 32 256"}
MODES=${MODES:-"filled stream local"}
SHM=${SHM:-/dev/shm}
TARGET=1.25
TIMEOUT=30

die() { echo "run.sh: $*" >&2; exit 1; }

command -v gcc >/dev/null 2>&1 || die "gcc is missing; install it with: apt-get install gcc"
GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
[ -x "$GO" ] || command -v "$GO" >/dev/null 2>&1 || die "go is missing (expected in PATH or /usr/local/go/bin)"
[ -d "$SHM" ] && [ -w "$SHM" ] || die "$SHM is not a writable folder (set SHM to a tmpfs or hugetlbfs mount)"

mkdir -p "$OUT"
cflags=(-O2 -std=c11 -Wall -Wextra -Werror)
gcc "${cflags[@]}" -o "$OUT/producer" "$here/c/producer.c"
gcc "${cflags[@]}" -o "$OUT/reader" "$here/c/reader.c"
(cd "$root" && CGO_ENABLED=0 "$GO" build -o "$OUT/goreader" ./bench/goreader)

# Producer and reader on different CPUs when there are two to pin to.
prod_pin=() read_pin=() pinning="not pinned"
if command -v taskset >/dev/null 2>&1 && [ "$(nproc)" -ge 2 ]; then
	prod_pin=(taskset -c 1) read_pin=(taskset -c 0) pinning="reader on CPU 0, producer on CPU 1 (taskset)"
fi

tmp=$(mktemp -d)
prod_pid=
cleanup() {
	if [ -n "$prod_pid" ]; then kill "$prod_pid" 2>/dev/null || true; fi
	rm -rf "$tmp"
	rm -f "$SHM"/vfnic-bench-$$-*
}
trap cleanup EXIT

# run_one BIN MODE BATCH: one producer + reader pair; prints the reader's
# line.
run_one() {
	local bin=$1 mode=$2 batch=$3 f line
	if [ "$mode" = local ]; then
		line=$("${read_pin[@]}" "$OUT/$bin" -l -n "$ENTRIES" -c "$COUNT" -b "$batch" 2>"$tmp/reader.err") ||
			{ cat "$tmp/reader.err" >&2; die "$bin failed (mode local, batch $batch)"; }
		case "$line" in
		*" order=ok "*) echo "$line" && return ;;
		*) die "$bin: unexpected output: $line" ;;
		esac
	fi
	f="$SHM/vfnic-bench-$$-$RANDOM"
	"${prod_pin[@]}" "$OUT/producer" -f "$f" -n "$ENTRIES" -m "$mode" -c "$COUNT" -t "$TIMEOUT" \
		>"$tmp/producer.out" 2>"$tmp/producer.err" &
	prod_pid=$!
	if ! line=$("${read_pin[@]}" "$OUT/$bin" -f "$f" -b "$batch" -t "$TIMEOUT" 2>"$tmp/reader.err"); then
		wait "$prod_pid" || true
		prod_pid=
		cat "$tmp/reader.err" "$tmp/producer.err" >&2
		die "$bin failed (mode $mode, batch $batch)"
	fi
	if ! wait "$prod_pid"; then
		prod_pid=
		cat "$tmp/producer.err" >&2
		die "producer failed (mode $mode, batch $batch, reader $bin)"
	fi
	prod_pid=
	rm -f "$f" "$f.tmp"
	case "$line" in
	*" order=ok "*) ;;
	*) die "$bin: unexpected output: $line" ;;
	esac
	echo "$line"
}

# field NAME LINE: the value of NAME=value in a reader's line.
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<" $2"; }

median() { sort -g | awk '{v[NR]=$1} END {if (NR%2) print v[(NR+1)/2]; else print (v[NR/2]+v[NR/2+1])/2}'; }

echo "vfnic completion path: Go (cq.CQ.Read over nic/sim's ring layout) vs C reference"
echo "cpu: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), $(nproc) CPUs, $pinning"
echo "ring: $ENTRIES x 64-byte entries in $SHM; $COUNT completions per run; $REPEAT runs of each"
echo "filled: reader alone on a ring the producer wrote for a whole lap (reads only; re-posts untimed)"
echo "stream: end to end, producer writing while the reader reads and re-posts each completion"
echo "local:  no producer; the reader fills each lap itself (untimed), then times its reads: CPU cost alone"
echo

# Each pass runs every cell once, so that a burst of load from elsewhere on
# the machine spoils one sample of many cells rather than all of one.
for ((i = 0; i < REPEAT; i++)); do
	for mode in $MODES; do
		for batch in $BATCHES; do
			line=$(run_one reader "$mode" "$batch")
			field ns_per_completion "$line" >>"$tmp/c.$mode.$batch"
			line=$(run_one goreader "$mode" "$batch")
			field ns_per_completion "$line" >>"$tmp/go.$mode.$batch"
			field allocs_per_completion "$line" >>"$tmp/alloc.$mode.$batch"
		done
	done
	printf '.' >&2
done
printf '\n' >&2

declare -A cns gons
ratio() { awk -v g="$1" -v c="$2" 'BEGIN {printf "%.2f", g/c}'; }
printf '%-7s %6s %12s %12s %7s %12s %16s\n' mode batch "C ns/compl" "Go ns/compl" "Go/C" "Go/C (best)" "Go allocs/compl"
for mode in $MODES; do
	for batch in $BATCHES; do
		c=$(median <"$tmp/c.$mode.$batch") g=$(median <"$tmp/go.$mode.$batch")
		cmin=$(sort -g "$tmp/c.$mode.$batch" | head -1) gmin=$(sort -g "$tmp/go.$mode.$batch" | head -1)
		cns[$mode/$batch]=$c gons[$mode/$batch]=$g
		printf '%-7s %6s %12.2f %12.2f %6sx %11sx %16s\n' "$mode" "$batch" "$c" "$g" "$(ratio "$g" "$c")" \
			"$(ratio "$gmin" "$cmin")" "$(sort -g "$tmp/alloc.$mode.$batch" | tail -1)"
	done
done
echo "(medians of $REPEAT runs; \"best\" is the ratio of the fastest runs, the least disturbed by other load)"
echo
echo "The C reader does the Go path's checks and conversion; it differs in: a refused entry"
echo "stops the run (Go stages an error completion for ReadErr); fields are read through a C"
echo "struct with constant offsets (Go loads them at cq.Layout's offsets); it fills a 40-byte"
echo "fi_cq_data_entry (cq.Entry is 64 bytes: interface Context, Tag, Queue); its release"
echo "stores are plain stores (Go's atomic.StoreUint32 is an XCHG)."
echo
for mode in $MODES; do
	c=${cns[$mode/32]:-} g=${gons[$mode/32]:-}
	[ -n "$c" ] || continue
	awk -v m="$mode" -v g="$g" -v c="$c" -v t="$TARGET" 'BEGIN {
		r = g / c
		printf "batch 32, %s: Go %.2f ns, C %.2f ns per completion: Go/C = %.2fx, %s the %.2fx target\n",
			m, g, c, r, (r <= t ? "within" : "above"), t }'
done
