#!/usr/bin/env bash
# callgrind.sh: instructions per completion of the read path, counted by
# valgrind's callgrind (exact, whatever the machine's load), for the
# driver rows of run.sh and their two C references: the C ring reader's
# cq_read_packed, cq_read_split and cq_read_igb, and the C driver work's
# drv_poll_packed, drv_poll_split and drv_poll_igb (reader -D -T: the same
# ring reader plus the driver's work; local mode, built without inlining
# so that callgrind names them), and a real nic/virtio or nic/igb
# receive queue's Poll (BenchmarkDriverRead, local mode) with, inside it,
# the ring reader's NextBatch. Each count is the function's inclusive cost
# over the completions read.
#
# Go runs with GOGC=off (a collection running during a read changes its
# count), GOMAXPROCS=1 and GODEBUG=asyncpreemptoff=1,cpu.rdtscp=off
# (valgrind 3.19 decodes neither the preemption signal's return nor
# RDTSCP). Settings: OUT (build folder, bench/out), ENTRIES (ring size,
# 1024), LAPS (100), GO.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
OUT=${OUT:-$here/out}
ENTRIES=${ENTRIES:-1024}
LAPS=${LAPS:-100}
GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
command -v valgrind >/dev/null || { echo "callgrind.sh: valgrind is missing (apt-get install valgrind)" >&2; exit 1; }
mkdir -p "$OUT"
gcc -O2 -g -std=c11 -fno-inline-functions-called-once -fno-inline-small-functions -fno-inline-functions \
	-o "$OUT/reader-cg" "$here/c/reader.c" -lpthread
(cd "$root" && CGO_ENABLED=0 "$GO" test -c -o "$OUT/virtio.test" ./nic/virtio && CGO_ENABLED=0 "$GO" test -c -o "$OUT/igb.test" ./nic/igb)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# per FILE FUNC COMPLETIONS: FUNC's inclusive instructions per completion.
per() {
	callgrind_annotate --inclusive=yes --threshold=100 "$1" | awk -v f="$2" -v c="$3" '
		!found && (index($0, f " [") || index($0, f ".constprop")) { gsub(",", "", $1); v = $1 / c; found = 1 }
		END { if (found) printf "%.1f", v; else printf "?" }'
}

printf '%-14s %14s %14s %10s %14s %10s\n' layout "C ring reader" "C driver work" "Go Poll" "Go NextBatch" "Go/C drv"
for layout in packed split igb; do
	count=$((ENTRIES * LAPS * 4))
	valgrind --tool=callgrind --callgrind-out-file="$tmp/c" "$OUT/reader-cg" -l -L "$layout" -n "$ENTRIES" -c "$count" -b 32 >/dev/null 2>&1
	c=$(per "$tmp/c" "cq_read_$layout" "$count")
	valgrind --tool=callgrind --callgrind-out-file="$tmp/cd" "$OUT/reader-cg" -l -L "$layout" -n "$ENTRIES" -c "$count" -b 32 -D -T >/dev/null 2>&1
	cd=$(per "$tmp/cd" "drv_poll_$layout" "$count")
	bin=virtio.test lap=$ENTRIES name=virtio-$layout
	if [ "$layout" = igb ]; then
		bin=igb.test lap=$((ENTRIES - 1)) name=igb # igb posts all descriptors but one
	fi
	n=$((ENTRIES * LAPS))
	# The benchmark reads one lap at b.N=1, then whole laps up to n.
	comps=$((lap + (n + lap - 1) / lap * lap))
	ok=
	for _ in 1 2 3; do
		if GOGC=off GOMAXPROCS=1 GODEBUG=asyncpreemptoff=1,cpu.rdtscp=off VFNIC_BENCH_ENTRIES=$ENTRIES \
			valgrind --tool=callgrind --callgrind-out-file="$tmp/go" "$OUT/$bin" -test.run '^$' \
			-test.bench "^BenchmarkDriverRead\$/^layout=$layout\$/^mode=local\$" -test.benchtime "${n}x" >"$tmp/log" 2>&1 &&
			grep -q ns/completion "$tmp/log"; then
			ok=1
			break
		fi
	done
	[ -n "$ok" ] || { cat "$tmp/log" >&2; echo "callgrind.sh: $bin failed under valgrind" >&2; exit 1; }
	poll=$(per "$tmp/go" "queue.(*Queue).Poll" "$comps")
	nb=$(per "$tmp/go" "ring.(*RingSource).NextBatch" "$comps")
	r=$(awk -v g="$poll" -v c="$cd" 'BEGIN { if (g + 0 > 0 && c + 0 > 0) printf "%.2fx", g / c; else printf "?" }')
	printf '%-14s %14s %14s %10s %14s %10s\n' "$name" "$c" "$cd" "$poll" "$nb" "$r"
done
echo "(instructions per completion, inclusive; C ring reader: the whole cq_read_* call, doorbell and table flush"
echo " included; C driver work: the whole drv_poll_* call, the same ring reader plus the queue's counts, the"
echo " frame's checks, lending, a record with nic.Completion's fields and the batch's counters, see README.md;"
echo " Go Poll: the queue's lock, the ring reader, the driver's pass, lending, nic.Completion)"
