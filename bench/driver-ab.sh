#!/usr/bin/env bash
# driver-ab.sh: the drivers' Poll (BenchmarkDriverRead in nic/virtio and
# nic/igb) of a base build and of this tree in one run, alternating base
# and new for each cell (A B A B), so that a change to the read path is
# timed against its base on the same machine in the same minutes.
#
#   BASE=/tmp/base bench/driver-ab.sh     # BASE: git worktree add /tmp/base COMMIT
#
# Settings (environment): BASE (required), REPEAT (rounds, 5), ENTRIES
# (ring size, 1024), COUNT (completions per run, 2000000), OUT (build
# folder, bench/out/driver-ab). Prints one line per run ("layout mode side
# ns/completion"), then the medians and the change.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
[ -n "${BASE:-}" ] && [ -d "$BASE" ] || { echo "driver-ab.sh: BASE must name a checkout of the base (git worktree add DIR COMMIT)" >&2; exit 1; }
REPEAT=${REPEAT:-5} ENTRIES=${ENTRIES:-1024} COUNT=${COUNT:-2000000}
OUT=${OUT:-$here/out/driver-ab}
GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
mkdir -p "$OUT"
for side in base new; do
	dir=$root
	[ $side = base ] && dir=$BASE
	(cd "$dir" && CGO_ENABLED=0 "$GO" test -c -o "$OUT/virtio.$side" ./nic/virtio &&
		CGO_ENABLED=0 "$GO" test -c -o "$OUT/igb.$side" ./nic/igb)
done
log=$OUT/runs.txt
: >"$log"
for ((r = 0; r < REPEAT; r++)); do
	for layout in packed split igb; do
		bin=virtio
		[ $layout = igb ] && bin=igb
		for mode in local filled; do
			for side in base new; do
				ns=$(VFNIC_BENCH_ENTRIES=$ENTRIES VFNIC_BENCH_BATCH=32 "$OUT/$bin.$side" -test.run '^$' \
					-test.bench "^BenchmarkDriverRead\$/^layout=$layout\$/^mode=$mode\$" -test.benchtime "${COUNT}x" 2>&1 |
					awk '/^BenchmarkDriverRead/ {for (i = 1; i < NF; i++) if ($(i+1) == "ns/completion") print $i}')
				[ -n "$ns" ] || { echo "driver-ab.sh: $bin.$side gave no ns/completion ($layout $mode)" >&2; exit 1; }
				echo "$layout $mode $side $ns" | tee -a "$log"
			done
		done
	done
done
echo
printf '%-7s %-7s %10s %10s %8s\n' layout mode base new change
for layout in packed split igb; do
	for mode in local filled; do
		b=$(awk -v l=$layout -v m=$mode '$1==l && $2==m && $3=="base" {print $4}' "$log" | sort -g | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}')
		n=$(awk -v l=$layout -v m=$mode '$1==l && $2==m && $3=="new" {print $4}' "$log" | sort -g | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}')
		awk -v l=$layout -v m=$mode -v b="$b" -v n="$n" 'BEGIN {printf "%-7s %-7s %10.2f %10.2f %+7.0f%%\n", l, m, b, n, (n/b-1)*100}'
	done
done
echo "(ns per completion, medians of $REPEAT runs; batch 32, ring of $ENTRIES)"
