#!/usr/bin/env bash
# Installs what vfnic's demo and tests need on a Debian 12 host, idempotently:
# QEMU (10.0 from bookworm-backports when reachable, else bookworm's 7.2),
# busybox-static, cpio, gcc, and the Debian guest kernels unpacked into a cache
# folder (never installed into /boot). Quick when everything is present.
set -euo pipefail

CACHE="${VFNIC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vfnic}"
KDIR="$CACHE/kernel"
# The second guest kernel, for tests that need a newer one than bookworm's
# (tests/afxdpvm: AF_XDP zero-copy on virtio_net, Linux 6.13 and later).
KBPO="$CACHE/kernel-bpo"
need_apt=()

command -v qemu-system-x86_64 >/dev/null || need_apt+=(qemu-system-x86)
[ -x /bin/busybox ] && /bin/busybox --list 2>/dev/null | grep -qx ping || need_apt+=(busybox-static)
command -v cpio >/dev/null || need_apt+=(cpio)
# tcpdump (libpcap) is the reference the capture filter compiler is checked against.
[ -x /usr/bin/tcpdump ] || [ -x /usr/sbin/tcpdump ] || need_apt+=(tcpdump)
command -v gcc >/dev/null || need_apt+=(gcc)
command -v make >/dev/null || need_apt+=(make)
# xz unpacks vmlinux for the fast PVH boot (the qemu package falls back without it).
command -v xz >/dev/null || need_apt+=(xz-utils)
command -v depmod >/dev/null || [ -x /sbin/depmod ] || need_apt+=(kmod)

apt_updated=0
apt_update() {
	if [ "$apt_updated" = 0 ]; then
		apt-get update -qq
		apt_updated=1
	fi
}

if [ "${#need_apt[@]}" -gt 0 ]; then
	export DEBIAN_FRONTEND=noninteractive
	if [[ " ${need_apt[*]} " == *" qemu-system-x86 "* ]]; then
		# Prefer QEMU 10.0 (adds igb); fall back to bookworm's 7.2.
		bp=/etc/apt/sources.list.d/vfnic-backports.list
		if ! grep -rqs bookworm-backports /etc/apt/sources.list /etc/apt/sources.list.d/; then
			echo "deb http://deb.debian.org/debian bookworm-backports main" >"$bp"
		fi
		apt_update
		if ! apt-get install -y -qq -t bookworm-backports --no-install-recommends qemu-system-x86 >/dev/null; then
			echo "setup: bookworm-backports QEMU unavailable, using bookworm's" >&2
			apt-get install -y -qq --no-install-recommends qemu-system-x86 >/dev/null
		fi
		rest=()
		for p in "${need_apt[@]}"; do [ "$p" = qemu-system-x86 ] || rest+=("$p"); done
		need_apt=("${rest[@]}")
	fi
	if [ "${#need_apt[@]}" -gt 0 ]; then
		apt_update
		apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
	fi
fi

# Guest kernel: the package linux-image-amd64 depends on, unpacked into the cache.
if ! ls "$KDIR"/boot/vmlinuz-* >/dev/null 2>&1; then
	apt_update
	pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
	if [ -z "$pkg" ]; then
		echo "setup: cannot resolve the kernel package behind linux-image-amd64" >&2
		exit 1
	fi
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	(cd "$tmp" && apt-get download -qq "$pkg")
	rm -rf "$KDIR.new"
	mkdir -p "$KDIR.new"
	dpkg -x "$tmp"/*.deb "$KDIR.new"
	rm -rf "$KDIR"
	mv "$KDIR.new" "$KDIR"
fi

# The second guest kernel: trixie-backports' linux-image-amd64. Bookworm's
# newest (6.12, bookworm-backports) will not do: its virtio_net has AF_XDP
# zero-copy receive code but no zero-copy transmit and does not advertise
# NETDEV_XDP_ACT_XSK_ZEROCOPY, so the kernel refuses XDP_ZEROCOPY binds
# (EOPNOTSUPP); Linux 6.13 completed it. apt reads trixie-backports through
# a configuration of its own in the cache: the machine's sources never name
# trixie, so nothing of this system is upgraded from it. Newer kernels come
# as linux-image-V (a meta package) over linux-binary-V (the image, in
# lib/modules/V/vmlinuz), linux-modules-V and linux-base-V (modules.builtin
# and modules.order), all under usr/; older ones as one linux-image-V with
# boot/vmlinuz-V. Either is laid out as boot/vmlinuz-V and lib/modules/V/.
fetch_bpo_kernel() {
	local apt="$CACHE/apt-trixie-backports"
	mkdir -p "$apt/lists/partial" "$apt/archives/partial"
	echo "deb http://deb.debian.org/debian trixie-backports main" >"$apt/sources.list"
	local o=(-o Dir::Etc::SourceList="$apt/sources.list" -o Dir::Etc::SourceParts=/nonexistent
		-o Dir::State::Lists="$apt/lists" -o Dir::Cache="$apt" -o Dir::Cache::Archives="$apt/archives"
		-o APT::Sandbox::User=root)
	apt-get -qq "${o[@]}" update || return 1
	local pkg abi
	pkg=$(apt-cache "${o[@]}" depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
	[ -n "$pkg" ] || return 1
	abi=${pkg#linux-image-}
	local pkgs=("$pkg")
	pkgs+=($(apt-cache "${o[@]}" depends "$pkg" 2>/dev/null | awk -v abi="$abi" '$1 ~ /Depends:/ && $2 ~ "^linux-(binary|modules|base)-" && substr($2, length($2)-length(abi)+1) == abi {print $2}' | sort -u))
	local tmp
	tmp=$(mktemp -d)
	(cd "$tmp" && apt-get -qq "${o[@]}" download "${pkgs[@]}") || { rm -rf "$tmp"; return 1; }
	rm -rf "$KBPO.new"
	mkdir -p "$KBPO.new"
	for d in "$tmp"/*.deb; do dpkg -x "$d" "$KBPO.new"; done
	rm -rf "$tmp"
	if [ -d "$KBPO.new/usr/lib/modules" ] && [ ! -d "$KBPO.new/lib/modules" ]; then
		mkdir -p "$KBPO.new/lib"
		mv "$KBPO.new/usr/lib/modules" "$KBPO.new/lib/modules"
	fi
	local v
	v=$(basename "$(ls -d "$KBPO.new"/lib/modules/*/ | head -1)")
	if [ -f "$KBPO.new/lib/modules/$v/vmlinuz" ]; then
		mkdir -p "$KBPO.new/boot"
		mv "$KBPO.new/lib/modules/$v/vmlinuz" "$KBPO.new/boot/vmlinuz-$v"
	fi
	ls "$KBPO.new"/boot/vmlinuz-* >/dev/null 2>&1 || return 1
	rm -rf "$KBPO"
	mv "$KBPO.new" "$KBPO"
}
if ! ls "$KBPO"/boot/vmlinuz-* >/dev/null 2>&1; then
	if ! fetch_bpo_kernel; then
		rm -rf "$KBPO.new"
		echo "setup: could not fetch trixie-backports' kernel into $KBPO: tests/afxdpvm cannot run" >&2
	fi
fi

# The .deb ships no modules.dep (depmod writes it at install): make it here.
for kd in "$KDIR" "$KBPO"; do
	[ -d "$kd/lib/modules" ] || continue
	kver=$(basename "$(ls -d "$kd"/lib/modules/*/ | head -1)")
	if [ ! -s "$kd/lib/modules/$kver/modules.dep" ]; then
		PATH="$PATH:/sbin:/usr/sbin" depmod -b "$kd" "$kver"
	fi
done

bpo=$(basename "$(ls "$KBPO"/boot/vmlinuz-* 2>/dev/null | head -1)" 2>/dev/null | sed 's/vmlinuz-//')
echo "setup: qemu $(qemu-system-x86_64 --version | head -1 | awk '{print $4}'), kernel $(basename "$(ls "$KDIR"/boot/vmlinuz-* | head -1)" | sed 's/vmlinuz-//') and ${bpo:-none} (kernel-bpo), cache $CACHE"
