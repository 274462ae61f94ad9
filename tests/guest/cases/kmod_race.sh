#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# kmod_race: requests of upcie's kernel modules against their teardown, in loops, from threads
# and processes: dmabuf_import's ATTACH/GET/DETACH against guessed handles, driver changes and
# removal of the named function, and dying processes; iommu_map_pa's MAP/UNMAP/TRANSLATE into a
# shared domain against guessed UNMAP and MAP_BAR under driver changes, against the vfio
# device closing and reopening, UNSET_CONTAINER and resets, and dying processes. The checks are
# in progs/t_kmod_race.c; the test bed fails the case on any kernel splat (configuration K:
# KASAN, lockdep, DMA-API debugging).
#
# configs: A B C K
# timeout: 300
# shellcheck source=../lib/tb.sh
. /tests/lib/tb.sh

echo 16 >/proc/sys/vm/nr_hugepages
tb_modprobe iommu_map_pa || tap_diag "iommu_map_pa did not load"
tb_modprobe dmabuf_import || tap_diag "dmabuf_import did not load"
tb_modprobe vgem || tap_diag "vgem did not load"
tb_modprobe uio_pci_generic
if [ "$TB_IOMMU" = 1 ]; then
	[ "$TB_OOT" = 1 ] && tb_modprobe iommufd
	tb_modprobe vfio_iommu_type1 vfio-pci
	for bdf in "$TB_C0_BDF" "$TB_C1_BDF"; do
		tb_bind "$bdf" vfio-pci || tap_diag "binding $bdf to vfio-pci failed ('$(tb_driver "$bdf")')"
	done
fi
exec /bin/t_kmod_race "$TB_C0_BDF" "$TB_C1_BDF" "$TB_VRAM_BDF" 8
