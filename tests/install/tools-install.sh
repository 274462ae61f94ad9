#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
#
# upcie's packages of headers and tools (libupcie-dev, upcie-tools) installed the way users
# install them: scripts/build-deb.sh builds them (and checks them with lintian), then apt-get
# installs the two .debs into a Debian 12 root file system built from Debian's archive
# (mmdebstrap; cached) and, inside it (chroot), a consumer compiles against the installed
# headers through pkg-config, the tools run (--version, --help, a bad value refused with exit
# 2), man finds their pages; then apt-get purges both and nothing of them is left. No kernel is
# involved (nothing here loads a module), so the root is entered with chroot, not booted: the
# DKMS packages' test (dkms-install.sh) boots its root because it must load modules. TAP out,
# and a last line "N passed, N failed, N skipped".
#
#   tests/install/tools-install.sh       (root)
#
# Needs: mmdebstrap, debhelper, meson, lintian (scripts/deps.sh), a Debian mirror (as the guest
# test bed: UPCIE_TESTBED_MIRROR or the system's). Cache: $UPCIE_TESTBED_CACHE/install-tools/
# (the root as a tarball, ~90 MB; rebuilt when the recipe changes). Work:
# $UPCIE_TESTBED_WORK/install-tools/.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$HERE/../.." && pwd)
# the guest test bed's helpers and settings (cache, work dir, mirror, locks)
# shellcheck source=../guest/testbed.sh
. "$REPO_ROOT/tests/guest/testbed.sh"

# What a user's machine has before installing: a compiler and pkg-config for the consumer,
# man-db to look the pages up.
readonly TROOT_PKGS="gcc libc6-dev pkgconf man-db"
N=0 NF=0 NS=0
t_ok() { N=$((N + 1)); echo "ok $N - $*"; }
t_nok() { # DESC [DETAIL...]
	N=$((N + 1)) NF=$((NF + 1))
	echo "not ok $N - $1"
	shift
	for l in "$@"; do printf '%s\n' "$l" | sed 's/^/# /'; done
}

build_root() { # -> $TROOT (tarball)
	local key tmp
	key=$(printf '%s\n' "$TROOT_PKGS" bookworm | sha256sum | cut -c1-12)
	TROOT=$CACHE/install-tools/root-$key.tar
	[ -f "$TROOT" ] && { log "root file system cached: $TROOT"; return 0; }
	need_tools mmdebstrap
	tmp=$CACHE/install-tools/tmp-$key.tar
	mkdir -p "$CACHE/install-tools/debs"
	log "building the root file system (Debian bookworm: $TROOT_PKGS) from $(mirror_uri)"
	# shellcheck disable=SC2086
	retry logged "$CACHE/logs/install-tools-root.log" mmdebstrap --variant=apt --mode=root \
		--include="$(echo $TROOT_PKGS | tr ' ' ,)" \
		--setup-hook='mkdir -p "$1/var/cache/apt/archives"' \
		--setup-hook="sync-in $CACHE/install-tools/debs /var/cache/apt/archives/" \
		--customize-hook="sync-out /var/cache/apt/archives $CACHE/install-tools/debs" \
		--customize-hook='chroot "$1" apt-get clean' \
		bookworm "$tmp" "deb $(mirror_uri) bookworm main" ||
		die "mmdebstrap failed (log: $CACHE/logs/install-tools-root.log)"
	mv "$tmp" "$TROOT"
	for f in "$CACHE"/install-tools/root-*.tar; do [ "$f" = "$TROOT" ] || rm -f "$f"; done
}

in_root() { chroot "$RUN/root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C.UTF-8 "$@"; }

main() {
	local out ver
	[ "$(id -u)" = 0 ] || die "run as root (mmdebstrap, chroot, the cache)"
	mkdir -p "$CACHE/install-tools" "$CACHE/logs"
	lock "$CACHE/install-tools"
	RUN=$WORK/install-tools
	mkdir -p "$RUN"
	lock "$RUN"
	rm -rf "$RUN/root" "$RUN/debs"
	# the packages: built and lintian-checked (its TAP lines become this test's)
	if out=$("$REPO_ROOT/scripts/build-deb.sh" "$RUN/debs" 2>&1); then
		t_ok "scripts/build-deb.sh: packages built, lintian clean, contents and man pages checked"
		printf '%s\n' "$out" | sed 's/^/# /'
	else
		t_nok "scripts/build-deb.sh" "$out"
		echo "1..$N"
		echo "$((N - NF - NS)) passed, $NF failed, $NS skipped"
		return 1
	fi
	ver=$(dpkg-parsechangelog -l "$REPO_ROOT/packaging/debian/changelog" -SVersion)
	build_root
	mkdir -p "$RUN/root"
	tar -xf "$TROOT" -C "$RUN/root"
	mkdir -p "$RUN/root/tmp/debs"
	cp "$RUN"/debs/*.deb "$RUN/root/tmp/debs/"
	cat >"$RUN/root/tmp/consumer.c" <<'EOF'
/* A program of a user of libupcie-dev: the installed headers, through pkg-config. */
#include <stdio.h>
#include <upcie/mem/dmamem.h>
#include <upcie/nvme/ctrl.h>
#include <upcie/pci/bdf.h>

int main(void)
{
	struct upcie_pci_bdf b;
	char s[UPCIE_PCI_BDF_STRLEN];

	if (upcie_pci_bdf_parse("01:00.0", &b))
		return 1;
	upcie_pci_bdf_format(&b, s, sizeof(s));
	printf("%s\n", s);
	return 0;
}
EOF
	# apt, as a user runs it on two local .debs (no network needed: their dependencies are in
	# the root already)
	if out=$(in_root apt-get install -y -q /tmp/debs/libupcie-dev_${ver}_all.deb \
		"/tmp/debs/upcie-tools_${ver}_$(dpkg --print-architecture).deb" 2>&1) &&
		in_root dpkg-query -W -f='${Status}\n' libupcie-dev upcie-tools | grep -c '^install ok installed$' | grep -qx 2; then
		t_ok "apt-get install ./libupcie-dev_${ver}_all.deb ./upcie-tools_${ver}_*.deb: both installed"
	else
		t_nok "apt-get install of the two packages" "$out"
	fi
	out=$(in_root pkg-config --cflags --libs upcie 2>&1 | sed 's/ *$//') # pkgconf ends with a blank
	if [ "$out" = "-I/usr/include/upcie-1 -D_GNU_SOURCE -pthread" ]; then
		t_ok "pkg-config --cflags --libs upcie: $out"
	else
		t_nok "pkg-config --cflags --libs upcie" "$out"
	fi
	if out=$(in_root sh -c 'gcc -std=c11 -Wall -Wextra -Werror -o /tmp/consumer /tmp/consumer.c $(pkg-config --cflags --libs upcie) && /tmp/consumer' 2>&1) &&
		[ "$out" = "0000:01:00.0" ]; then
		t_ok "a consumer compiles with -Werror against the installed headers and runs: $out"
	else
		t_nok "a consumer of the installed headers" "$out"
	fi
	out=$(in_root upcie-perf --version 2>&1)
	if [ "$out" = "upcie-perf (upcie) $ver" ] || printf '%s\n' "$out" | grep -q "^upcie-perf (upcie) $ver"; then
		t_ok "upcie-perf --version: $out"
	else
		t_nok "upcie-perf --version" "$out"
	fi
	local bad=""
	for t in upcie-setup upcie-perf upcie-served; do
		in_root "$t" --help >/dev/null 2>&1 || bad="$bad $t"
	done
	if [ -z "$bad" ]; then t_ok "upcie-setup, upcie-perf, upcie-served --help: exit 0"; else t_nok "--help exit 0:$bad"; fi
	local rc=0
	out=$(in_root upcie-perf --bdf 01:00.0 --time 1x 2>&1) || rc=$?
	if [ "$rc" = 2 ] && printf '%s\n' "$out" | grep -q "^upcie-perf: --time: bad value '1x'"; then
		t_ok "installed upcie-perf refuses --time 1x: exit 2, names the option"
	else
		t_nok "installed upcie-perf --time 1x" "exit $rc" "$out"
	fi
	bad=""
	for t in upcie-setup upcie-perf upcie-served; do
		[ "$(in_root man -w "$t" 2>&1)" = "/usr/share/man/man1/$t.1.gz" ] || bad="$bad $t"
	done
	if [ -z "$bad" ]; then t_ok "man -w finds upcie-setup(1), upcie-perf(1), upcie-served(1)"; else t_nok "man -w:$bad"; fi
	if out=$(in_root apt-get purge -y -q libupcie-dev upcie-tools 2>&1) &&
		[ ! -e "$RUN/root/usr/bin/upcie-perf" ] && [ ! -e "$RUN/root/usr/include/upcie-1" ] &&
		[ ! -e "$RUN/root/usr/share/pkgconfig/upcie.pc" ] && [ ! -e "$RUN/root/usr/share/man/man1/upcie-setup.1.gz" ]; then
		t_ok "apt-get purge: the programs, headers, upcie.pc and man pages are gone"
	else
		t_nok "apt-get purge leaves nothing" "$out"
	fi
	rm -rf "$RUN/root"
	echo "1..$N"
	echo "$((N - NF - NS)) passed, $NF failed, $NS skipped"
	[ "$NF" = 0 ]
}

main
