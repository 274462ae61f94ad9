#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Build, on a machine with nvcc and no GPU, what tests/gpu/run-round3-h200.sh runs on the H200,
# into build-gpu/: test_gpu, its negative controls (run-controls.sh's names), bench_gpu, and
# bench_gpu_before (the same benchmark against the headers of git ref $BEFORE, default HEAD, for
# the before/after rows; BEFORE_PTR=1 passes the command through a pointer, for refs older than
# upcie_nvme_gqp_enqueue_cmd()),
# bench_gpu_ptr (today's headers, the command through a pointer), bench_gpu_vreload (the CQE
# re-load as a strong system-scope load), bench_gpu_noreload (no re-load: its cost alone),
# bench_gpu_prof and bench_gpu_prof_before (the cycles of each phase of the loop). Jobs run in
# parallel ($JOBS, default 2); ONLY="name ..." builds those binaries alone (the cubins always).
set -euo pipefail
cd "$(dirname "$0")/../.."
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
before=${BEFORE:-HEAD}
bptr=
[ "${BEFORE_PTR:-0}" = 1 ] && bptr=-DBENCH_PTR_ENQUEUE
mkdir -p build-gpu build-gpu/old
rm -rf build-gpu/old/include
git archive "$before" include | tar -x -C build-gpu/old
flags=(-std=c++17 -O2 -arch=sm_90 -Itests/unit -Xcompiler -Wall,-Wextra,-Werror --Werror all-warnings)
libs=(-L/usr/local/cuda/lib64/stubs -lcuda -lpthread)
jobs=()
b() { # OUT SRC [flags]
	local out=$1 src=$2
	shift 2
	"$nvcc" "${flags[@]}" "$@" "tests/gpu/$src.cu" -o "build-gpu/$out" "${libs[@]}" \
		>"build-gpu/$out.log" 2>&1 || { echo "build of $out failed"; cat "build-gpu/$out.log"; return 1; }
	echo "built build-gpu/$out"
}
list=(
	"test_gpu test_gpu -Iinclude"
	"bench_gpu bench_gpu -Iinclude"
	"bench_gpu_before bench_gpu -Ibuild-gpu/old/include -Iinclude $bptr"
	"bench_gpu_ptr bench_gpu -Iinclude -DBENCH_PTR_ENQUEUE"
	"bench_gpu_vreload bench_gpu -Iinclude -DUPCIE_NVME_GQP_CQE_RELOAD_LD(p)=upcie_nvme_port_ld16(p)"
	"bench_gpu_noreload bench_gpu -Iinclude -DUPCIE_NVME_GQP_CQE_RELOAD=0"
	"bench_gpu_prof bench_gpu -Iinclude -DBENCH_PROF"
	"bench_gpu_prof_before bench_gpu -Ibuild-gpu/old/include -Iinclude -DBENCH_PROF $bptr"
	"test_gpu_ctl_acquire test_gpu -Iinclude -DUPCIE_NVME_GQP_ACQUIRE()="
	"test_gpu_ctl_rmb test_gpu -Iinclude -DUPCIE_NVME_PORT_DMA_RMB()="
	"test_gpu_ctl_clear test_gpu -Iinclude -DUPCIE_NVME_GQP_TEST_CLEAR_UNORDERED"
	"test_gpu_ctl_dacq test_gpu -Iinclude -DUPCIE_NVME_GQP_DATA_ACQUIRE()="
	"test_gpu_ctl_reload test_gpu -Iinclude -DUPCIE_NVME_GQP_CQE_RELOAD=0"
)
n=0
for e in "${list[@]}"; do
	read -r -a a <<<"$e"
	if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" ${a[0]} "* ]]; then
		continue
	fi
	b "${a[@]}" &
	n=$((n + 1))
	if [ $((n % ${JOBS:-2})) = 0 ]; then wait; fi
done
wait
"$nvcc" -std=c++17 -arch=sm_90 -cubin -Iinclude tests/gpu/order_kernels.cu -o build-gpu/order_kernels.cubin
"$nvcc" -std=c++17 -arch=sm_90 -cubin -Iinclude -Itests/unit tests/gpu/bench_gpu.cu -o build-gpu/bench_gpu.cubin
