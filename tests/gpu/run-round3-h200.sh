#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# One H200 call for the reader, tear, placement and fenced-path work (docs/results/gpu-queues.md,
# gpu-tests.md): machine facts, the SASS of the reap and of the benchmark kernels (cuobjdump),
# test_gpu (every group), the negative controls (run-controls.sh), the placement facts (BAR1 in
# sysfs and /proc/iomem), then "bare" of bench_gpu_before, bench_gpu, bench_gpu_vreload and
# bench_gpu_noreload in turn, three rounds.
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
	nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current,clocks.sm,clocks.max.sm --format=csv
	nvidia-smi -q -d memory | grep -A3 -E 'BAR1|FB Memory' | head -12
	command -v ncu cuobjdump nvdisasm compute-sanitizer
	id -u
} >"$L/machine.txt" 2>&1
cat "$L/machine.txt"
gpu=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader | head -1 | tr 'A-F' 'a-f' | sed 's/^0000\(0000:\)/\1/')
{
	echo "GPU $gpu"
	cat "/sys/bus/pci/devices/$gpu/resource" 2>&1 | head -6
	grep -n -i -E "system ram|$gpu|pci bus" /proc/iomem | head -40
} >"$L/placement.txt" 2>&1
(cuobjdump -sass build-gpu/order_kernels.cubin >"$L/sass_order.txt" 2>&1
 cuobjdump -sass build-gpu/bench_gpu.cubin >"$L/sass_bench.txt" 2>&1) &
echo 1024 >/proc/sys/vm/nr_hugepages 2>/dev/null || true
E="env -u CUDA_LAUNCH_BLOCKING CUDA_MODULE_LOADING=EAGER"
$E TEST_WATCHDOG=150 timeout 160 build-gpu/test_gpu >"$L/test_gpu.tap" 2>"$L/test_gpu.stderr"
echo "test_gpu exit $?"
grep -E "^not ok|passed," "$L/test_gpu.tap"
OUT=$L/controls timeout 300 bash tests/gpu/run-controls.sh >"$L/controls.txt" 2>&1
echo "controls exit $?"
grep -E "^(ok|not ok)" "$L/controls.txt"
export BENCH_WATCHDOG=60
for i in 1 2 3; do
	for b in before after vreload noreload; do
		x=build-gpu/bench_gpu_$b
		[ "$b" = after ] && x=build-gpu/bench_gpu
		$E timeout 60 "$x" bare >"$L/bench_${b}_$i.txt" 2>&1
	done
done
tail -14 "$L/bench_after_3.txt"
wait
cd "$L" && tar czf "$O/round3.tgz" .
