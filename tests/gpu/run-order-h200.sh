#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The runs behind docs/results/gpu-queues.md ("Completion -> data ordering") and gpu-tests.md, on
# a CUDA machine (an H200), from the repository root, with binaries prebuilt in $BIN
# (default build-gpu; see the docs for the nvcc lines): the ordering probe, the SASS of the
# completion paths (cuobjdump), test_gpu (all groups), the negative controls
# (tests/gpu/run-controls.sh), and the benchmarks built twice, against these headers (bench_gpu)
# and against the headers before the acquire fence (bench_gpu_before), run alternately in the same
# call. Logs go to $OUT (or build-gpu/out): at most eight files.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-build-gpu/out}
bin=${BIN:-build-gpu}
mkdir -p "$out" build-gpu
run() { env -u CUDA_LAUNCH_BLOCKING CUDA_MODULE_LOADING=EAGER "$@"; }
{
	date -u
	uname -r
	nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current,clocks.sm --format=csv
	echo
	run timeout 60 "$bin/probe_order"
} >"$out/probe.txt" 2>&1
{
	for f in order_kernels order_kernels_before; do
		echo "=== $f.cubin"
		cuobjdump -sass "$bin/$f.cubin"
	done
} >"$out/sass.txt" 2>&1
echo 1024 >/proc/sys/vm/nr_hugepages 2>/dev/null || true
run TEST_WATCHDOG=100 timeout 110 "$bin/test_gpu" >"$out/test_gpu.tap" 2>"$out/test_gpu.stderr"
echo "test_gpu exit: $?" >>"$out/test_gpu.tap"
for f in test_gpu_ctl_acquire test_gpu_ctl_rmb test_gpu_ctl_clear; do
	[ -x "build-gpu/$f" ] || cp "$bin/$f" build-gpu/ 2>/dev/null
done
OUT=$out bash tests/gpu/run-controls.sh >"$out/controls.txt" 2>&1
echo "run-controls exit: $?" >>"$out/controls.txt"
for f in "$out"/control_*.tap; do
	echo "=== $f"
	cat "$f"
done >>"$out/controls.txt"
rm -f "$out"/control_*.tap
export BENCH_WATCHDOG=100
for i in 1 2 3; do
	echo "=== round $i: before"
	run timeout 60 "$bin/bench_gpu_before" qd
	echo "=== round $i: after"
	run timeout 60 "$bin/bench_gpu" qd
done >"$out/bench_qd.txt" 2>&1
run timeout 110 "$bin/bench_gpu_before" rate hostsq qd32 mirror >"$out/bench_before.txt" 2>&1
run timeout 110 "$bin/bench_gpu" rate hostsq qd32 mirror >"$out/bench_after.txt" 2>&1
ls -la "$out"
