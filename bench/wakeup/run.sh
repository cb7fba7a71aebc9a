#!/usr/bin/env bash
# run.sh: interrupt wake-up latency, vfnic's sleeping paths against C (see
# README.md). Builds ../c/wakeup.c with gcc -O2 and this folder's Go
# program, then REPEAT times, alternating, runs the C reference and the Go
# modes (sread, sread-locked, lcore, adaptive) in two placements: "cross" (reader on
# one CPU, writer on another: an interrupt from elsewhere wakes an idle CPU)
# and "same" (both on one CPU: no idle CPU to wake, the kernel's and the
# runtime's own path). Prints a table of the medians over the runs of each
# run's median and p99, and the ratios to C.
#
# Settings (environment): OUT (build folder, default bench/out), SAMPLES
# (per run and mode, 2000), REPEAT (5), READER and WRITER (CPUs, 1 and 0),
# PLACEMENTS ("cross same"), GO (go command).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
OUT=${OUT:-$root/bench/out}
SAMPLES=${SAMPLES:-2000}
REPEAT=${REPEAT:-5}
READER=${READER:-1}
WRITER=${WRITER:-0}
PLACEMENTS=${PLACEMENTS:-"cross same"}
MODES="c sread sread-locked lcore adaptive"

die() { echo "run.sh: $*" >&2; exit 1; }
command -v gcc >/dev/null 2>&1 || die "gcc is missing; install it with: apt-get install gcc"
GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
[ "$(nproc)" -ge 2 ] || PLACEMENTS=same

mkdir -p "$OUT"
gcc -O2 -std=c11 -Wall -Wextra -Werror -pthread -o "$OUT/wakeup-c" "$root/bench/c/wakeup.c"
(cd "$root" && CGO_ENABLED=0 "$GO" build -o "$OUT/wakeup-go" ./bench/wakeup)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<" $2"; }
median() { sort -g | awk '{v[NR]=$1} END {if (NR%2) print v[(NR+1)/2]; else print (v[NR/2]+v[NR/2+1])/2}'; }

echo "wake-up latency: eventfd write -> reader has the completion (ns)"
echo "cpu: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), $(nproc) CPUs; load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "$SAMPLES samples per run and mode, $REPEAT runs, C and Go alternating"
for ((i = 0; i < REPEAT; i++)); do
	for p in $PLACEMENTS; do
		w=$WRITER
		[ "$p" = same ] && w=$READER
		"$OUT/wakeup-c" -n "$SAMPLES" -r "$READER" -w "$w" >"$tmp/out"
		"$OUT/wakeup-go" -n "$SAMPLES" -r "$READER" -w "$w" >>"$tmp/out"
		while read -r line; do
			m=$(field mode "$line")
			field median_ns "$line" >>"$tmp/$p.$m.med"
			field p99_ns "$line" >>"$tmp/$p.$m.p99"
		done <"$tmp/out"
	done
	printf '.' >&2
done
printf '\n' >&2

printf '%-6s %-13s %12s %12s %10s %10s\n' placement mode "median ns" "p99 ns" "median/C" "p99/C"
for p in $PLACEMENTS; do
	cm=$(median <"$tmp/$p.c.med") cp=$(median <"$tmp/$p.c.p99")
	for m in $MODES; do
		mm=$(median <"$tmp/$p.$m.med") mp=$(median <"$tmp/$p.$m.p99")
		printf '%-6s %-13s %12.0f %12.0f %9.2fx %9.2fx\n' "$p" "$m" "$mm" "$mp" \
			"$(awk -v a="$mm" -v b="$cm" 'BEGIN {print a/b}')" "$(awk -v a="$mp" -v b="$cp" 'BEGIN {print a/b}')"
	done
done
echo "(medians over $REPEAT runs of each run's median and p99; cross: reader on CPU $READER, writer on CPU $WRITER; same: both on CPU $READER)"
