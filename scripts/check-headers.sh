#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Header hygiene: every header under include/ must compile on its own, as the first and only
# include of a translation unit, as C11 and C++17, with gcc and clang, -Wall -Wextra -Werror.
# Host headers (*.h without a _cuda/_hip suffix) are covered; device-code headers are compiled by
# nvcc/hipcc in their own checks. New headers are picked up automatically.
# Prints one TAP line per header and compiler/language; exits non-zero if any failed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=0
fail=0
compilers=(gcc clang)
declare -A cxx=([gcc]=g++ [clang]=clang++)
mapfile -t headers < <(find include -name '*.h' ! -name '*_cuda.h' ! -name '*_hip.h' | sort)
for h in "${headers[@]}"; do
	inc=${h#include/}
	printf '#include <%s>\n#include <%s>\nint upcie_hygiene_tu_;\n' "$inc" "$inc" >"$tmp/t.c"
	for cc in "${compilers[@]}"; do
		for lang in c11 c++17; do
			n=$((n + 1))
			if [ "$lang" = c11 ]; then
				cmd=("$cc" -std=c11 -x c)
			else
				cmd=("${cxx[$cc]}" -std=c++17 -x c++)
			fi
			if "${cmd[@]}" -Wall -Wextra -Werror -Wshadow -Wundef -Iinclude -c "$tmp/t.c" \
				-o "$tmp/t.o" 2>"$tmp/err"; then
				echo "ok $n - $inc ($cc, $lang)"
			else
				echo "not ok $n - $inc ($cc, $lang)"
				sed 's/^/# /' "$tmp/err" | head -20
				fail=$((fail + 1))
			fi
		done
	done
done
echo "1..$n"
[ "$fail" -eq 0 ]
