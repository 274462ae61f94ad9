#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# device run: GPU tests, controls, bench qd and upcie-perf-cuda on the merged tree
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}
mkdir -p build-gpu "$O"
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
md5sum include/upcie/nvme/qpair.h include/upcie/nvme/ctrl.h tools/upcie-perf-cuda.cu > "$O/head.txt"
b() { "$nvcc" -std=c++17 -O2 -arch=sm_90 -Iinclude -Itests/unit "tests/gpu/$1.cu" -o "build-gpu/$1" -lcuda -lpthread > "$O/build-$1.log" 2>&1 || echo "build $1 failed"; }
b test_gpu & b bench_gpu &
"$nvcc" -std=c++17 -O2 -gencode arch=compute_90,code=sm_90 -Iinclude -Xcompiler -Wall,-Wextra,-Werror --Werror all-warnings tools/upcie-perf-cuda.cu -o build-gpu/upcie-perf-cuda -lcuda -lpthread > "$O/build-perf.log" 2>&1 || echo "build perf failed" &
wait
OUT=$O/test timeout 150 bash tests/gpu/run-h200.sh test > "$O/run-test.txt" 2>&1
tail -3 "$O/test/test_gpu.tap"
OUT=$O/controls timeout 200 bash tests/gpu/run-controls.sh > "$O/controls.txt" 2>&1; echo "controls exit $?"; grep -E "^(ok|not ok)" "$O/controls.txt"
export BENCH_WATCHDOG=60
env -u CUDA_LAUNCH_BLOCKING CUDA_MODULE_LOADING=EAGER timeout 60 build-gpu/bench_gpu qd > "$O/bench_qd.txt" 2>&1; tail -8 "$O/bench_qd.txt"
P="env -u CUDA_LAUNCH_BLOCKING CUDA_MODULE_LOADING=EAGER timeout 90 build-gpu/upcie-perf-cuda"
$P --gpu null --json --queues 1,16,64 --qd 1,32,128 --bs 4k --mix 100,0 --time 2 > "$O/perf1.json" 2> "$O/perf1.err"; echo "perf1 exit $?"
$P --gpu null --json --sq-host --queues 1,16,64 --qd 1,32 --bs 4k --mix 100 --time 2 > "$O/perf2.json" 2> "$O/perf2.err"; echo "perf2 exit $?"
$P --gpu null --json --queues 1,16 --qd 32 --bs 128k,1M --pattern rand,seq --time 2 > "$O/perf3.json" 2> "$O/perf3.err"; echo "perf3 exit $?"
$P --gpu null --queues 1,16 --qd 1,32 --bs 4k --mix 100 --time 2 > "$O/perf4.txt" 2> "$O/perf4.err"; echo "perf4 exit $?"; cat "$O/perf4.txt" | head -40
cd "$O" && tar czf /tmp/all.tgz . && rm -rf "$O"/* && mv /tmp/all.tgz "$O/all.tgz"
