#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# clang-format check over every C, C++, CUDA and HIP source in the tree (TAP, one line a file).
set -euo pipefail
cd "$(dirname "$0")/.."
n=0
fail=0
while IFS= read -r f; do
	n=$((n + 1))
	if clang-format --dry-run -Werror "$f" >/dev/null 2>&1; then
		echo "ok $n - $f"
	else
		echo "not ok $n - $f (run clang-format -i $f)"
		fail=$((fail + 1))
	fi
done < <(git ls-files --cached --others --exclude-standard -- '*.c' '*.h' '*.cu' '*.cuh' '*.hip' '*.cpp' | grep -v '^dkms/.*/debian/' | sort)
echo "1..$n"
[ "$fail" -eq 0 ]
