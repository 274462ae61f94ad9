#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Ordering points of the completion paths, checked in the PTX that nvcc emits for
# tests/gpu/order_kernels.cu (sm_90): in each reap, a completion-queue load comes first, then the
# acquire (GPU-resident queue pair: fence.acquire.sys; portable core in device code: the system
# fence, membar.sys / fence.sc.sys), then the first load of a caller's data or store of a result
# (the caller's plain ld.global, or the state the reap writes). Then it proves it can fail: the same
# kernels built with the fence removed (-DUPCIE_NVME_GQP_ACQUIRE()= and
# -DUPCIE_NVME_PORT_DMA_RMB()=, what the H200 stale-read control runs) must fail the check. The SASS
# these become on the H200 is in docs/results/gpu-queues.md. Also: the CQE re-load after the
# acquire (and its control), and that tests/gpu/check-nc-ptx.sh reports ld.global.nc after a reap
# in a user kernel and nowhere else. TAP; SKIP without nvcc.
set -uo pipefail
cd "$(dirname "$0")/../.."
nvcc=${NVCC:-$(command -v nvcc || true)}
[ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
if [ -z "$nvcc" ]; then
	echo "ok 1 # SKIP nvcc not found"
	echo "1..1"
	exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=0
fail=0

# fn PTX NAME: the body of one entry
fn() {
	awk -v f="$2" '$0 ~ "^.visible .entry " f "\\(" { on = 1 } on { print } on && /^}/ { exit }' "$1"
}

# ordered FILE FENCE: 0 when a CQ load (ld.volatile) precedes the first FENCE, and the first plain
# load or store (global or generic) after the CQ load does not come before that fence
ordered() {
	awk -v fence="$2" '
		/ld\.volatile\./ && !cq { cq = NR }
		cq && index($0, fence) && !fe { fe = NR }
		cq && NR > cq && !use && /[ \t](ld|st)\.(global\.)?[usbv][0-9]/ { use = NR }
		END { exit !(cq && fe && (!use || fe < use)) }' "$1"
}

check() { # LABEL PTX NAME FENCE
	n=$((n + 1))
	fn "$2" "$3" >"$tmp/f"
	if [ -s "$tmp/f" ] && ordered "$tmp/f" "$4"; then
		echo "ok $n - $1"
		return 0
	fi
	echo "not ok $n - $1"
	return 1
}

build() { # OUT [flags]
	local out=$1
	shift
	"$nvcc" -std=c++17 -arch=sm_90 -ptx -Iinclude "$@" tests/gpu/order_kernels.cu -o "$out" \
		>"$out.log" 2>&1 || { sed 's/^/# /' "$out.log"; return 1; }
}

if ! build "$tmp/ok.ptx"; then
	echo "not ok 1 - tests/gpu/order_kernels.cu compiles"
	echo "1..1"
	exit 1
fi
check "gqp reap: CQ load, fence.acquire.sys, then the caller's loads" "$tmp/ok.ptx" \
	upcie_ordchk_gqp_reap fence.acquire.sys || fail=$((fail + 1))
check "gqp reap_each: CQ load, fence.acquire.sys, then the callback's loads" "$tmp/ok.ptx" \
	upcie_ordchk_gqp_reap_each fence.acquire.sys || fail=$((fail + 1))
check "core reap in device code: CQ load, system fence, then the rest" "$tmp/ok.ptx" \
	upcie_ordchk_core_reap membar.sys || fail=$((fail + 1))

# The control: with the fences removed the same check must fail.
n=$((n + 1))
if build "$tmp/ctl.ptx" '-DUPCIE_NVME_GQP_ACQUIRE()=' '-DUPCIE_NVME_PORT_DMA_RMB()='; then
	c=0
	fn "$tmp/ctl.ptx" upcie_ordchk_gqp_reap >"$tmp/f" && ordered "$tmp/f" fence.acquire.sys && c=$((c + 1))
	fn "$tmp/ctl.ptx" upcie_ordchk_gqp_reap_each >"$tmp/f" && ordered "$tmp/f" fence.acquire.sys && c=$((c + 1))
	fn "$tmp/ctl.ptx" upcie_ordchk_core_reap >"$tmp/f" && ordered "$tmp/f" membar.sys && c=$((c + 1))
	if [ "$c" = 0 ]; then
		echo "ok $n - control: with the fences removed, all three checks fail"
	else
		echo "not ok $n - control: with the fences removed, $c of 3 checks still pass"
		fail=$((fail + 1))
	fi
else
	echo "not ok $n - control build"
	fail=$((fail + 1))
fi
# The CQE re-load: after the acquire, the reap loads the consumed entries again (a 16-byte load
# after the fence); its control (-DUPCIE_NVME_GQP_CQE_RELOAD=0) has none.
reload() { # PTX NAME
	fn "$1" "$2" | awk '/fence\.acquire\.sys/ && !fe { fe = NR }
		fe && NR > fe && /ld(\.volatile)?(\.global)?\.v4\.u32/ { r = 1 }
		END { exit !r }'
}
n=$((n + 1))
if reload "$tmp/ok.ptx" upcie_ordchk_gqp_reap && reload "$tmp/ok.ptx" upcie_ordchk_gqp_reap_each; then
	echo "ok $n - gqp reap and reap_each: the CQ entries loaded again after fence.acquire.sys"
else
	echo "not ok $n - gqp reap and reap_each: the CQ entries loaded again after fence.acquire.sys"
	fail=$((fail + 1))
fi
n=$((n + 1))
if build "$tmp/nore.ptx" -DUPCIE_NVME_GQP_CQE_RELOAD=0 && ! reload "$tmp/nore.ptx" upcie_ordchk_gqp_reap &&
	! reload "$tmp/nore.ptx" upcie_ordchk_gqp_reap_each; then
	echo "ok $n - control: without the re-load the check fails"
else
	echo "not ok $n - control: without the re-load the check still passes (or the build failed)"
	fail=$((fail + 1))
fi

# The read-only-load debug check: it reports the user kernel reading the payload through __ldg
# after a reap, and none of the library's own paths.
n=$((n + 1))
rep=$(bash tests/gpu/check-nc-ptx.sh "$tmp/ok.ptx" | grep '^  ' | sed 's/^  //; s/:.*//' | sort -u)
if [ "$rep" = upcie_ordchk_nc_user ]; then
	echo "ok $n - check-nc-ptx.sh reports ld.global.nc after a reap in upcie_ordchk_nc_user only"
else
	echo "not ok $n - check-nc-ptx.sh reported: ${rep:-nothing}"
	fail=$((fail + 1))
fi
echo "1..$n"
[ "$fail" -eq 0 ]
