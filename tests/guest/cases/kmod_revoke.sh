#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# kmod_revoke: revocation in the dmabuf_import module. A vfio-pci BAR dma-buf of the ivshmem
# "VRAM" attached for the NVMe c0 on uio_pci_generic under the vIOMMU; c0 Reads into it, vfio
# revokes the buffer mid-DMA (memory decoding off), the BAR is enabled again and c0 Reads into
# the revoked addresses: nothing may land after the revocation point, the handle answers ESTALE,
# a fresh attachment works, closing the vfio device revokes too, and with the module's stop
# removed (negative control) the revocation does not complete. The checks are in
# progs/t_kmod_revoke.c; kmod_revoke.host.sh checks vram.img.
#
# configs: C K
# timeout: 240
# dmesg-allow: DMAR: \[DMA (Read|Write)
# dmesg-allow: DMAR: DRHD: handling fault
# shellcheck source=../lib/tb.sh
. /tests/lib/tb.sh

tb_modprobe dmabuf_import || tap_diag "dmabuf_import did not load"
tb_modprobe vgem || tap_diag "vgem did not load"
tb_modprobe nvme uio_pci_generic
[ "$TB_OOT" = 1 ] && tb_modprobe iommufd
tb_modprobe vfio_iommu_type1 vfio-pci
tb_bind "$TB_C0_BDF" uio_pci_generic || tap_diag "binding $TB_C0_BDF to uio_pci_generic failed"
tb_bind "$TB_VRAM_BDF" vfio-pci || tap_diag "binding $TB_VRAM_BDF to vfio-pci failed"
exec /bin/t_kmod_revoke "$TB_C0_BDF" "$TB_VRAM_BDF"
