#!/usr/bin/env bash
# Fetches DPDK's testpmd and the libraries it loads from Debian's archive
# into DIR, unpacked (never installed on this host: nothing runs, no
# service starts), and writes DIR/manifest: one "HOST-PATH GUEST-PATH" line
# per file the guest needs, the dynamic loader included. Quick when DIR is
# complete. Usage: fetch-dpdk.sh DIR
set -euo pipefail
dir=${1:?usage: fetch-dpdk.sh DIR}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
[ -s "$dir/manifest" ] && exit 0

debs="$dir/debs" root="$dir/root"
rm -rf "$debs" "$root"
mkdir -p "$debs" "$root"
# testpmd is in dpdk-dev; the poll-mode drivers (virtio, e1000/igb) and
# the ring mempool are plugins, loaded with -d. Libraries come from the
# archive too (libc included) so that the guest's set is consistent
# whatever this host has installed.
pmds="librte-net-virtio23 librte-net-e1000-23 librte-mempool-ring23"
deps() {
	apt-cache depends dpdk-dev $pmds 2>/dev/null |
		awk '/ Depends: (lib|ibverbs-providers)/ {print $2}' | grep -v -- '-dev$' | sort -u
}
if ! apt-cache show dpdk-dev >/dev/null 2>&1; then
	apt-get update -qq
fi
direct=$(deps)
# The non-DPDK libraries' own dependencies, libraries only.
closure=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
	--no-replaces --no-enhances $(echo "$direct" | grep -v '^librte-') libc6 2>/dev/null |
	grep -E '^(lib|zlib|ibverbs-providers)' | sort -u)
pkgs=$(printf '%s\n' dpdk-dev $pmds $direct $closure | sort -u)
(cd "$debs" && apt-get download $pkgs >/dev/null 2>"$dir/download.log") || {
	echo "fetch-dpdk: apt-get download failed:" >&2
	tail -5 "$dir/download.log" >&2
	exit 1
}
for d in "$debs"/*.deb; do dpkg-deb -x "$d" "$root"; done

libdirs="$root/lib/x86_64-linux-gnu:$root/usr/lib/x86_64-linux-gnu"
pmddir=$(dirname "$(find "$root" -name 'librte_net_virtio.so.*' -path '*pmds*' | head -1)")
testpmd="$root/usr/bin/dpdk-testpmd"
[ -x "$testpmd" ] || { echo "fetch-dpdk: no dpdk-testpmd in dpdk-dev" >&2; exit 1; }
plugins=()
for p in librte_net_virtio librte_net_e1000 librte_mempool_ring; do
	f=$(ls "$pmddir"/$p.so.* | head -1)
	plugins+=("$f")
done
{
	echo "$testpmd /opt/dpdk/bin/dpdk-testpmd"
	for f in "${plugins[@]}"; do echo "$f /opt/dpdk/pmds/$(basename "$f")"; done
	# Every library the binary and the plugins load, resolved in the
	# unpacked tree; a missing one is an error, never a host fallback.
	for f in "$testpmd" "${plugins[@]}"; do
		LD_LIBRARY_PATH=$libdirs ldd "$f"
	done | awk '
		/not found/ {print "MISSING " $1; next}
		$2 == "=>" && $3 ~ /^\// {print $3 " /opt/dpdk/lib/" $1}' | sort -u
	echo "$root/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 /lib64/ld-linux-x86-64.so.2"
} >"$dir/manifest.tmp"
if grep -q '^MISSING' "$dir/manifest.tmp"; then
	echo "fetch-dpdk: libraries not found in the unpacked packages:" >&2
	grep '^MISSING' "$dir/manifest.tmp" >&2
	exit 1
fi
if grep -v "^$root" "$dir/manifest.tmp" | grep -q .; then
	echo "fetch-dpdk: libraries resolved outside the unpacked tree:" >&2
	grep -v "^$root" "$dir/manifest.tmp" >&2
	exit 1
fi
mv "$dir/manifest.tmp" "$dir/manifest"
