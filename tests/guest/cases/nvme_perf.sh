#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# nvme_perf: figures, not a timed test. 4 KiB random reads on c0 through the kernel nvme driver
# (O_DIRECT pread and io_uring at QD1, libaio and io_uring at QD32), then, in the same boot, on
# the same controller through upcie's driver after taking it from the kernel (QD1 spinning on
# the CQ, QD32 polled; on vfio also sleeping on the CQ's MSI-X eventfd): uio in A, vfio type1 in
# B. progs/t_nvme_perf.c prints the table; the
# checks are only that both sides ran and every read returned the right data.
# docs/results/nvme-guest-perf.md has the figures and how they were taken.
#
# configs: A B
# timeout: 300
# shellcheck source=../lib/tb.sh
. /tests/lib/tb.sh

echo 64 >/proc/sys/vm/nr_hugepages
tb_modprobe nvme uio_pci_generic
path=uio
if [ "$TB_IOMMU" = 1 ]; then
	tb_modprobe vfio_iommu_type1 vfio-pci
	path=type1
fi
tb_bind "$TB_C0_BDF" nvme
if ! dev=$(tb_blockdev c0n1); then
	tap_fail "kernel nvme driver brought c0n1 up"
	tap_done
	exit 1
fi
out=$(/bin/t_nvme_perf --dev "$dev" --bdf "$TB_C0_BDF" --path "$path" \
	--qd1 "${TB_PERF_QD1:-4000}" --qd32 "${TB_PERF_QD32:-20000}" 2>&1)
rc=$?
printf '%s\n' "$out"
tap_is "$rc" 0 "t_nvme_perf ran both sides, every read verified"
keys="kernel_pread_qd1_p50_us kernel_aio_qd32_iops kernel_uring_qd32_iops upcie_qd1_p50_us upcie_qd32_iops"
[ "$path" = uio ] || keys="$keys upcie_irq_qd1_p50_us upcie_irq_qd32_iops"
for k in $keys; do
	v=$(printf '%s\n' "$out" | sed -n "s/^# tb: perf_$k=//p")
	if [ -n "$v" ]; then
		tap_ok "$k = $v"
	else
		tap_fail "$k reported"
	fi
done
tap_done
