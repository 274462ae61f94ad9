#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Install the Debian packages upcie's build, tests and QEMU test bed need (Debian 12). Runs
# apt-get only when something is missing. Root.
set -euo pipefail
pkgs=(gcc g++ clang clang-format make meson ninja-build pkg-config libc6-dev
	libclang-rt-14-dev valgrind
	qemu-system-x86 busybox-static kmod cpio xz-utils zstd pciutils
	bc bison flex libelf-dev libssl-dev dwarves debhelper dkms dh-dkms dpkg-dev mmdebstrap e2fsprogs
	libaio-dev zlib1g-dev doxygen python3-matplotlib lintian man-db
	hipcc libamdhip64-dev llvm-15 libc6-dev-arm64-cross)
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
	echo "deps: all ${#pkgs[@]} packages present"
	exit 0
fi
echo "deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
for try in 1 2 3; do
	if apt-get update -q && apt-get install -y -q --no-install-recommends "${missing[@]}"; then
		exit 0
	fi
	echo "deps: apt-get failed (try $try), retrying" >&2
	sleep $((try * 5))
done
exit 1
