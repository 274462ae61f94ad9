#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The P2P placement check (gpu/p2p_check.h) against fake sysfs and /proc/iomem trees, built with
# gcc and clang (-Wall -Wextra -Werror) and run. TAP output.
set -uo pipefail
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=0
fail=0
for cc in gcc clang; do
	n=$((n + 1))
	if ! command -v "$cc" >/dev/null; then
		echo "ok $n # SKIP $cc not found"
		continue
	fi
	if ! "$cc" -std=c11 -Wall -Wextra -Werror -Iinclude tests/gpu/test_p2p_check.c \
		-o "$tmp/t-$cc" >"$tmp/log" 2>&1; then
		echo "not ok $n - build with $cc"
		sed 's/^/# /' "$tmp/log" | head -20
		fail=$((fail + 1))
		continue
	fi
	if "$tmp/t-$cc" >"$tmp/out" 2>&1; then
		echo "ok $n - p2p placement check ($cc): $(grep -c '^ok' "$tmp/out") checks"
	else
		echo "not ok $n - p2p placement check ($cc)"
		grep -v '^ok' "$tmp/out" | sed 's/^/# /' | head -20
		fail=$((fail + 1))
	fi
done
echo "1..$n"
[ "$fail" -eq 0 ]
