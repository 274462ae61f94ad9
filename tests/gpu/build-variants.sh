#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Build the benchmark variants used to choose between designs (docs/results/gpu-queues.md) into
# build-gpu/: bench_gpu_store4 (per-lane 4-byte SQE stores), bench_gpu_scfence (batches published
# with fence.sc.sys), and bench_gpu_mirror_<name>, each loading a completion-mirror kernel
# compiled with other UPCIE_NVME_CQMIRROR_* settings (through the UPCIE_NVME_CQMIRROR_PTX hook of
# gpuq/cqmirror_host_cuda.h), for MIRROR_VARIANTS="name:-DX=1,-DY=2 ...". Needs nvcc.
set -euo pipefail
cd "$(dirname "$0")/../.."
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
mkdir -p build-gpu
flags=(-std=c++17 -O2 -arch=sm_90 -Iinclude -Itests/unit -Xcompiler -Wall,-Wextra,-Werror
	--Werror all-warnings)
libs=(-L/usr/local/cuda/lib64/stubs -lcuda -lpthread)
for f in bench_gpu_store4 bench_gpu_scfence; do
	"$nvcc" "${flags[@]}" "tests/gpu/$f.cu" -o "build-gpu/$f" "${libs[@]}"
done
# name:defines of the mirror kernel
variants=${MIRROR_VARIANTS:-}
for v in $variants; do
	name=${v%%:*}
	defs=${v#*:}
	IFS=, read -r -a dargs <<<"$defs"
	ptx=build-gpu/mirror_$name.ptx
	"$nvcc" -std=c++17 -ptx -arch=compute_75 -Iinclude "${dargs[@]}" tests/gpu/cqmirror_kernel.cu -o "$ptx"
	{
		echo 'static const char bench_mirror_ptx[] ='
		sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/\t/\\t/g' -e 's/^/\t"/' -e 's/$/\\n"/' "$ptx"
		echo ';'
	} >"build-gpu/mirror_$name.h"
	"$nvcc" "${flags[@]}" -DUPCIE_NVME_CQMIRROR_PTX=bench_mirror_ptx -include "build-gpu/mirror_$name.h" \
		tests/gpu/bench_gpu.cu -o "build-gpu/bench_gpu_mirror_$name" "${libs[@]}"
	echo "built build-gpu/bench_gpu_mirror_$name ($defs)"
done
