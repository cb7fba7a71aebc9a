#!/usr/bin/env bash
# run.sh: vfnic's host devices against DPDK's, side by side on one veth pair
# (see README.md). vfnic afxdp: and afpacket: (pktgen / sink, busy and
# adaptive polling cores), DPDK 22.11 testpmd with --vdev net_af_xdp and
# --vdev net_af_packet (txonly / rxonly), and this folder's Go program on a
# plain AF_PACKET socket (sendmmsg / recvmmsg); TX and RX, SIZES bytes
# (without FCS). Every tool runs on vfx0 in namespace A; vfx1 in namespace
# B is the peer. REPEAT rounds, each running every cell once in the same
# order (A B C ... A B C ...), so each tool's runs spread over the whole run.
#
#   TX: frames/s arriving at the peer, from the kernel's veth counter
#       /sys/class/net/vfx1/statistics/rx_packets (the same counter for every
#       tool), over DUR seconds that start WARM seconds after the counter
#       first moves. Every tool sends to 02:00:00:00:00:00 (testpmd's default
#       peer address), which vfx1's stack drops as not its own at once.
#   RX: frames/s the tool under test reports receiving (vfnic's and the Go
#       program's per-second lines, testpmd's Rx-pps over the window between
#       two "show port stats all"), over DUR seconds after WARM, while the
#       Go program sends SIZE-byte frames as fast as it can from vfx1 (the
#       same generator for every tool).
#
# CPUs: the tool under test runs wholly on TOOL_CPU (taskset; vfnic's polling
# core pinned there with -cpu, testpmd's main and forwarding lcores both
# mapped there with --lcores), the RX generator on GEN_CPU. A veth transmit
# does the receiving side's kernel work in the sender's context (softirq on
# the sender's CPU), so in TX the tool's CPU carries vfx1's receive path and
# in RX the generator's CPU carries vfx0's (the XDP program and the copy into
# the AF_XDP UMEM, or into the TPACKET ring).
#
# testpmd runs with --no-huge (no hugepages; vfnic's host devices do not use
# them either), 16384 mbufs, its default burst of 32 and its drivers'
# default ring sizes; it is installed with apt when missing (dpdk-dev holds
# dpdk-testpmd in Debian 12).
#
# Ring sizes: QSIZE=dpdk (the default) gives vfnic the ring sizes testpmd's
# drivers use by default: 2048 descriptors per AF_XDP ring for afxdp: (net_af_xdp's
# ETH_AF_XDP_DFLT_NUM_DESCS; vfnic's own default is 256) and 512 receive
# slots for afpacket: (net_af_packet's framecnt; vfnic's default 256).
# QSIZE=default runs vfnic with its own defaults, QSIZE=N with -queue-size N.
#
# Settings (environment): DUR (15), WARM (2), REPEAT (3), SIZES ("64 1514"),
# DIRS ("tx rx"), TOOLS (all, in this order: vfnic-afxdp-busy
# vfnic-afxdp-adaptive dpdk-afxdp vfnic-afpacket-busy
# vfnic-afpacket-adaptive dpdk-afpacket go-mmsg; also, receive only and not
# in the default list, go-tpacket-v2 and go-tpacket-v3: this folder's Go
# program on a PACKET_RX_RING of either version), TOOL_CPU (1), GEN_CPU (0),
# QSIZE (dpdk), OUT (build and log folder, default bench/out), GO (go command),
# BASE (a checkout of a base build, as from "git worktree add DIR main": tools
# named with @base, as vfnic-afxdp-busy@base, run its vfnic, so that a change
# and its base alternate in one run; they go together).
# Needs root (namespaces, AF_XDP). Prints each run as it ends, then the table;
# README.md has the measured tables and where the time goes.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
OUT=${OUT:-$root/bench/out}
DUR=${DUR:-15}
WARM=${WARM:-2}
REPEAT=${REPEAT:-3}
SIZES=${SIZES:-"64 1514"}
DIRS=${DIRS:-"tx rx"}
TOOLS=${TOOLS:-"vfnic-afxdp-busy vfnic-afxdp-adaptive dpdk-afxdp vfnic-afpacket-busy vfnic-afpacket-adaptive dpdk-afpacket go-mmsg"}
TOOL_CPU=${TOOL_CPU:-1}
GEN_CPU=${GEN_CPU:-0}
QSIZE=${QSIZE:-dpdk}
GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
BASE=${BASE:-}
DST=02:00:00:00:00:00

die() { echo "run.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (network namespaces, AF_XDP, AF_PACKET)"
command -v ip >/dev/null || die "needs the ip command (iproute2)"
command -v taskset >/dev/null || die "needs taskset (util-linux)"
[ "$(nproc)" -ge 2 ] || die "needs 2 CPUs (the tool and the generator on different ones)"
case " $TOOLS" in
*@base*) [ -n "$BASE" ] || die "tools named @base need BASE, a checkout of the base build" ;;
*) [ -z "$BASE" ] || die "BASE=$BASE: no tool named @base runs it" ;;
esac
case $QSIZE in
dpdk | default) ;;
*) [[ $QSIZE =~ ^[1-9][0-9]*$ ]] || die "QSIZE=$QSIZE: want dpdk, default or a ring size" ;;
esac

# DPDK 22.11 from Debian 12's archive when missing.
pmds=/usr/lib/x86_64-linux-gnu/dpdk/pmds-23.0
if ! command -v dpdk-testpmd >/dev/null || [ ! -e "$pmds/librte_net_af_xdp.so" ] || [ ! -e "$pmds/librte_net_af_packet.so" ] || [ ! -e "$pmds/librte_mempool_ring.so" ]; then
	echo "run.sh: installing DPDK's testpmd and its af_xdp and af_packet drivers (apt)" >&2
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
		dpdk-dev librte-net-af-xdp23 librte-net-af-packet23 librte-mempool-ring23 >/dev/null
fi

mkdir -p "$OUT"
(cd "$root" && CGO_ENABLED=0 "$GO" build -o "$OUT/vfnic" ./cmd/vfnic && CGO_ENABLED=0 "$GO" build -o "$OUT/hostdev" ./bench/hostdev)
VFNIC=$OUT/vfnic
MMSG=$OUT/hostdev
VFNIC_BASE=$OUT/vfnic-base
if [ -n "$BASE" ]; then
	(cd "$BASE" && CGO_ENABLED=0 "$GO" build -o "$VFNIC_BASE" ./cmd/vfnic) || die "build the base vfnic in $BASE"
fi

tmp=$(mktemp -d)
A=vfnic-hostdev-$$-a
B=vfnic-hostdev-$$-b
# The tools' pids, in a file: each cell runs in a subshell ($(one ...)).
# One is killed only while it is still one of this script's tools (a pid
# may have been reused since it ended).
cleanup() {
	local p
	for p in $(cat "$tmp/pids" 2>/dev/null); do
		case $(tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline") in
		*"$VFNIC "* | *"$VFNIC_BASE "* | *"$MMSG "* | *dpdk-testpmd*"hostdev$$"*) kill -KILL "$p" 2>/dev/null || true ;;
		esac
	done
	ip netns del "$A" 2>/dev/null || true
	ip netns del "$B" 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ip netns add "$A"
ip netns add "$B"
ip -n "$A" link add vfx0 type veth peer name vfx1 netns "$B"
for ns in "$A:vfx0" "$B:vfx1"; do
	for k in all default "${ns#*:}"; do ip netns exec "${ns%%:*}" sysctl -qw "net.ipv6.conf.$k.disable_ipv6=1"; done
	ip -n "${ns%%:*}" link set "${ns#*:}" up
done

# The tool under test's command prefix (an array, not a function, so that
# $! of a command run in the background is the tool's own pid).
inA=(ip netns exec "$A" taskset -c "$TOOL_CPU")
peer() { ip netns exec "$B" cat "/sys/class/net/vfx1/statistics/rx_packets"; }
# peer2: vfx1's rx_packets and rx_bytes, read together and the time.
peer2() { ip netns exec "$B" cat /sys/class/net/vfx1/statistics/rx_packets /sys/class/net/vfx1/statistics/rx_bytes | tr '\n' ' '; date +%s.%N; }
load() { cut -d' ' -f1-3 /proc/loadavg; }
median() { sort -g | awk '{v[NR]=$1} END {if (NR%2) print v[(NR+1)/2]; else print (v[NR/2]+v[NR/2+1])/2}'; }

# wait_moving: until vfx1's counter moves (the tool sends), at most 30 s.
wait_moving() {
	local base i
	base=$(peer)
	for ((i = 0; i < 600; i++)); do
		[ "$(peer)" != "$base" ] && return 0
		sleep 0.05
	done
	return 1
}

# tx_window: the peer's frames/s over DUR s from WARM s after it moves;
# prints "rate avg-frame-bytes".
tx_window() {
	local s0 s1
	wait_moving || { echo "no frames arrived at vfx1 within 30 s" >&2; return 1; }
	sleep "$WARM"
	s0=$(peer2)
	sleep "$DUR"
	s1=$(peer2)
	# Each sample: packets bytes time.
	awk -v a="$s0" -v b="$s1" 'BEGIN {split(a, x, " "); split(b, y, " "); p = y[1] - x[1]
		printf "%.0f %.1f\n", p/(y[3]-x[3]), (p ? (y[2]-x[2])/p : 0)}'
}

# lines_rate FILE: the mean of the per-second rx rates of vfnic's (and the
# Go program's) progress lines "T.Ts  rx N pps ..." with WARM < T <= WARM+DUR+0.5.
lines_rate() {
	awk -v lo="$WARM" -v hi="$((WARM + DUR))" '
		$1 ~ /^[0-9.]+s$/ && $2 == "rx" { t = $1 + 0; if (t > lo && t <= hi + 0.5) { s += $3; n++ } }
		END { if (n < 1 || n < (hi - lo) / 2) exit 1; printf "%.0f\n", s/n }' "$1"
}

# testpmd: start it on vfx0 in interactive mode, commands through a fifo.
tp_start() { # VDEV FWDMODE SIZE LOG
	rm -f "$tmp/tpin"
	mkfifo "$tmp/tpin"
	"${inA[@]}" dpdk-testpmd --lcores "0@$TOOL_CPU,1@$TOOL_CPU" --no-huge -m 512 --no-pci --no-shconf --file-prefix "hostdev$$" \
		--log-level=pmd.net.af_xdp:notice --vdev "$1" -- -i --forward-mode="$2" --txpkts="$3" --total-num-mbufs=16384 \
		<"$tmp/tpin" >"$4" 2>&1 &
	tp_pid=$!
	echo "$tp_pid" >>"$tmp/pids"
	exec 3>"$tmp/tpin"
	local i
	for ((i = 0; i < 300; i++)); do
		grep -q 'testpmd> ' "$4" && return 0
		kill -0 "$tp_pid" 2>/dev/null || break
		sleep 0.1
	done
	echo "testpmd did not come up: $(tail -3 "$4" | tr '\n' ' ')" >&2
	return 1
}
tp_stop() {
	echo stop >&3 || true
	echo quit >&3 || true
	exec 3>&-
	timeout 30 tail --pid="$tp_pid" -f /dev/null || kill -KILL "$tp_pid" 2>/dev/null || true
	wait "$tp_pid" 2>/dev/null || true
}

# vfnic_cmd DIR TOOL SIZE SECONDS: the vfnic command line of a cell.
vfnic_cmd() {
	local kind mode bin=$VFNIC
	kind=${2#vfnic-}
	if [[ $kind == *@base ]]; then
		kind=${kind%@base}
		bin=$VFNIC_BASE
	fi
	mode=${kind#*-}
	kind=${kind%%-*}
	case $QSIZE:$kind in
	default:*) q= ;;
	dpdk:afxdp) q="-queue-size 2048" ;;
	dpdk:afpacket) q="-queue-size 512" ;;
	*) q="-queue-size $QSIZE" ;;
	esac
	if [ "$1" = tx ]; then
		echo "$bin pktgen -mode $mode -cpu $TOOL_CPU $q -size $3 -dst-mac $DST -duration ${4}s $kind:vfx0"
	else
		echo "$bin sink -mode $mode -cpu $TOOL_CPU $q -duration ${4}s $kind:vfx0"
	fi
}

# one DIR SIZE TOOL LOG: runs a cell once and prints its frames/s (and for
# TX the peer's mean frame size).
one() {
	local dir=$1 size=$2 tool=$3 log=$4 vdev r p
	case $tool in
	dpdk-afxdp) vdev=net_af_xdp0,iface=vfx0 ;;
	dpdk-afpacket) vdev=net_af_packet0,iface=vfx0 ;;
	esac
	if [ "$dir" = rx ]; then
		ip netns exec "$B" taskset -c "$GEN_CPU" "$MMSG" tx -i vfx1 -size "$size" -dst-mac "$DST" -progress 0 -duration "$((WARM + DUR + 120))s" >"$log.gen" 2>&1 &
		gen_pid=$!
		echo "$gen_pid" >>"$tmp/pids"
		sleep 0.3
	fi
	case $dir:$tool in
	tx:dpdk-*)
		tp_start "$vdev" txonly "$size" "$log" || return 1
		echo start >&3
		r=$(tx_window) || { tp_stop; return 1; }
		tp_stop
		;;
	rx:dpdk-*)
		tp_start "$vdev" rxonly "$size" "$log" || return 1
		echo start >&3
		sleep "$WARM"
		echo "show port stats all" >&3
		sleep "$DUR"
		echo "show port stats all" >&3
		sleep 0.5
		tp_stop
		r=$(grep -a 'Rx-pps:' "$log" | tail -1 | awk '{print $2}')
		[ "$(grep -ac 'Rx-pps:' "$log")" = 2 ] || { echo "testpmd printed no window's Rx-pps" >&2; r=; }
		;;
	tx:*)
		if [ "$tool" = go-mmsg ]; then
			"${inA[@]}" "$MMSG" tx -i vfx0 -size "$size" -dst-mac "$DST" -progress 0 -duration "$((WARM + DUR + 60))s" >"$log" 2>&1 &
		else
			# shellcheck disable=SC2046
			"${inA[@]}" $(vfnic_cmd tx "$tool" "$size" $((WARM + DUR + 60))) >"$log" 2>&1 &
		fi
		p=$!
		echo "$p" >>"$tmp/pids"
		r=$(tx_window) || true
		kill -INT "$p" 2>/dev/null || true
		wait "$p" || { echo "$tool exited with an error: $(tail -3 "$log" | tr '\n' ' ')" >&2; r=; }
		;;
	rx:*)
		if [ "$tool" = go-mmsg ]; then
			"${inA[@]}" "$MMSG" rx -i vfx0 -duration "$((WARM + DUR + 1))s" >"$log" 2>&1 &
		elif [ "$tool" = go-tpacket-v2 ] || [ "$tool" = go-tpacket-v3 ]; then
			"${inA[@]}" "$MMSG" "rx-${tool#go-tpacket-}" -i vfx0 -duration "$((WARM + DUR + 1))s" >"$log" 2>&1 &
		else
			# shellcheck disable=SC2046
			"${inA[@]}" $(vfnic_cmd rx "$tool" "$size" $((WARM + DUR + 1))) >"$log" 2>&1 &
		fi
		p=$!
		echo "$p" >>"$tmp/pids"
		if wait "$p"; then
			r=$(lines_rate "$log") || { echo "$tool printed too few progress lines" >&2; r=; }
		else
			echo "$tool exited with an error: $(tail -3 "$log" | tr '\n' ' ')" >&2
			r=
		fi
		;;
	esac
	if [ "$dir" = rx ]; then
		kill -INT "$gen_pid" 2>/dev/null || true
		wait "$gen_pid" 2>/dev/null || true
	fi
	[ -n "$r" ] && echo "$r"
}

echo "host devices on a veth pair: vfnic against DPDK testpmd $(dpdk-testpmd -v 2>&1 </dev/null | sed -n 's/.*\(DPDK [0-9.]*\).*/\1/p' | head -1) and plain AF_PACKET sockets"
echo "cpu: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), $(nproc) CPUs; kernel $(uname -r); vfnic $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')${BASE:+, @base $(git -C "$BASE" rev-parse --short HEAD 2>/dev/null || echo '?') ($BASE)}; load at start: $(load)"
echo "$REPEAT rounds, ${DUR} s windows after ${WARM} s; vfnic ring sizes: QSIZE=$QSIZE; tool on CPU $TOOL_CPU, RX generator (hostdev tx, sendmmsg) on CPU $GEN_CPU; logs in $OUT/hostdev-logs"
rm -rf "$OUT/hostdev-logs"
mkdir -p "$OUT/hostdev-logs"
failed=0
for ((i = 1; i <= REPEAT; i++)); do
	for dir in $DIRS; do
		for size in $SIZES; do
			for tool in $TOOLS; do
				case $dir:$tool in tx:go-tpacket-*) continue ;; esac # they receive only
				log=$OUT/hostdev-logs/$i.$dir.$size.$tool
				if out=$(one "$dir" "$size" "$tool" "$log" 2>"$log.err") && [ -n "$out" ]; then
					set -- $out
					echo "$1" >>"$tmp/$dir.$size.$tool"
					printf 'round %d %s %5s %-26s %10s frames/s%s  (load %s)\n' "$i" "$dir" "$size" "$tool" "$1" "${2:+, mean frame $2 bytes at the peer}" "$(load)"
				else
					failed=$((failed + 1))
					printf 'round %d %s %5s %-26s FAILED: %s\n' "$i" "$dir" "$size" "$tool" "$(tr '\n' ' ' <"$log.err")"
				fi
			done
		done
	done
done

ref() { case $1 in *afxdp*) echo dpdk-afxdp ;; *) echo dpdk-afpacket ;; esac; }
echo
printf '%-3s %5s %-26s %10s %23s %9s %s\n' dir bytes tool "median/s" "min-max" "vs DPDK" "runs"
for dir in $DIRS; do
	for size in $SIZES; do
		for tool in $TOOLS; do
			case $dir:$tool in tx:go-tpacket-*) continue ;; esac
			f=$tmp/$dir.$size.$tool
			if [ ! -s "$f" ]; then
				printf '%-3s %5s %-26s %10s\n' "$dir" "$size" "$tool" "no runs"
				continue
			fi
			m=$(median <"$f")
			rf=$tmp/$dir.$size.$(ref "$tool")
			ratio=-
			[ -s "$rf" ] && ratio=$(awk -v a="$m" -v b="$(median <"$rf")" 'BEGIN {printf "%.2fx", a/b}')
			printf '%-3s %5s %-26s %10.0f %11.0f-%-11.0f %9s %s\n' "$dir" "$size" "$tool" "$m" "$(sort -g "$f" | head -1)" "$(sort -g "$f" | tail -1)" "$ratio" "$(wc -l <"$f")"
		done
	done
done
echo "(medians of each cell's runs; vs DPDK: afxdp rows against dpdk-afxdp (net_af_xdp), afpacket and go-mmsg rows against dpdk-afpacket (net_af_packet), same direction and size; load at end: $(load))"
[ "$failed" = 0 ] || { echo "run.sh: $failed runs failed (above)" >&2; exit 1; }
