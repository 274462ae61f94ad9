#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# nvme: the user-space NVMe driver (nvme/dev.h, nvme/ctrl.h, nvme/ns.h) on both emulated
# controllers and the ivshmem BAR, on every memory path the configuration has: A uio, B vfio
# type1, C vfio type1 and vfio cdev + iommufd. c0 starts under the kernel nvme driver (which
# leaves it enabled and shut down) and is taken from it. Bring-up, Identify, write/read verify
# from one block to 4 MiB in one command (PRP lists chained) and 3 MiB split at MDTS, SGLs, the metadata namespace,
# typed error statuses, flush/write zeroes/DSM/compare, four queue pairs from four threads,
# queue wraps, MSI-X (vfio), shutdown + reset, close + reopen, CMB-resident SQ, Abort, and P2P
# with the ivshmem BAR. The checks are in progs/t_nvme.c; nvme.host.sh checks the namespace
# images and vram.img against what the guest reported.
#
# configs: A B C
# timeout: 400
# shellcheck source=../lib/tb.sh
. /tests/lib/tb.sh

echo 160 >/proc/sys/vm/nr_hugepages
# TAP comes from t_nvme alone (one plan); setup problems go out as diagnostics.
tb_modprobe nvme uio_pci_generic
paths=uio
if [ "$TB_IOMMU" = 1 ]; then
	[ "$TB_OOT" = 1 ] && tb_modprobe iommufd
	tb_modprobe vfio_iommu_type1 vfio-pci
	paths=type1
	[ "$TB_OOT" = 1 ] && paths="type1 iommufd"
fi
tb_bind "$TB_C0_BDF" nvme || tap_diag "binding $TB_C0_BDF to nvme failed"
tb_blockdev c0n1 >/dev/null || tap_diag "the kernel did not bring c0n1 up"
# shellcheck disable=SC2086
exec /bin/t_nvme $paths
