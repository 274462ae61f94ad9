#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# One H200 call for the reader, tear, placement and fenced-path work (docs/results/gpu-queues.md,
# gpu-tests.md): machine facts, the SASS of the benchmark kernels (cuobjdump), "bare" of
# bench_gpu_before, bench_gpu_ptr and bench_gpu in turn ($ROUNDS rounds, default 2; KINDS names
# others: "before cas after" runs bench_gpu_cas for the middle), the phase cycles of
# bench_gpu_prof_before and bench_gpu_prof (and of each other kind's bench_gpu_prof_KIND where
# built), test_gpu (every group), the negative
# controls (run-controls.sh) and the placement facts (the GPU's BARs in sysfs, /proc/iomem).
# Binaries from tests/gpu/build-h200.sh in build-gpu/ (carried). Logs into $OUT, as one tarball.
set -uo pipefail
cd "$(dirname "$0")/../.."
O=${OUT:-/tmp/out}
L=/tmp/round3
rm -rf "$L"
mkdir -p "$L" "$O"
export PATH=$PATH:/usr/local/cuda/bin
{
	date -u
	uname -r
	nvidia-smi --query-gpu=name,driver_version,memory.total,pci.bus_id,clocks.sm,clocks.max.sm --format=csv
	nvidia-smi -q -d memory | grep -A3 -E 'BAR1'
	command -v ncu cuobjdump nvdisasm
	md5sum build-gpu/bench_gpu build-gpu/bench_gpu_before build-gpu/test_gpu
} >"$L/machine.txt" 2>&1
cat "$L/machine.txt"
(cuobjdump -sass build-gpu/bench_gpu.cubin >"$L/sass_bench.txt" 2>&1
 cuobjdump -sass build-gpu/order_kernels.cubin >"$L/sass_order.txt" 2>&1) &
E="env -u CUDA_LAUNCH_BLOCKING CUDA_MODULE_LOADING=EAGER BENCH_WATCHDOG=60"
for i in $(seq "${ROUNDS:-2}"); do
	for b in ${KINDS:-before ptr after}; do
		x=build-gpu/bench_gpu_$b
		[ "$b" = after ] && x=build-gpu/bench_gpu
		$E timeout 60 "$x" bare >"$L/bench_${b}_$i.txt" 2>&1
		echo "bench $b round $i: exit $?"
	done
done
for b in prof_before prof $(for k in ${KINDS:-}; do
	[ "$k" != before ] && [ -x "build-gpu/bench_gpu_prof_$k" ] && echo "prof_$k"; done); do
	$E timeout 60 "build-gpu/bench_gpu_$b" bare >"$L/bench_$b.txt" 2>&1
	echo "bench $b: exit $?"
done
grep "^| " "$L/bench_after_1.txt" | tail -12
gpu=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader | head -1 | tr 'A-F' 'a-f' | sed 's/^0000\(0000:\)/\1/')
{
	echo "GPU $gpu"
	head -6 "/sys/bus/pci/devices/$gpu/resource"
	grep -n -i -E "system ram|$gpu|pci bus" /proc/iomem | head -40
} >"$L/placement.txt" 2>&1
echo 1024 >/proc/sys/vm/nr_hugepages 2>/dev/null || true
$E TEST_WATCHDOG=150 timeout 160 build-gpu/test_gpu >"$L/test_gpu.tap" 2>"$L/test_gpu.stderr"
echo "test_gpu exit $?"
grep -E "^not ok|passed," "$L/test_gpu.tap"
OUT=$L/controls timeout 240 bash tests/gpu/run-controls.sh >"$L/controls.txt" 2>&1
echo "controls exit $?"
grep -E "^(ok|not ok)" "$L/controls.txt"
wait
cd "$L" && tar czf "$O/round3.tgz" .
