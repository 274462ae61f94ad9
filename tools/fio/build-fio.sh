#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
#
# Build fio from Debian's own source package, so that upcie's external ioengine can be compiled
# against a configured fio tree (fio.h, optgroup.h, config-host.h) and run by the fio binary of
# that same tree.
#
#   tools/fio/build-fio.sh [--dir DIR] [--print]
#
# Debian ships no fio headers package. This fetches the source of the distribution's fio with a
# private apt configuration (a deb-src entry for the system's own mirror; the system's apt
# configuration is not touched), unpacks it with Debian's patches (dpkg-source), configures it
# for this machine's generic CPU (--disable-native: the binary also runs in emulated guests) with
# the optional network and cluster engines off, and builds the fio binary. The result is cached:
# DIR/fio-<version>/ holds the configured tree and the fio binary; a second run only prints it.
# The last line of the output is FIO_SRC=<tree>; with --print nothing is built, the line is
# printed when the tree is ready (exit 1 otherwise).
#
# Environment: UPCIE_FIO_DIR (default DIR: /var/cache/upcie-fio), UPCIE_FIO_SUITE (bookworm),
# UPCIE_FIO_MIRROR (default: the URIs: of /etc/apt/sources.list.d/debian.sources),
# UPCIE_FIO_JOBS (make -j, default nproc). Needs: apt-get, dpkg-source (dpkg-dev), gcc, make,
# libaio-dev and zlib1g-dev (scripts/deps.sh installs them). Root only for a DIR under /var.
set -euo pipefail

dir=${UPCIE_FIO_DIR:-/var/cache/upcie-fio}
suite=${UPCIE_FIO_SUITE:-bookworm}
jobs=${UPCIE_FIO_JOBS:-$(nproc)}
print=0
while [ $# -gt 0 ]; do
	case $1 in
	--dir) dir=$2; shift 2 ;;
	--print) print=1; shift ;;
	-h | --help) sed -n '3,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "build-fio: unknown argument '$1'" >&2; exit 2 ;;
	esac
done
log() { printf 'build-fio: %s\n' "$*" >&2; }
die() { printf 'build-fio: error: %s\n' "$*" >&2; exit 1; }

if [ "$print" = 1 ]; then
	t=$(find "$dir" -maxdepth 2 -name .ready -path '*/fio-*' 2>/dev/null | sort -V | tail -n 1)
	[ -n "$t" ] || exit 1
	echo "FIO_SRC=$(dirname "$t")"
	exit 0
fi

mirror=${UPCIE_FIO_MIRROR:-}
if [ -z "$mirror" ] && [ -r /etc/apt/sources.list.d/debian.sources ]; then
	mirror=$(awk '/^URIs:/ { for (i = 2; i <= NF; i++) if ($i !~ /security/) { print $i; exit } }' \
		/etc/apt/sources.list.d/debian.sources)
fi
if [ -z "$mirror" ] && [ -r /etc/apt/sources.list ]; then
	mirror=$(awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { if ($i !~ /security/) { print $i; exit } break } }' \
		/etc/apt/sources.list)
fi
[ -n "$mirror" ] || die "no Debian mirror in /etc/apt (URIs:); set UPCIE_FIO_MIRROR"

mkdir -p "$dir"
exec {lockfd}>"$dir/.lock"
flock -w 3600 "$lockfd" || die "cannot lock $dir"

apt=$dir/apt
mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial"
echo "deb-src $mirror $suite main" >"$apt/sources.list"
O=(-o "Dir::Etc::SourceList=$apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
	-o Dir::Etc::Preferences=/dev/null -o Dir::Etc::PreferencesParts=/dev/null
	-o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache" -o Acquire::Languages=none
	-o APT::Sandbox::User=root -o Acquire::Retries=2)
ver=
if apt-get "${O[@]}" -q update >"$dir/apt.log" 2>&1; then
	ver=$(apt-cache "${O[@]}" showsrc fio 2>/dev/null | awk '/^Version:/ { print $2 }' | sort -V | tail -n 1)
fi
if [ -z "$ver" ]; then
	# offline: the newest tree already built
	t=$(find "$dir" -maxdepth 2 -name .ready -path '*/fio-*' | sort -V | tail -n 1)
	[ -n "$t" ] || die "cannot reach $mirror ($suite deb-src) and nothing is cached (log: $dir/apt.log)"
	log "archive unreachable; using the cached tree"
	echo "FIO_SRC=$(dirname "$t")"
	exit 0
fi
tree=$dir/fio-$ver
if [ -f "$tree/.ready" ]; then
	log "fio $ver is built in $tree"
	echo "FIO_SRC=$tree"
	exit 0
fi

for t in gcc make dpkg-source; do
	command -v "$t" >/dev/null || die "$t missing (apt-get install gcc make dpkg-dev)"
done
[ -e /usr/include/libaio.h ] || die "libaio.h missing (apt-get install libaio-dev): fio's libaio engine is part of the comparison"

tmp=$dir/tmp-$ver
rm -rf "$tmp"
mkdir -p "$tmp"
log "fetching the source of fio $ver ($suite) from $mirror"
(cd "$tmp" && apt-get "${O[@]}" -q source --download-only "fio=$ver") >>"$dir/apt.log" 2>&1 ||
	die "apt-get source fio=$ver failed (log: $dir/apt.log)"
dpkg-source --no-check -x "$tmp"/fio_*.dsc "$tmp/src" >"$tmp/unpack.log" 2>&1 ||
	die "dpkg-source -x failed (log: $tmp/unpack.log)"
cd "$tmp/src"
# No optional engines that pull cluster, network or persistent-memory libraries into the binary:
# the result must run with libc, libm, libaio and zlib only (also inside a minimal guest).
./configure --disable-native --disable-numa --disable-rdma --disable-rados --disable-rbd \
	--disable-http --disable-gfapi --disable-pmem --disable-xnvme --disable-libzbc \
	--disable-tcmalloc --disable-dfs --disable-libnfs >"$tmp/configure.log" 2>&1 ||
	die "configure failed (log: $tmp/configure.log)"
grep -q '^#define CONFIG_LIBAIO' config-host.h || die "configure found no libaio (log: $tmp/configure.log)"
log "building fio $ver (make -j$jobs, niced)"
nice -n 10 make -j"$jobs" fio >"$tmp/make.log" 2>&1 || die "make failed (log: $tmp/make.log)"
./fio --version >/dev/null || die "the built fio does not run"
# keep the tree (headers, config-host.h) and the binary; objects are not needed any more
find . -name '*.o' -delete -o -name '*.d' -delete
cd /
rm -rf "$tree"
mv "$tmp/src" "$tree"
mv "$tmp"/*.log "$tree/"
rm -rf "$tmp"
touch "$tree/.ready"
log "fio $ver built: $tree/fio"
echo "FIO_SRC=$tree"
