#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Debug check for the read-only-load rule of gpuq/gqp_cuda.h: in the PTX of a kernel that reaps a
# GPU-resident queue or acquires (fence.acquire.sys, the core's membar.sys / fence.sc.sys), any
# ld.global.nc (const __restrict__ pointers, __ldg) is reported, since no acquire makes that path
# fresh under the PTX model. Read-only tables loaded that way are harmless; payloads are not, and
# the check cannot tell them apart, so it names the kernel and the line for a person to judge.
# Usage: tests/gpu/check-nc-ptx.sh FILE.ptx...  (nvcc -ptx of the user's code). Exit 1 when
# something was reported.
set -uo pipefail
found=0
for f in "$@"; do
	out=$(awk '
		/^\.(visible|weak)? *\.?(entry|func)/ || /^\.visible \.(entry|func)/ {
			name = $0; sub(/\(.*/, "", name); sub(/.* /, "", name); acq = 0; nl = 0; delete nc
		}
		/fence\.acquire\.sys|fence\.sc\.sys|membar\.sys/ { acq = 1 }
		/ld\.global\.nc/ { nc[++nl] = FNR ": " $0 }
		/^}/ && name != "" {
			if (acq && nl)
				for (i = 1; i <= nl; i++)
					printf "%s: %s\n", name, nc[i]
			name = ""
		}' "$f")
	if [ -n "$out" ]; then
		found=1
		echo "$f: ld.global.nc in a kernel that reaps or acquires (gpuq/gqp_cuda.h, read-only loads):"
		echo "$out" | sed 's/^/  /'
	fi
done
exit "$found"
