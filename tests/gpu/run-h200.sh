#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Run the GPU tests and benchmarks on a CUDA machine (an H200), from the repository root.
# Uses binaries in build-gpu/ when they run here, else builds them with nvcc. Writes logs to
# $OUT (or build-gpu/out). Usage: tests/gpu/run-h200.sh [test] [bench] [bench-parts...]
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-build-gpu/out}
mkdir -p "$out"
parts=${*:-test bench}
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
build() {
	local f=$1
	"$nvcc" -std=c++17 -O2 -arch=sm_90 -Iinclude -Itests/unit "tests/gpu/$f.cu" -o "build-gpu/$f" \
		-lcuda -lpthread
}
{
	date -u
	uname -r
	nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current,clocks.sm --format=csv
	nvidia-smi -q -d memory | grep -A3 -E 'BAR1|FB Memory' | head -12
	ls /dev/dmabuf_import 2>&1
	grep -E 'HugePages_(Total|Free)|Hugepagesize' /proc/meminfo
} >"$out/machine.txt" 2>&1
cat "$out/machine.txt"
mkdir -p build-gpu
for f in test_gpu test_gpu_choice bench_gpu; do
	if [ ! -x "build-gpu/$f" ] || ! ldd "build-gpu/$f" >/dev/null 2>&1; then
		build "$f" || echo "build of $f failed"
	fi
done
if [ ! -x build-gpu/bench_gpu_store4 ] || [ ! -x build-gpu/bench_gpu_scfence ]; then
	bash tests/gpu/build-variants.sh || echo "build of the variants failed"
fi
# Hugepages for the host heap (the provider falls back to plain pages without them).
echo 1024 >/proc/sys/vm/nr_hugepages 2>/dev/null || true
grep HugePages_Free /proc/meminfo
case " $parts " in *" test "*)
	env -u CUDA_LAUNCH_BLOCKING CUDA_MODULE_LOADING=EAGER TEST_WATCHDOG=100 timeout 110 build-gpu/test_gpu 2>"$out/test_gpu.stderr" | tee "$out/test_gpu.tap"
	echo "test_gpu exit: ${PIPESTATUS[0]}"
	tail -20 "$out/test_gpu.stderr"
	env -u CUDA_VISIBLE_DEVICES timeout 60 build-gpu/test_gpu_choice 2>"$out/test_gpu_choice.stderr" | tee "$out/test_gpu_choice.tap"
	echo "test_gpu_choice exit: ${PIPESTATUS[0]}"
	;;
esac
case " $parts " in *" bench "*)
	bparts=$(echo " $parts " | sed 's/ test / /; s/ bench / /')
	export BENCH_WATCHDOG=60
	env -u CUDA_LAUNCH_BLOCKING CUDA_MODULE_LOADING=EAGER timeout 70 build-gpu/bench_gpu $bparts 2>&1 | tee "$out/bench_gpu.txt"
	env -u CUDA_LAUNCH_BLOCKING CUDA_MODULE_LOADING=EAGER timeout 30 build-gpu/bench_gpu_store4 hostsq 2>&1 | tee "$out/bench_gpu_store4.txt"
	env -u CUDA_LAUNCH_BLOCKING CUDA_MODULE_LOADING=EAGER timeout 30 build-gpu/bench_gpu_scfence qd32 2>&1 | tee "$out/bench_gpu_scfence.txt"
	env -u CUDA_LAUNCH_BLOCKING CUDA_MODULE_LOADING=EAGER timeout 30 build-gpu/bench_gpu mirrorlat 2>&1 | tee "$out/bench_gpu_mirrorlat2.txt"
	;;
esac
