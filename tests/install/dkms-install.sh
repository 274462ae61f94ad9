#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
#
# upcie's DKMS packages installed the way users install them, end to end: a Debian 12 system
# with dkms and the image and headers of the guest test bed's 6.1 kernel, built once from
# Debian's archive (mmdebstrap) and cached, is booted in QEMU on that kernel; inside it,
# tests/install/guest.sh runs apt-get and dpkg on the .debs, loads the modules and checks the
# device nodes, the identity, the conflict with the other project's package of the same
# modules (a stand-in: tests/install/other), kernels the module is excluded from or fails to
# build for, removal, and a control with dh_dkms's own postinst. TAP out, and a last line
# "N passed, N failed, N skipped".
#
#   tests/install/dkms-install.sh [--keep]     (root; --keep: keep the run directory)
#
# Needs: mmdebstrap, qemu-system-x86, e2fsprogs, debhelper, dh-dkms, gcc (scripts/deps.sh), a
# Debian mirror (as the guest test bed: UPCIE_TESTBED_MIRROR or the system's), the test bed's
# 6.1 kernel (fetched if missing). Cache: $UPCIE_TESTBED_CACHE/install/ (the root file system
# image, ~1.3 GB; rebuilt when the kernel version or the recipe changes). Work:
# $UPCIE_TESTBED_WORK/install/.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$HERE/../.." && pwd)
# the guest test bed's helpers and settings (cache, work dir, mirror, kernel state, locks)
# shellcheck source=../guest/testbed.sh
. "$REPO_ROOT/tests/guest/testbed.sh"
readonly ITIMEOUT=${UPCIE_INSTALL_TIMEOUT:-3600}
KEEPRUN=0
[ "${1:-}" = --keep ] && KEEPRUN=1

# The root file system: what a user's machine has before installing upcie's packages. The init
# below is its PID 1 in the test (no systemd: the test needs a shell and the kernel, and the
# guest's time is precious under TCG).
readonly ROOTFS_PKGS="dkms kmod mount e2fsprogs initramfs-tools"
bootstrap_init() {
	cat <<'INIT'
#!/bin/sh
# PID 1 of upcie's install test guest (tests/install/dkms-install.sh): mount what a booted
# system has, run the test from the payload disk, power off.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
mountpoint -q /proc || mount -t proc proc /proc
mountpoint -q /sys || mount -t sysfs sysfs /sys
mountpoint -q /dev || mount -t devtmpfs devtmpfs /dev
mountpoint -q /run || mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
mount -o remount,rw /
echo 1 >/proc/sys/kernel/printk
mkdir -p /mnt/tb
echo
echo "==TB== START kernel=$(uname -r)"
if mount -o ro /dev/vdb /mnt/tb; then
	sh /mnt/tb/guest.sh
	echo "==TB== RESULT rc=$?"
else
	echo "==TB== RESULT rc=99 (no payload disk)"
fi
sync
echo o >/proc/sysrq-trigger
sleep 10
INIT
}

build_rootfs() { # -> $ROOTFS_DIR/{rootfs.img,initrd.img}
	local key tmp dir size
	key=$(printf '%s\n' "$KV" "$PKGVER" "$ROOTFS_PKGS" "$(bootstrap_init)" | sha256sum | cut -c1-12)
	ROOTFS_DIR=$CACHE/install/${KV}_${PKGVER//:/%}_$key
	[ -f "$ROOTFS_DIR/.ready" ] && { log "root file system cached: $ROOTFS_DIR"; return 0; }
	need_tools mmdebstrap mkfs.ext4
	MIRROR=$(mirror_uri)
	tmp=$CACHE/install/tmp-$key
	rm -rf "$tmp"
	mkdir -p "$tmp"
	dir=$tmp/root
	bootstrap_init >"$tmp/init"
	log "building the root file system (Debian bookworm, Linux $KV $PKGVER) from $MIRROR"
	# the downloaded packages are kept in $CACHE/install/debs for the next build (mmdebstrap's
	# sync-in/sync-out hooks; apt-get autoclean drops the ones the archive no longer has)
	mkdir -p "$CACHE/install/debs"
	# shellcheck disable=SC2086
	retry logged "$CACHE/logs/install-rootfs.log" mmdebstrap --variant=apt --mode=root \
		--skip=essential/unlink \
		--include="$(echo $ROOTFS_PKGS | tr ' ' ,),linux-image-$KV=$PKGVER,linux-headers-$KV=$PKGVER" \
		--dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
		--dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
		--setup-hook='mkdir -p "$1/var/cache/apt/archives"' \
		--setup-hook="sync-in $CACHE/install/debs /var/cache/apt/archives/" \
		--customize-hook="install -m 0755 '$tmp/init' \"\$1/usr/local/sbin/upcie-tb-init\"" \
		--customize-hook='echo upcie-install-test >"$1/etc/hostname"' \
		--customize-hook='chroot "$1" apt-get autoclean -q' \
		--customize-hook="sync-out /var/cache/apt/archives $CACHE/install/debs" \
		bookworm "$dir" "deb $MIRROR bookworm main" || die "mmdebstrap failed (log: $CACHE/logs/install-rootfs.log)"
	[ -f "$dir/boot/initrd.img-$KV" ] || die "no /boot/initrd.img-$KV in the root file system"
	cp "$dir/boot/initrd.img-$KV" "$tmp/initrd.img"
	# room for the module builds: the tree plus 1 GiB
	size=$(($(du -sm "$dir" | cut -f1) + 1024))
	logged "$CACHE/logs/install-rootfs.log" mkfs.ext4 -q -F -L upcie-root -d "$dir" "$tmp/rootfs.img" "${size}M" ||
		die "mkfs.ext4 failed"
	rm -rf "$dir"
	touch "$tmp/.ready"
	rm -rf "$ROOTFS_DIR"
	mv "$tmp" "$ROOTFS_DIR"
	# older images of this cache go
	for dir in "$CACHE"/install/*/; do
		[ "${dir%/}" = "$ROOTFS_DIR" ] || [ "${dir%/}" = "$CACHE/install/debs" ] || rm -rf "$dir"
	done
	log "root file system: $ROOTFS_DIR ($(du -sh "$ROOTFS_DIR/rootfs.img" | cut -f1))"
}

build_payload() { # -> $RUN/payload.img: the .debs, the stand-in, the control, t_kmod_ident
	local pl=$RUN/payload st=$RUN/stage m pkg ver
	rm -rf "$pl" "$st"
	mkdir -p "$pl/control" "$st"
	# each package has its own version (debian/changelog); "version" is dmabuf_import's, which
	# the control below is built from
	ver=$(cd "$REPO_ROOT/dkms/dmabuf_import" && dpkg-parsechangelog -SVersion)
	echo "$ver" >"$pl/version"
	for m in dmabuf_import iommu_map_pa; do
		pkg=upcie-$(echo "$m" | tr _ -)
		ver=$(cd "$REPO_ROOT/dkms/$m" && dpkg-parsechangelog -SVersion)
		echo "$ver" >"$pl/version-$pkg"
		cp -rL "$REPO_ROOT/dkms/$m" "$st/$pkg-$ver"
		(cd "$st/$pkg-$ver" && logged "$RUN/debs.log" dpkg-buildpackage -us -uc -b) ||
			die "building $pkg-dkms failed (log: $RUN/debs.log)"
		cp "$st/${pkg}-dkms_${ver}_all.deb" "$pl/"
	done
	# the other project's package (stand-in)
	mkdir -p "$st/other"
	cp -r "$HERE/other/debian" "$st/other/"
	cp "$REPO_ROOT"/tests/guest/kmod-other/{Kbuild,other.h,dmabuf_import.c,iommu_map_pa.c} "$st/other/"
	(cd "$st/other" && logged "$RUN/debs.log" dpkg-buildpackage -us -uc -b) ||
		die "building the stand-in package failed (log: $RUN/debs.log)"
	cp "$st"/upcie-experimental-dkms_*_all.deb "$pl/"
	# control: upcie-dmabuf-import-dkms with dh_dkms's maintainer scripts instead of upcie's
	m=dmabuf_import pkg=upcie-dmabuf-import
	cp -rL "$REPO_ROOT/dkms/$m" "$st/control"
	rm -f "$st/control/debian/postinst" "$st/control/debian/prerm"
	sed -i '1s/(\([^)]*\))/(\1+dhdkms1)/' "$st/control/debian/changelog"
	sed -i 's/^Build-Depends: .*/Build-Depends: debhelper-compat (= 13), dh-dkms/' "$st/control/debian/control"
	sed -i -e 's/^\tdh $@$/\tdh $@ --with dkms/' -e '/^override_dh_installdeb:/,$d' \
		-e '/dkms.conf >/d' -e '/chmod 0644 $(SRC)\/dkms.conf/d' "$st/control/debian/rules"
	printf 'override_dh_dkms:\n\tdh_dkms -V $(VERSION) -- dkms.conf\n' >>"$st/control/debian/rules"
	(cd "$st/control" && logged "$RUN/debs.log" dpkg-buildpackage -us -uc -b) ||
		die "building the control package failed (log: $RUN/debs.log)"
	cp "$st"/${pkg}-dkms_*+dhdkms1_all.deb "$pl/control/"
	gcc -static -O2 -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE -I"$REPO_ROOT/include" \
		-o "$pl/t_kmod_ident" "$REPO_ROOT/tests/guest/progs/t_kmod_ident.c" || die "cannot build t_kmod_ident"
	cp "$HERE/guest.sh" "$pl/guest.sh"
	rm -f "$RUN/payload.img"
	mkfs.ext4 -q -F -L upcie-tb -d "$pl" "$RUN/payload.img" 64M || die "mkfs.ext4 of the payload failed"
	log "payload: $(cd "$pl" && find . -name '*.deb' | sort | tr '\n' ' ')"
}

main_install() {
	local t0 rc=0 np nf ns
	need_tools gcc dpkg-buildpackage mkfs.ext4 "$QEMU" timeout
	[ "$(id -u)" = 0 ] || die "run as root (mmdebstrap, the cache)"
	if ! (load_state k61) 2>/dev/null; then
		"$TB_DIR/testbed.sh" fetch >&2
	fi
	load_state k61
	[ -n "$VMLINUX" ] || die "no PVH vmlinux for $KV in the test bed cache"
	lock "$CACHE/install"
	phase rootfs build_rootfs
	RUN=$WORK/install
	lock "$RUN"
	rm -rf "$RUN"
	mkdir -p "$RUN"
	phase payload build_payload
	lock_guests
	log "booting Debian on $KV (TCG; the module builds take minutes)"
	t0=$(now)
	timeout -k 10 "$ITIMEOUT" "$QEMU" -machine q35 -accel tcg -m 2G -smp 2 -nographic -nic none \
		-vga none -no-reboot -snapshot -kernel "$VMLINUX" -initrd "$ROOTFS_DIR/initrd.img" \
		-drive "file=$ROOTFS_DIR/rootfs.img,if=virtio,format=raw" \
		-drive "file=$RUN/payload.img,if=virtio,format=raw,readonly=on" \
		-append "root=/dev/vda ro console=ttyS0 panic=-1 quiet init=/usr/local/sbin/upcie-tb-init" \
		</dev/null >"$RUN/console.log" 2>&1 || rc=$?
	PHASES+=("guest $(secs "$t0" "$(now)")")
	tr -d '\r' <"$RUN/console.log" | sed -n '/^==TB== START/,/^==TB== RESULT/p' |
		grep -v '^==TB==' >"$RUN/tap.txt" || true
	cat "$RUN/tap.txt"
	np=$(grep -Ec '^ok [0-9]+' "$RUN/tap.txt" || true)
	ns=$(grep -Ec '^ok [0-9]+.*# SKIP' "$RUN/tap.txt" || true)
	nf=$(grep -Ec '^not ok [0-9]+' "$RUN/tap.txt" || true)
	np=$((np - ns))
	if ! grep -q '^==TB== RESULT' <(tr -d '\r' <"$RUN/console.log"); then
		echo "not ok - the guest did not finish (qemu status $rc; console: $RUN/console.log)"
		tr -d '\r' <"$RUN/console.log" | tail -n 30 | sed 's/^/# /'
		nf=$((nf + 1))
	elif ! grep -qE '^1\.\.[0-9]+$' "$RUN/tap.txt"; then
		echo "not ok - the guest printed no plan"
		nf=$((nf + 1))
	fi
	[ "$KEEPRUN" = 1 ] || rm -f "$RUN/payload.img"
	log "console: $RUN/console.log"
	print_phases >&2
	echo "$np passed, $nf failed, $ns skipped"
	[ "$nf" = 0 ]
}

main_install
