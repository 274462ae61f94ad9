#!/usr/bin/env bash
# device run: GPU tests, controls, bench qd and the CUDA example against the null controller
set -uo pipefail
cd "$(dirname "$0")/../../../.."   # the repository root
O=${OUT:-/tmp/out}
mkdir -p build-gpu "$O"
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
md5sum include/upcie/nvme/qpair.h include/upcie/nvme/prp.h include/upcie/base/compiler.h examples/gpu_read_cuda.cu > "$O/head.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$O/machine.txt" 2>&1; nvcc --version | tail -2 >> "$O/machine.txt"
b() { "$nvcc" -std=c++17 -O2 -arch=sm_90 -Iinclude -Itests/unit "tests/gpu/$1.cu" -o "build-gpu/$1" -lcuda -lpthread > "$O/build-$1.log" 2>&1 || echo "build $1 failed"; }
b test_gpu & b bench_gpu &
"$nvcc" -std=c++17 -O2 -arch=sm_90 -Iinclude -Xcompiler -Wall,-Wextra,-Werror --Werror all-warnings examples/gpu_read_cuda.cu -o build-gpu/gpu_read_cuda -lcuda -lpthread > "$O/build-example.log" 2>&1 || echo "build example failed" &
wait
OUT=$O/test timeout 150 bash tests/gpu/run-h200.sh test > "$O/run-test.txt" 2>&1
tail -3 "$O/test/test_gpu.tap"
OUT=$O/controls timeout 200 bash tests/gpu/run-controls.sh > "$O/controls.txt" 2>&1; echo "controls exit $?"; grep -E "^(ok|not ok)" "$O/controls.txt"
export BENCH_WATCHDOG=60
env -u CUDA_LAUNCH_BLOCKING CUDA_MODULE_LOADING=EAGER timeout 60 build-gpu/bench_gpu qd > "$O/bench_qd.txt" 2>&1; tail -8 "$O/bench_qd.txt"
for i in 1 2; do timeout 120 build-gpu/gpu_read_cuda --null > "$O/example$i.txt" 2>&1; echo "example run $i exit $?"; done
cat "$O/example1.txt" | head -60
cd "$O" && tar czf /tmp/all.tgz . && rm -rf "$O"/* && mv /tmp/all.tgz "$O/all.tgz"
