#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Install the headers from a configured build dir into a scratch prefix and build a program that
# lives outside the tree against them, found only through pkg-config. TAP output.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-gcc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=0
t() {
	n=$((n + 1))
	if "${@:2}"; then echo "ok $n - $1"; else echo "not ok $n - $1"; return 1; fi
}
t "meson install into a scratch prefix" meson install -C "$build" --destdir "$tmp/dest" --quiet
prefix=$(meson introspect "$build" --buildoptions | python3 -c 'import json,sys; print([o["value"] for o in json.load(sys.stdin) if o["name"]=="prefix"][0])')
pc=$(find "$tmp/dest" -name upcie.pc | head -1)
t "upcie.pc installed" test -n "$pc"
t "headers installed with their folders, under include/upcie-1" test -f "$tmp/dest$prefix/include/upcie-1/upcie/pci/bdf.h"
t "the UAPI headers installed as files" test -f "$tmp/dest$prefix/include/upcie-1/upcie/kmod/uapi/dmabuf_import.h" -a \
	! -L "$tmp/dest$prefix/include/upcie-1/upcie/kmod/uapi/dmabuf_import.h"
# uPCIe, another project of the same name, installs <prefix>/include/upcie/ (upcie.h, pci.h,
# nvme/...): nothing of upcie's may land there, and with a stand-in of theirs on the compiler's
# default path (after the -I of upcie.pc, where /usr/include and /usr/local/include are) the
# consumer must still get upcie's headers.
t "nothing installed in include/upcie/ (uPCIe's folder)" test ! -e "$tmp/dest$prefix/include/upcie"
mkdir -p "$tmp/dest$prefix/include/upcie"
echo '#error "uPCIe'"'"'s upcie/pci.h was included"' >"$tmp/dest$prefix/include/upcie/pci.h"
export PKG_CONFIG_PATH=$(dirname "$pc")
export PKG_CONFIG_SYSROOT_DIR=$tmp/dest
mkdir -p "$tmp/consumer"
cat >"$tmp/consumer/main.c" <<'C'
#include <stdio.h>
#include <string.h>
#include <upcie/pci.h>
#include <upcie/mem/dmamem.h>
int main(void)
{
	struct upcie_pci_bdf bdf;
	char buf[UPCIE_PCI_BDF_STRLEN];
	if (upcie_pci_bdf_parse("01:00.0", &bdf) || upcie_pci_bdf_format(&bdf, buf, sizeof(buf)) < 0)
		return 1;
	puts(buf);
	return strcmp(buf, "0000:01:00.0") != 0;
}
C
flags=$(pkg-config --cflags --libs upcie)
t "pkg-config --cflags --libs upcie ($flags)" test -n "$flags"
t "pkg-config --cflags adds include/upcie-1" sh -c "echo '$flags' | grep -q -- '-I[^ ]*/include/upcie-1'"
t "consumer compiles (gcc, -std=c11, system header first; uPCIe's include/upcie/pci.h on the default path)" \
	sh -c "cd '$tmp/consumer' && gcc -std=c11 -Wall -Wextra -Werror main.c $flags -I'$tmp/dest$prefix/include' -o app"
t "consumer runs" sh -c "'$tmp/consumer/app' | grep -qx 0000:01:00.0"
t "consumer compiles as C++ (clang++)" sh -c "cd '$tmp/consumer' && cp main.c main.cpp && clang++ -std=c++17 -Wall -Wextra -Werror main.cpp $flags -o app2"
echo "1..$n"
