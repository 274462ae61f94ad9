#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The Debian packages of upcie's headers and tools, built and checked, TAP output:
#  - libupcie-dev (arch all: the headers under /usr/include/upcie-1, upcie.pc in
#    /usr/share/pkgconfig) and upcie-tools (upcie-setup, upcie-perf, upcie-served and their man
#    pages) built with dpkg-buildpackage from packaging/debian/ (debhelper, meson) on a copy of
#    the tree (git's tracked and untracked-but-not-ignored files: no build folders);
#  - lintian passes on them (no error, no warning; the tags it printed are shown);
#  - each holds what it must, and the tools' man pages render without a warning.
# tests/install/tools-install.sh installs them with apt into a Debian root and uses them.
#
#   scripts/build-deb.sh [OUTDIR]    the .debs are left in OUTDIR (default build-deb/)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/build-deb}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=0
fail=0
ok() { n=$((n + 1)); echo "ok $n - $*"; }
nok() { # DESC [LOGFILE]
	n=$((n + 1))
	fail=$((fail + 1))
	echo "not ok $n - $1"
	[ -n "${2:-}" ] && [ -f "$2" ] && tail -n 30 "$2" | sed 's/^/# /'
}
finish() { echo "1..$n"; [ "$fail" = 0 ]; exit $?; }

for tool in dpkg-buildpackage dpkg-deb dpkg-parsechangelog lintian meson ninja git man; do
	command -v "$tool" >/dev/null || { nok "tool $tool present (scripts/deps.sh installs it)"; finish; }
done
ver=$(dpkg-parsechangelog -l "$root/packaging/debian/changelog" -SVersion)
pver=$(cd "$root" && sed -n "s/^ *version : '\([^']*\)'.*/\1/p" meson.build | head -n 1)
if [ "$ver" = "$pver" ]; then
	ok "packaging/debian/changelog version $ver = meson project version"
else
	nok "packaging/debian/changelog version $ver = meson project version $pver"
fi

src=$tmp/upcie-$ver
mkdir -p "$src"
(cd "$root" && git ls-files -z --cached --others --exclude-standard |
	xargs -0 sh -c 'for f; do [ -e "$f" ] || [ -L "$f" ] && printf "%s\0" "$f"; done' sh |
	tar --null -T - -cf -) | tar -xf - -C "$src"
rm -rf "$src/debian"
cp -r "$root/packaging/debian" "$src/debian"
if (cd "$src" && dpkg-buildpackage -us -uc -b) >"$tmp/build.log" 2>&1; then
	ok "dpkg-buildpackage built libupcie-dev and upcie-tools $ver"
else
	nok "dpkg-buildpackage" "$tmp/build.log"
	finish
fi
arch=$(dpkg --print-architecture)
dev=$tmp/libupcie-dev_${ver}_all.deb
tools=$tmp/upcie-tools_${ver}_${arch}.deb
changes=$tmp/upcie_${ver}_${arch}.changes
mkdir -p "$out"
cp "$dev" "$tools" "$out/"

if lintian --fail-on error,warning --display-info "$changes" "$dev" "$tools" >"$tmp/lintian.log" 2>&1; then
	ok "lintian: no error, no warning ($(grep -c '^[A-Z]:' "$tmp/lintian.log") info/pedantic lines)"
	sed 's/^/# /' "$tmp/lintian.log"
else
	nok "lintian: no error, no warning" "$tmp/lintian.log"
fi

# contents
dpkg-deb -c "$dev" | awk '{ print $6 }' >"$tmp/dev.list"
dpkg-deb -c "$tools" | awk '{ print $6 }' >"$tmp/tools.list"
miss=""
for f in ./usr/include/upcie-1/upcie/pci.h ./usr/include/upcie-1/upcie/nvme/ctrl.h \
	./usr/include/upcie-1/upcie/kmod/uapi/dmabuf_import.h ./usr/share/pkgconfig/upcie.pc \
	./usr/share/doc/libupcie-dev/copyright; do
	grep -qxF "$f" "$tmp/dev.list" || miss="$miss $f"
done
if [ -z "$miss" ] && ! grep -q '^\./usr/bin/\|^\./usr/lib/' "$tmp/dev.list"; then
	ok "libupcie-dev: headers (kmod UAPI files too), upcie.pc in /usr/share/pkgconfig, no programs or libraries"
else
	nok "libupcie-dev contents (missing:$miss)"
fi
if grep -q 'upcie-1/upcie/kmod/uapi/dmabuf_import.h' "$tmp/dev.list" &&
	dpkg-deb --fsys-tarfile "$dev" | tar -tvf - ./usr/include/upcie-1/upcie/kmod/uapi/dmabuf_import.h | grep -q '^-'; then
	ok "libupcie-dev: the UAPI headers are files, not links into dkms/"
else
	nok "libupcie-dev: the UAPI headers are files"
fi
miss=""
for t in upcie-setup upcie-perf upcie-served; do
	grep -qxF "./usr/bin/$t" "$tmp/tools.list" || miss="$miss /usr/bin/$t"
	grep -qxF "./usr/share/man/man1/$t.1.gz" "$tmp/tools.list" || miss="$miss $t.1.gz"
done
if [ -z "$miss" ]; then
	ok "upcie-tools: upcie-setup, upcie-perf, upcie-served and a man page for each"
else
	nok "upcie-tools contents (missing:$miss)"
fi
mkdir -p "$tmp/x"
dpkg-deb -x "$tools" "$tmp/x"
bad=""
for t in upcie-setup upcie-perf upcie-served; do
	if ! MANWIDTH=80 man --warnings -l "$tmp/x/usr/share/man/man1/$t.1.gz" >"$tmp/man.$t" 2>"$tmp/manerr.$t" ||
		[ -s "$tmp/manerr.$t" ] || ! grep -q "^NAME" "$tmp/man.$t"; then
		bad="$bad $t"
	fi
done
if [ -z "$bad" ]; then
	ok "the man pages render without a warning (man --warnings)"
else
	nok "man pages render:$bad" "$tmp/manerr.${bad##* }"
fi
# every long option a tool's --help names has its man page mention it
bad=""
for t in upcie-setup upcie-perf; do
	for o in $("$tmp/x/usr/bin/$t" --help 2>&1 | grep -o -- '--[a-z][a-z-]*' | sort -u); do
		grep -q -- "${o//-/\\\\-}\|$o" "$tmp/man.$t" || bad="$bad $t:$o"
	done
done
if [ -z "$bad" ]; then
	ok "upcie-setup.1 and upcie-perf.1 describe every option their --help lists"
else
	nok "man pages miss options:$bad"
fi
finish
