#!/usr/bin/env bash
# run.sh: vfnic's completion path against a C reference (see README.md).
#
# Builds bench/c/producer.c and bench/c/reader.c with gcc -O2 and
# bench/goreader with go, then for each ring layout (sim: cq/qpsim's CQE;
# packed: the virtio packed ring; split: the virtio split used ring), mode
# (filled, stream, local) and batch size runs the producer with the C reader
# and with the Go reader (local: the readers alone), REPEAT times each,
# alternating, and prints one table of medians: C and Go ns per completion
# and the Go/C ratio, then the batch-32 ratios against the targets.
#
# Locking, like for like: a mode name without a suffix runs the Go reader
# with a SingleThreaded cq.CQ and a ring.NewSingleThreadedTable (no locked
# instruction per completion) against the C reader in a process of one
# thread, where glibc's pthread mutexes execute no locked instruction
# either (locking "none"); a mode with the suffix -mutex ("stream-mutex")
# runs the thread-safe CQ and Table (a mutex per Read and per Post) against
# the C reader with an idle second thread, so that its mutexes really lock
# (locking "mutex").
#
# Driver rows: for each of DRIVERS (virtio packed, virtio split, igb) and
# DRIVER_MODES (local, filled), batch 32, the drivers' own read code: a
# real nic/virtio or nic/igb receive queue over an in-memory ring of
# DRIVER_ENTRIES descriptors, read with Poll (BenchmarkDriverRead in the
# driver's package; its device is the tests' fake one, a Go producer that
# writes what the device writes, since the C producer does not follow the
# available ring), beside two C references on the same layout and ring
# size: the C ring reader alone (cq_read_*, as before), and the C driver
# work (reader -D -T, drv_poll_*: the same ring reader plus what the
# driver's Poll does per completion and per batch; README.md lists what
# it still does differently). The targets apply to the second, the like
# for like. No stream mode for them: the fake device cannot run while the
# queue reads.
#
# Settings (environment): OUT (build folder, default bench/out), ENTRIES
# (ring size, 4096), COUNT (completions per run, 2000000), REPEAT (7),
# BATCHES ("1 8 32 256"), LAYOUTS ("sim packed split"), MODES ("filled
# stream local stream-mutex"), DRIVERS ("packed split igb"; "" for none),
# DRIVER_MODES ("local filled"), DRIVER_ENTRIES (1024), SHM (folder for
# the ring file, /dev/shm), GO (go command).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
OUT=${OUT:-$here/out}
ENTRIES=${ENTRIES:-4096}
COUNT=${COUNT:-2000000}
REPEAT=${REPEAT:-7}
BATCHES=${BATCHES:-"1 8 32 256"}
MODES=${MODES:-"filled stream local stream-mutex"}
LAYOUTS=${LAYOUTS-"sim packed split"}
DRIVERS=${DRIVERS-"packed split igb"}
DRIVER_MODES=${DRIVER_MODES:-"local filled"}
DRIVER_ENTRIES=${DRIVER_ENTRIES:-1024}
SHM=${SHM:-/dev/shm}
# Targets at batch 32 (issue 8): filled and local 1.10x, stream 1.25x.
target() { case $1 in filled* | local*) echo 1.10 ;; *) echo 1.25 ;; esac; }
TIMEOUT=30

die() { echo "run.sh: $*" >&2; exit 1; }

command -v gcc >/dev/null 2>&1 || die "gcc is missing; install it with: apt-get install gcc"
GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
[ -x "$GO" ] || command -v "$GO" >/dev/null 2>&1 || die "go is missing (expected in PATH or /usr/local/go/bin)"
[ -d "$SHM" ] && [ -w "$SHM" ] || die "$SHM is not a writable folder (set SHM to a tmpfs or hugetlbfs mount)"

mkdir -p "$OUT"
cflags=(-O2 -std=c11 -Wall -Wextra -Werror)
gcc "${cflags[@]}" -o "$OUT/producer" "$here/c/producer.c"
gcc "${cflags[@]}" -o "$OUT/reader" "$here/c/reader.c" -lpthread
(cd "$root" && CGO_ENABLED=0 "$GO" build -o "$OUT/goreader" ./bench/goreader)
if [ -n "$DRIVERS" ]; then
	(cd "$root" && CGO_ENABLED=0 "$GO" test -c -o "$OUT/virtio.test" ./nic/virtio &&
		CGO_ENABLED=0 "$GO" test -c -o "$OUT/igb.test" ./nic/igb)
fi

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

# run_one BIN LAYOUT MODE BATCH [FLAG...]: one producer + reader pair;
# prints the reader's line. MODE may carry the suffix -mutex (see the
# top); FLAGs go to the reader (-D -T: the C driver work).
run_one() {
	local bin=$1 layout=$2 mode=${3%-mutex} batch=$4 f line lock=() entries=${ENT:-$ENTRIES}
	case "$3" in
	*-mutex) [ "$bin" = reader ] && lock=(-T) ;;
	*) [ "$bin" = goreader ] && lock=(-s) ;;
	esac
	lock+=("${@:5}")
	if [ "$mode" = local ]; then
		line=$("${read_pin[@]}" "$OUT/$bin" -l -L "$layout" -n "$entries" -c "$COUNT" -b "$batch" "${lock[@]}" 2>"$tmp/reader.err") ||
			{ cat "$tmp/reader.err" >&2; die "$bin failed (layout $layout, mode $3, batch $batch)"; }
		case "$line" in
		*" order=ok "*) echo "$line" && return ;;
		*) die "$bin: unexpected output: $line" ;;
		esac
	fi
	f="$SHM/vfnic-bench-$$-$RANDOM"
	"${prod_pin[@]}" "$OUT/producer" -f "$f" -L "$layout" -n "$entries" -m "$mode" -c "$COUNT" -t "$TIMEOUT" \
		>"$tmp/producer.out" 2>"$tmp/producer.err" &
	prod_pid=$!
	if ! line=$("${read_pin[@]}" "$OUT/$bin" -f "$f" -b "$batch" -t "$TIMEOUT" "${lock[@]}" 2>"$tmp/reader.err"); then
		wait "$prod_pid" || true
		prod_pid=
		cat "$tmp/reader.err" "$tmp/producer.err" >&2
		die "$bin failed (layout $layout, mode $3, batch $batch)"
	fi
	if ! wait "$prod_pid"; then
		prod_pid=
		cat "$tmp/producer.err" >&2
		die "producer failed (layout $layout, mode $3, batch $batch, reader $bin)"
	fi
	prod_pid=
	rm -f "$f" "$f.tmp"
	case "$line" in
	*" order=ok "*) ;;
	*) die "$bin: unexpected output: $line" ;;
	esac
	echo "$line"
}

# run_driver LAYOUT MODE: BenchmarkDriverRead of the driver's package
# for LAYOUT (packed, split: nic/virtio; igb: nic/igb) in MODE (local,
# filled) at batch 32; prints "ns allocs". The benchmark pins its reader
# to CPU 0 and its device to CPU 1 itself.
run_driver() {
	local layout=$1 mode=$2 bin=virtio.test out
	[ "$layout" = igb ] && bin=igb.test
	out=$(VFNIC_BENCH_ENTRIES=$DRIVER_ENTRIES VFNIC_BENCH_BATCH=32 "$OUT/$bin" -test.run '^$' \
		-test.bench "^BenchmarkDriverRead\$/^layout=$layout\$/^mode=$mode\$" -test.benchtime "${COUNT}x" -test.benchmem 2>&1) ||
		{ echo "$out" >&2; die "$bin BenchmarkDriverRead failed (layout $layout, mode $mode)"; }
	awk '/^BenchmarkDriverRead/ {for (i = 1; i < NF; i++) {if ($(i+1) == "ns/completion") ns = $i; if ($(i+1) == "allocs/op") al = $i}}
		END {if (ns == "") exit 1; print ns, al}' <<<"$out" || { echo "$out" >&2; die "$bin: no ns/completion in its output"; }
}

# field NAME LINE: the value of NAME=value in a reader's line.
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<" $2"; }

median() { sort -g | awk '{v[NR]=$1} END {if (NR%2) print v[(NR+1)/2]; else print (v[NR/2]+v[NR/2+1])/2}'; }

echo "vfnic completion path: Go (cq.CQ.Read over cq/ring) vs C reference, same C producer"
echo "cpu: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), $(nproc) CPUs, $pinning"
echo "ring: $ENTRIES entries in $SHM; $COUNT completions per run; $REPEAT runs of each"
echo "layouts: sim = cq/qpsim's 64-byte CQE (phase bit); packed = virtio packed ring (16-byte descriptors,"
echo "         AVAIL/USED wrap bits); split = virtio split used ring (8-byte elements, 16-bit used index)"
echo "filled: reader alone on a ring the producer wrote for a whole lap (reads only; re-posts untimed)"
echo "stream: end to end, producer writing while the reader reads and re-posts each completion"
echo "local:  no producer; the reader fills each lap itself (untimed), then times its reads: CPU cost alone"
echo "lock none:  Go SingleThreaded cq.CQ + ring.NewSingleThreadedTable vs C reader, one thread (no locked instruction)"
echo "lock mutex: Go thread-safe cq.CQ + ring.NewTable (mutexes) vs C reader with an idle 2nd thread (mutexes lock)"
echo

# Each pass runs every cell once, so that a burst of load from elsewhere on
# the machine spoils one sample of many cells rather than all of one.
for ((i = 0; i < REPEAT; i++)); do
	for layout in $DRIVERS; do
		for mode in $DRIVER_MODES; do
			cell=driver.$layout.$mode
			line=$(ENT=$DRIVER_ENTRIES run_one reader "$layout" "$mode" 32)
			field ns_per_completion "$line" >>"$tmp/c.$cell"
			line=$(ENT=$DRIVER_ENTRIES run_one reader "$layout" "$mode" 32 -D -T)
			[ "$(field work "$line")" = driver ] || die "reader -D: not the driver work: $line"
			field ns_per_completion "$line" >>"$tmp/cd.$cell"
			read -r ns al < <(run_driver "$layout" "$mode")
			echo "$ns" >>"$tmp/go.$cell"
			echo "$al" >>"$tmp/alloc.$cell"
		done
	done
	for layout in $LAYOUTS; do
		for mode in $MODES; do
			for batch in $BATCHES; do
				cell=$layout.$mode.$batch
				line=$(run_one reader "$layout" "$mode" "$batch")
				field ns_per_completion "$line" >>"$tmp/c.$cell"
				line=$(run_one goreader "$layout" "$mode" "$batch")
				field ns_per_completion "$line" >>"$tmp/go.$cell"
				field allocs_per_completion "$line" >>"$tmp/alloc.$cell"
				field loop "$line" >"$tmp/loop.$layout"
			done
		done
	done
	printf '.' >&2
done
printf '\n' >&2

declare -A cns cdns gons
ratio() { awk -v g="$1" -v c="$2" 'BEGIN {printf "%.2f", g/c}'; }
lockname() { case $1 in *-mutex) echo mutex ;; *) echo none ;; esac; }
printf '%-7s %-7s %-6s %6s %12s %12s %7s %12s %16s\n' layout mode lock batch "C ns/compl" "Go ns/compl" "Go/C" "Go/C (best)" "Go allocs/compl"
for layout in $LAYOUTS; do
	for mode in $MODES; do
		for batch in $BATCHES; do
			cell=$layout.$mode.$batch
			c=$(median <"$tmp/c.$cell") g=$(median <"$tmp/go.$cell")
			cmin=$(sort -g "$tmp/c.$cell" | head -1) gmin=$(sort -g "$tmp/go.$cell" | head -1)
			cns[$cell]=$c gons[$cell]=$g
			printf '%-7s %-7s %-6s %6s %12.2f %12.2f %6sx %11sx %16s\n' "$layout" "${mode%-mutex}" "$(lockname "$mode")" \
				"$batch" "$c" "$g" "$(ratio "$g" "$c")" "$(ratio "$gmin" "$cmin")" "$(sort -g "$tmp/alloc.$cell" | tail -1)"
		done
	done
done
if [ -n "$DRIVERS" ]; then
	echo
	echo "Driver rows: a real receive queue's Poll (nic/virtio, nic/igb: ring reader, driver pass, buffer lending,"
	echo "nic.Completion) over a ring of $DRIVER_ENTRIES descriptors that a Go fake device filled, batch 32, beside two"
	echo "C references on the same layout and ring size: \"C ring\", the C ring reader alone (cq_read_*: a 40-byte"
	echo "fi_cq_data_entry, no look at the frame, no lending, one thread: its mutex locks nothing), and \"C drv\", the"
	echo "C driver work (drv_poll_*, reader -D -T: also the queue's counts, virtio-net's length and num_buffers or"
	echo "igb's length and per-buffer write-back words, lending the buffer, a 64-byte record with nic.Completion's"
	echo "fields, the per-batch atomic counters, its mutex locking as Go's sync.Mutex does); the targets apply to C drv:"
	printf '%-14s %-7s %10s %10s %12s %9s %9s %14s %16s\n' driver mode "C ring ns" "C drv ns" "Go Poll ns" "Go/C ring" \
		"Go/C drv" "Go/C drv best" "Go allocs/compl"
	for layout in $DRIVERS; do
		for mode in $DRIVER_MODES; do
			cell=driver.$layout.$mode
			c=$(median <"$tmp/c.$cell") cd=$(median <"$tmp/cd.$cell") g=$(median <"$tmp/go.$cell")
			cdmin=$(sort -g "$tmp/cd.$cell" | head -1) gmin=$(sort -g "$tmp/go.$cell" | head -1)
			cns[$cell]=$c cdns[$cell]=$cd gons[$cell]=$g
			name=virtio-$layout
			[ "$layout" = igb ] && name=igb
			printf '%-14s %-7s %10.2f %10.2f %12.2f %8sx %8sx %13sx %16s\n' "$name" "$mode" "$c" "$cd" "$g" \
				"$(ratio "$g" "$c")" "$(ratio "$g" "$cd")" "$(ratio "$gmin" "$cdmin")" "$(sort -g "$tmp/alloc.$cell" | tail -1)"
		done
	done
fi
echo "(medians of $REPEAT runs; \"best\" is the ratio of the fastest runs, the least disturbed by other load)"
echo
echo "The C reader does the Go path's checks and conversion; it differs in: a refused entry"
echo "stops the run (Go stages an error completion for ReadErr); fields are read through a C"
echo "struct with constant offsets (so does Go: cq/ring has a copy of its loop per driver's ring"
echo "shape with the offsets as constants, gen_fast.go); it fills a 40-byte fi_cq_data_entry"
echo "(cq.Entry is 64 bytes: interface Context, Tag, Queue)."
for layout in $LAYOUTS; do
	[ -s "$tmp/loop.$layout" ] && echo "Go loop, $layout: $(cat "$tmp/loop.$layout")"
done
echo
for layout in $DRIVERS; do
	for mode in $DRIVER_MODES; do
		c=${cns[driver.$layout.$mode]:-} cd=${cdns[driver.$layout.$mode]:-} g=${gons[driver.$layout.$mode]:-}
		[ -n "$c" ] || continue
		awk -v l="$layout" -v m="$mode" -v g="$g" -v c="$c" -v cd="$cd" -v t="$(target "$mode")" 'BEGIN {
			r = g / cd
			printf "batch 32, driver %s %s: Go Poll %.2f ns, C driver work %.2f ns per completion: Go/C = %.2fx, %s the %.2fx target (C ring reader %.2f ns: %.2fx)\n",
				l, m, g, cd, r, (r <= t ? "within" : "above"), t, c, g / c }'
	done
done
for layout in $LAYOUTS; do
	for mode in $MODES; do
		c=${cns[$layout.$mode.32]:-} g=${gons[$layout.$mode.32]:-}
		[ -n "$c" ] || continue
		awk -v l="$layout" -v m="${mode%-mutex}" -v k="$(lockname "$mode")" -v g="$g" -v c="$c" -v t="$(target "$mode")" 'BEGIN {
			r = g / c
			printf "batch 32, %s %s, lock %s: Go %.2f ns, C %.2f ns per completion: Go/C = %.2fx, %s the %.2fx target\n",
				l, m, k, g, c, r, (r <= t ? "within" : "above"), t }'
	done
done
