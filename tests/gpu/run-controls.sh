#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Negative controls of the GPU ordering tests, for a CUDA machine (an H200), from the
# repository root: test_gpu built with one ordering rule removed must fail the test that guards
# that rule. Builds into build-gpu/ what is not there yet (nvcc), runs each control and prints TAP:
# "ok" when the control was caught (its guarding test reported "not ok").
#   acquire  -DUPCIE_NVME_GQP_ACQUIRE()=       no acquire fence in the GPU queue pair's reap:
#            the stale-read tests against the warp and the copy-engine controllers must fail
#   rmb      -DUPCIE_NVME_PORT_DMA_RMB()=      no system fence after the core's phase-tag load:
#            the core's stale-read test must fail
#   clear    -DUPCIE_NVME_GQP_TEST_CLEAR_UNORDERED  the CQ cleared by cuMemsetD8 on the legacy
#            stream, not waited for: the CQ clear test must fail
#   dacq     -DUPCIE_NVME_GQP_DATA_ACQUIRE()=  no acquire in readers outside the owning warp
#            (data_acquire, signal_wait): the other-block, ringing-warp and CPU-told reader tests
#            must fail (the same-block reader shares the owner's L1, which the owner's reap
#            invalidates on the H200: the "acquire" control, which removes both, covers it)
#   reload   -DUPCIE_NVME_GQP_CQE_RELOAD=0  no re-load of dw0..dw2 after the acquire: the
#            queue-level tear test must fail
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-build-gpu/out}
mkdir -p "$out" build-gpu
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
build() { # NAME FLAG
	[ -x "build-gpu/$1" ] && ldd "build-gpu/$1" >/dev/null 2>&1 && return 0
	"$nvcc" -std=c++17 -O2 -arch=sm_90 -Iinclude -Itests/unit "$2" tests/gpu/test_gpu.cu \
		-o "build-gpu/$1" -lcuda -lpthread
}
n=0
fail=0
control() { # NAME FLAG GROUPS PATTERN...
	local name=$1 flag=$2 groups=$3 log="$out/control_$1.tap" p miss=0
	shift 3
	n=$((n + 1))
	if ! build "test_gpu_ctl_$name" "$flag"; then
		echo "not ok $n - control $name: build failed"
		fail=$((fail + 1))
		return
	fi
	env -u CUDA_LAUNCH_BLOCKING CUDA_MODULE_LOADING=EAGER TEST_WATCHDOG=60 timeout 70 \
		"build-gpu/test_gpu_ctl_$name" $groups >"$log" 2>&1
	for p in "$@"; do
		grep -q "^not ok .*$p" "$log" || miss=$((miss + 1))
	done
	if [ "$miss" = 0 ]; then
		echo "ok $n - control $name ($flag) caught:"
	else
		echo "not ok $n - control $name ($flag): $miss guarding test(s) passed without the rule"
		fail=$((fail + 1))
	fi
	for p in "$@"; do # the guarding tests' lines (fixed strings: the names hold parentheses)
		grep -E "^(not )?ok " "$log" | grep -F -- "$p"
	done | sed 's/^/#   /'
}
control acquire '-DUPCIE_NVME_GQP_ACQUIRE()=' "stale ce readers" \
	"stale read, GPU queue pair, warp controller" \
	"stale read, GPU queue pair, copy-engine controller" \
	"reader in the owner's block (__syncthreads, data_acquire), warp controller" \
	"reader in the owner's block (__syncthreads, data_acquire), copy-engine controller"
control rmb '-DUPCIE_NVME_PORT_DMA_RMB()=' "stale" "stale read, core queue pair"
control clear -DUPCIE_NVME_GQP_TEST_CLEAR_UNORDERED "clear" "CQ clear at creation ordered"
control dacq '-DUPCIE_NVME_GQP_DATA_ACQUIRE()=' "readers" \
	"reader in another block (signal, signal_wait), warp controller" \
	"reader in another block (signal, signal_wait), copy-engine controller" \
	"ringing warp told by a producer block (signal, signal_wait), warp controller" \
	"ringing warp told by a producer block (signal, signal_wait), copy-engine controller" \
	"resident kernel told by the CPU"
control reload -DUPCIE_NVME_GQP_CQE_RELOAD=0 "tear" "re-load after the acquire"
echo "1..$n"
[ "$fail" -eq 0 ]
