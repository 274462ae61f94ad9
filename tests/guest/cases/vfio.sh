#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# vfio: vfio/ and the vfio dmamem constructors on NVMe c0 and the ivshmem "vram" function, both
# bound to vfio-pci. type1 (B, C): one container for both groups, its IOVA ranges, a hugepage
# buffer and an ivshmem BAR slice mapped at allocated IOVAs, NVMe Identify DMA'd into both, MSI-X
# through eventfds, function reset, BAR dma-buf export (-ENOTTY on 6.1; on C the doorbell page of
# the NVMe BAR0 is exported too, and its mmap refused: no doorbell-only mapping). iommufd (C): cdev
# bind/attach of both functions to one IOAS, IOVA ranges, IOAS_MAP (kernel-chosen and fixed
# IOVA), MAP_FILE of a memfd, the PFNMAP refusal, the ivshmem BAR as a vfio dma-buf imported
# with MAP_FILE, what MAP_FILE answers for udmabuf and vgem dma-bufs, and NVMe DMA through it all.
# The checks are in progs/t_vfio.c; vfio.host.sh finds the Identify data in vram.img.
#
# configs: B C
# timeout: 180
# shellcheck source=../lib/tb.sh
. /tests/lib/tb.sh

echo 16 >/proc/sys/vm/nr_hugepages
# TAP comes from t_vfio alone (one plan); setup problems go out as diagnostics, and t_vfio's
# first checks fail if the functions are not bound to vfio-pci.
[ "$TB_OOT" = 1 ] && tb_modprobe iommufd
tb_modprobe vfio_iommu_type1 vfio-pci
tb_modprobe vgem || true
for bdf in "$TB_C0_BDF" "$TB_VRAM_BDF"; do
	tb_bind "$bdf" vfio-pci || tap_diag "binding $bdf to vfio-pci failed (driver '$(tb_driver "$bdf")')"
done
exec /bin/t_vfio "$TB_C0_BDF" "$TB_VRAM_BDF"
