#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# hip_mirror: the HIP completion mirror (gpuq/cqmirror_hip.h) against the emulated NVMe c0, with
# CPU threads playing the resident kernel's wavefronts: the controller completes into a CQ in the
# ivshmem BAR ("VRAM", peer to peer) beside the data, the mirror copies each entry into the host
# CQ the CPU's queue pair reads. One, then three queues at once, a wrapping depth-8 queue, a stop
# while completions still arrive, a stuck wavefront (stop timing out, retried), an attach no
# wavefront takes up; data written from and read back into VRAM, compared. A uio, B vfio type1,
# C vfio cdev + iommufd. hip_mirror.host.sh checks c0n1.img and vram.img. No GPU is involved.
#
# configs: A B C
# timeout: 300
# shellcheck source=../lib/tb.sh
. /tests/lib/tb.sh

echo 64 >/proc/sys/vm/nr_hugepages
tb_modprobe uio_pci_generic
path=uio
if [ "$TB_IOMMU" = 1 ]; then
	[ "$TB_OOT" = 1 ] && tb_modprobe iommufd
	tb_modprobe vfio_iommu_type1 vfio-pci
	path=type1
	[ "$TB_OOT" = 1 ] && path=iommufd
fi
exec /bin/t_hip_mirror "$path"
