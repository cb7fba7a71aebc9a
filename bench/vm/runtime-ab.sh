#!/usr/bin/env bash
# runtime-ab.sh: how much of busy mode's cost is the Go runtime's. Runs
# bench/vm PAIRS times with the guest's programs built by this machine's Go
# and by a copy of it whose sysmon never forces a preemption (the
# forcePreemptNS constant, 10 ms, raised to 10 s), alternating, and prints
# each run's table. Arguments go to bench/vm (default: virtio, both
# directions, dpdk against busy, -v). The copy is made once, in
# $CACHE (default ~/.cache/vfnic/go-nopreempt); nothing else changes.
#
# A polling core's goroutine is locked to its thread, so when sysmon
# preempts it the runtime hands its P to another thread and back (three
# futex wake-ups, two of them on the other CPU; golang/go#21827). This
# is an experiment, not a fix: a runtime without forced preemption cannot
# stop the world while a goroutine spins without calling a function.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
PAIRS=${PAIRS:-2}
CACHE=${CACHE:-$HOME/.cache/vfnic/go-nopreempt}
GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
[ $# -gt 0 ] || set -- -nics packed,split -dirs tx,rx -tools dpdk,busy -reps 2 -v

goroot=$("$GO" env GOROOT)
want="const forcePreemptNS = 10 * 1000 * 1000 * 1000 // runtime-ab.sh: 10s"
if ! grep -qF "$want" "$CACHE/src/runtime/proc.go" 2>/dev/null; then
	rm -rf "$CACHE.tmp"
	mkdir -p "$(dirname "$CACHE")"
	cp -a "$goroot" "$CACHE.tmp"
	sed -i "s|^const forcePreemptNS = 10 \* 1000 \* 1000 // 10ms\$|$want|" "$CACHE.tmp/src/runtime/proc.go"
	grep -qF "$want" "$CACHE.tmp/src/runtime/proc.go" ||
		{ echo "runtime-ab.sh: forcePreemptNS not found in $goroot/src/runtime/proc.go" >&2; exit 1; }
	rm -rf "$CACHE"
	mv "$CACHE.tmp" "$CACHE"
fi

# The host side is built once with the stock toolchain; bench/vm builds
# the guest's programs with the go first in PATH.
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
(cd "$root" && "$GO" build -o "$out/benchvm" ./bench/vm)
stock=$(dirname "$GO")
for ((i = 1; i <= PAIRS; i++)); do
	for v in stock no-preempt; do
		bin=$stock
		[ "$v" = stock ] || bin=$CACHE/bin
		echo "== pair $i: $v ($("$bin/go" version))"
		(cd "$root" && PATH=$bin:$PATH "$out/benchvm" "$@" 2>&1) | sed -n '/median of the runs/,$p;/busy run [0-9]*: interrupts/p'
	done
done
