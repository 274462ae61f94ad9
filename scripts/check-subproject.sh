#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# upcie as a meson subproject (tests/subproject/): a C-only consumer with no C++ compiler on
# hand gets dependency('upcie') through the wrap, builds and runs against the headers, and the
# subproject configures no target of its own and installs nothing into the consumer's prefix.
# Twice: with subprojects/upcie linked to this working tree, and with the wrap cloning the
# checkout's committed HEAD (as a consumer's first `meson setup` fetches it). TAP output.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=0
fails=0
t() {
	n=$((n + 1))
	if "${@:2}" >"$tmp/log" 2>&1; then
		echo "ok $n - $1"
	else
		echo "not ok $n - $1"
		sed 's/^/#   /' "$tmp/log" | tail -n 20
		fails=$((fails + 1))
	fi
}
consumer() { # DIR MODE: a copy of tests/subproject with the wrap pointed at this checkout
	mkdir -p "$1/subprojects"
	cp "$root/tests/subproject/meson.build" "$root/tests/subproject/main.c" "$1/"
	sed "s|^url = .*|url = file://$root|; s|^revision = .*|revision = HEAD|" \
		"$root/tests/subproject/subprojects/upcie.wrap" >"$1/subprojects/upcie.wrap"
	[ "$2" = tree ] && ln -s "$root" "$1/subprojects/upcie"
	return 0
}
no_upcie_targets() { # the subproject's targets: none
	local k
	k=$(meson introspect "$1" --targets | python3 -c 'import json,sys
print(sum(1 for t in json.load(sys.stdin) if t.get("subproject") == "upcie"))')
	[ "$k" = 0 ] || { echo "upcie configured $k targets"; return 1; }
}
installs_only_consumer() {
	meson install -C "$1" --destdir "$1/dest" --quiet
	local files
	files=$(cd "$1/dest" && find . -type f | sort)
	[ "$files" = "./usr/local/bin/consumer" ] || { echo "installed: $files"; return 1; }
}
for mode in tree wrap; do
	d=$tmp/$mode
	consumer "$d" "$mode"
	# CXX=false: a consumer without a C++ compiler; --force-fallback-for: never a system upcie.pc
	t "$mode: meson setup of a C consumer (no C++ compiler)" \
		env CXX=false meson setup "$d/build" "$d" --force-fallback-for=upcie --prefix=/usr/local
	t "$mode: builds" ninja -C "$d/build"
	t "$mode: runs against the headers" "$d/build/consumer"
	t "$mode: the subproject configures no target (no tools, tests, GPU code)" no_upcie_targets "$d/build"
	t "$mode: installs the consumer's program and nothing of upcie's" installs_only_consumer "$d/build"
done
echo "1..$n"
[ "$fails" = 0 ]
