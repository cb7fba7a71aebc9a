#!/usr/bin/env bash
# Installs what vfnic's demo and tests need on a Debian 12 host, idempotently:
# QEMU (10.0 from bookworm-backports when reachable, else bookworm's 7.2),
# busybox-static, cpio, gcc, and the Debian guest kernel unpacked into a cache
# folder (never installed into /boot). Quick when everything is present.
set -euo pipefail

CACHE="${VFNIC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vfnic}"
KDIR="$CACHE/kernel"
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

# The .deb ships no modules.dep (depmod writes it at install): make it here.
kver=$(basename "$(ls -d "$KDIR"/lib/modules/*/ | head -1)")
if [ ! -s "$KDIR/lib/modules/$kver/modules.dep" ]; then
	PATH="$PATH:/sbin:/usr/sbin" depmod -b "$KDIR" "$kver"
fi

echo "setup: qemu $(qemu-system-x86_64 --version | head -1 | awk '{print $4}'), kernel $(basename "$(ls "$KDIR"/boot/vmlinuz-* | head -1)" | sed 's/vmlinuz-//'), cache $CACHE"
