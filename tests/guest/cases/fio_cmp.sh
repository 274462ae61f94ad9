#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# fio_cmp: the same fio jobs, in the same boot, on the same emulated controller (c0, namespace
# c0n1): first through the kernel nvme driver (loaded with poll_queues=2) with fio's io_uring
# engine (interrupts), io_uring with hipri (IOPOLL on the poll queues) and libaio, then through
# upcie's fio engine after the controller is bound to uio_pci_generic (A) or vfio-pci (B: type1,
# C: iommufd). The job files are tools/fio/jobs/*.fio (in /usr/share/upcie/fio in the guest):
# 4 KiB random reads over the whole namespace, QD1 for latency (completion latency p50/p99 from
# fio), QD32 for IOPS, each job time-based (TB_FIO_RUNTIME seconds, default 4). Figures, not a
# timed test: the checks are that every job ran without an error and reported its numbers;
# "# tb: fio_<engine>_<figure>=" lines carry them (docs/results/fio-guest.md).
#
# configs: A B C
# timeout: 300
# shellcheck source=../lib/tb.sh
. /tests/lib/tb.sh

ENGINE=/usr/lib/upcie/upcie_fio.so
RT=${TB_FIO_RUNTIME:-4}
if ! command -v fio >/dev/null 2>&1 || [ ! -f "$ENGINE" ]; then
	tap_skip "fio comparison" "fio not built (tests/guest/testbed.sh build-fio)"
	tap_done
	exit 0
fi
echo 64 >/proc/sys/vm/nr_hugepages
modprobe nvme poll_queues=2 || tap_fail "modprobe nvme poll_queues=2"
tb_user_path
tb_bind "$TB_C1_BDF" "$drv" # c1 out of the way: one controller, one kernel block device
if ! dev=$(tb_blockdev c0n1); then
	tap_fail "the kernel driver brought c0n1 up"
	tap_done
	exit 1
fi
tap_diag "fio $(fio --version); $dev; poll queues: $(cat /sys/module/nvme/parameters/poll_queues 2>/dev/null)"

JOBS=/usr/share/upcie/fio
# job LABEL QD JOBFILE [VAR=VALUE...] : one job file of tools/fio/jobs; terse v3: 5 error,
# 8 read IOPS, 18+6 clat p50, 18+12 p99
job() {
	_l=$1 _qd=$2 _jf=$3
	shift 3
	_out=$(env QD="$_qd" RUNTIME="$RT" "$@" fio --minimal "$JOBS/$_jf" 2>&1)
	_rc=$?
	_line=$(printf '%s\n' "$_out" | grep '^3;' | tail -n 1)
	_err=$(printf '%s' "$_line" | cut -d';' -f5)
	_iops=$(printf '%s' "$_line" | cut -d';' -f8)
	_p50=$(printf '%s' "$_line" | cut -d';' -f24 | sed 's/.*=//')
	_p99=$(printf '%s' "$_line" | cut -d';' -f30 | sed 's/.*=//')
	if [ "$_rc" = 0 ] && [ "$_err" = 0 ] && [ "${_iops:-0}" -gt 0 ]; then
		tap_ok "$_l QD$_qd ($_jf): $_iops IOPS, clat p50 $_p50 us, p99 $_p99 us"
		tap_info "fio_${_l}_qd${_qd}_iops" "$_iops"
		tap_info "fio_${_l}_qd${_qd}_p50_us" "$_p50"
		tap_info "fio_${_l}_qd${_qd}_p99_us" "$_p99"
	else
		tap_fail "$_l QD$_qd ($_jf)" "exit $_rc, error '$_err'" "$(printf '%s\n' "$_out" | tail -n 8)"
	fi
}

for qd in 1 32; do
	job uring "$qd" kernel-io_uring.fio FILE="$dev"
	job uring_poll "$qd" kernel-io_uring-poll.fio FILE="$dev"
	job libaio "$qd" kernel-libaio.fio FILE="$dev"
done
tb_bind "$TB_C0_BDF" "$drv" || tap_fail "c0 bound to $drv"
C0=$(echo "$TB_C0_BDF" | tr ':' '.')
for qd in 1 32; do
	job upcie "$qd" upcie.fio ENGINE="$ENGINE" FILE="$C0/1" UPCIE_PATH="$path"
done
tap_done
