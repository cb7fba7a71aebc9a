#!/usr/bin/env bash
# run.sh: interrupt wake-up latency, vfnic's sleeping paths against C (see
# README.md). Builds ../c/wakeup.c with gcc -O2 and this folder's Go
# program, then REPEAT times, alternating, runs the C reference and the Go
# modes (sread, sread-locked, lcore, adaptive) in two placements: "cross" (reader on
# one CPU, writer on another: an interrupt from elsewhere wakes an idle CPU)
# and "same" (both on one CPU: no idle CPU to wake, the kernel's and the
# runtime's own path). Prints a table of the
# medians over the runs of each run's median and p99, and the ratios to C.
#
# BASE=<git revision or wakeup binary> adds a second build of the Go
# program (for example the main branch, before a change), run alternately
# with this tree's in every round, and the table gives both side by side.
#
# Settings (environment): OUT (build folder, default bench/out), SAMPLES
# (per run and mode, 2000), REPEAT (5), READER and WRITER (CPUs, 1 and 0),
# PLACEMENTS ("cross same"), GO (go command), BASE (none).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
OUT=${OUT:-$root/bench/out}
SAMPLES=${SAMPLES:-2000}
REPEAT=${REPEAT:-5}
READER=${READER:-1}
WRITER=${WRITER:-0}
PLACEMENTS=${PLACEMENTS:-"cross same"}
BASE=${BASE:-}
MODES="c sread sread-locked lcore adaptive"

die() { echo "run.sh: $*" >&2; exit 1; }
command -v gcc >/dev/null 2>&1 || die "gcc is missing; install it with: apt-get install gcc"
GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
[ "$(nproc)" -ge 2 ] || PLACEMENTS=same

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

mkdir -p "$OUT"
gcc -O2 -std=c11 -Wall -Wextra -Werror -pthread -o "$OUT/wakeup-c" "$root/bench/c/wakeup.c"
(cd "$root" && CGO_ENABLED=0 "$GO" build -o "$OUT/wakeup-go" ./bench/wakeup)
builds=this
if [ -n "$BASE" ]; then
	if [ -f "$BASE" ] && [ -x "$BASE" ]; then
		cp "$BASE" "$OUT/wakeup-go-base"
	else
		rev=$(git -C "$root" rev-parse --verify --quiet "$BASE^{commit}") || die "BASE=$BASE is neither a wakeup binary nor a git revision"
		mkdir "$tmp/base"
		git -C "$root" archive "$rev" | tar -x -C "$tmp/base"
		(cd "$tmp/base" && CGO_ENABLED=0 "$GO" build -o "$OUT/wakeup-go-base" ./bench/wakeup)
		BASE="$BASE ($(git -C "$root" rev-parse --short "$rev"))"
	fi
	builds="base this"
fi
bin() { if [ "$1" = base ]; then echo "$OUT/wakeup-go-base"; else echo "$OUT/wakeup-go"; fi; }

field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<" $2"; }
median() { sort -g | awk '{v[NR]=$1} END {if (NR%2) print v[(NR+1)/2]; else print (v[NR/2]+v[NR/2+1])/2}'; }
load() { cut -d' ' -f1-3 /proc/loadavg; }

echo "wake-up latency: eventfd write -> reader has the completion (ns)"
echo "cpu: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), $(nproc) CPUs; kernel $(uname -r); load at start: $(load)"
echo "$SAMPLES samples per run and mode, $REPEAT runs, C and Go alternating${BASE:+; base: $BASE, this: $(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet HEAD -- . ':(exclude)*.md' 2>/dev/null || echo '+changes')}"
failed=0
for ((i = 0; i < REPEAT; i++)); do
	order=$builds
	[ $((i % 2)) = 1 ] && [ -n "$BASE" ] && order="this base"
	for p in $PLACEMENTS; do
		w=$WRITER
		[ "$p" = same ] && w=$READER
		"$OUT/wakeup-c" -n "$SAMPLES" -r "$READER" -w "$w" | sed 's/^/build=c /' >"$tmp/out"
		for b in $order; do
			# A run that fails (a reader that did not wake within 1 s) is
			# reported and counted, and the others go on: its modes have
			# one run fewer.
			if ! "$(bin "$b")" -n "$SAMPLES" -r "$READER" -w "$w" 2>"$tmp/err" | sed "s/^/build=$b /" >>"$tmp/out"; then
				echo "run.sh: round $((i + 1)), $p, build $b: $(cat "$tmp/err")" >&2
				failed=$((failed + 1))
			fi
		done
		while read -r line; do
			b=$(field build "$line") m=$(field mode "$line")
			[ "$m" = c ] && b=this
			field median_ns "$line" >>"$tmp/$p.$m.$b.med"
			field p99_ns "$line" >>"$tmp/$p.$m.$b.p99"
		done <"$tmp/out"
	done
	printf '.' >&2
done
printf '\n' >&2

[ "$failed" = 0 ] || echo "run.sh: $failed Go runs failed (above); their modes have fewer runs" >&2

# cell FILE-PREFIX C-PREFIX: "median p99 (ratio/C ratio/C)" over the runs
cell() {
	local mm mp cm cp
	[ -s "$1.med" ] || { printf '%9s %9s %7s %7s' - - - -; return; }
	mm=$(median <"$1.med") mp=$(median <"$1.p99") cm=$(median <"$2.med") cp=$(median <"$2.p99")
	awk -v mm="$mm" -v mp="$mp" -v cm="$cm" -v cp="$cp" 'BEGIN {printf "%9.0f %9.0f %6.2fx %6.2fx", mm, mp, mm/cm, mp/cp}'
}
if [ -n "$BASE" ]; then
	printf '%-9s %-13s | %-38s | %-38s\n' "" "" "base" "this"
fi
printf '%-9s %-13s' placement mode
for b in $builds; do printf ' | %9s %9s %7s %7s' "median ns" "p99 ns" "med/C" "p99/C"; done
printf '\n'
for p in $PLACEMENTS; do
	for m in $MODES; do
		printf '%-9s %-13s' "$p" "$m"
		for b in $builds; do
			bb=$b
			[ "$m" = c ] && bb=this
			printf ' | %s' "$(cell "$tmp/$p.$m.$bb" "$tmp/$p.c.this")"
		done
		printf '\n'
	done
done
echo "(medians over $REPEAT runs of each run's median and p99; cross: reader on CPU $READER, writer on CPU $WRITER; same: both on CPU $READER; load at end: $(load))"
