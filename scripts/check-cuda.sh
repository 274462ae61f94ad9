#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Compile every CUDA source in the tree with nvcc for sm_90 (the H200), -Werror on warnings.
# CI machines have nvcc but no GPU: this proves the device code builds; tests/gpu runs it on the
# H200. TAP output; a single SKIP line when nvcc is absent.
set -euo pipefail
cd "$(dirname "$0")/.."
nvcc=${NVCC:-$(command -v nvcc || true)}
[ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
if [ -z "$nvcc" ]; then
	echo "ok 1 # SKIP nvcc not found (install CUDA or set NVCC)"
	echo "1..1"
	exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=0
fail=0
while IFS= read -r f; do
	n=$((n + 1))
	if "$nvcc" -std=c++17 -arch=sm_90 -Iinclude -Itests/unit -Xcompiler -Wall,-Wextra,-Werror \
		--Werror all-warnings -c "$f" -o "$tmp/o.o" >"$tmp/log" 2>&1; then
		echo "ok $n - nvcc sm_90: $f"
	else
		echo "not ok $n - nvcc sm_90: $f"
		sed 's/^/# /' "$tmp/log" | head -30
		fail=$((fail + 1))
	fi
done < <(git ls-files --cached --others --exclude-standard -- '*.cu' | sort)
if [ "$n" -eq 0 ]; then
	echo "ok 1 # SKIP no CUDA sources"
	n=1
fi
echo "1..$n"
[ "$fail" -eq 0 ]
