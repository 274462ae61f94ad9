#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# kmod_iommu: upcie's iommu_map_pa module (dkms/iommu_map_pa, built for this kernel by the test
# bed) and its wrapper upcie/kmod/iommu_map_pa.h. Under the vIOMMU: the ivshmem BAR's pages
# (the stand-in for GPU memory) mapped into the domain of both NVMe controllers on vfio-pci
# inside the IOVA window, the controllers reading into and writing from it; identity mappings of
# a BAR into a kernel DMA domain (ivshmem and c1 on uio_pci_generic standing in for a GPU; a
# target with no driver bound refused)
# with collision, sharing, driver rebinding and peer-to-peer data; refusals; the lifetime
# dma-buf (tb_barbuf's export of the ivshmem BAR): pinned, pages checked, revocation.
# Without an IOMMU: the refusal and PASSTHROUGH answers. The checks are in
# progs/t_kmod_iommu.c; kmod_iommu.host.sh checks the vram and namespace files.
#
# configs: A B C K
# timeout: 240
# shellcheck source=../lib/tb.sh
. /tests/lib/tb.sh

echo 16 >/proc/sys/vm/nr_hugepages
# TAP comes from t_kmod_iommu alone (one plan); setup problems are diagnostics.
tb_modprobe iommu_map_pa || tap_diag "iommu_map_pa did not load"
tb_modprobe dmabuf_import || tap_diag "dmabuf_import did not load"
tb_modprobe vgem || tap_diag "vgem did not load"
# the test exporter of BAR memory (tests/guest/kmod-test/tb_barbuf.c)
insmod /lib/tb-other/tb_barbuf.ko || tap_diag "tb_barbuf did not load"
tb_modprobe nvme uio_pci_generic
if [ "$TB_IOMMU" = 1 ]; then
	[ "$TB_OOT" = 1 ] && tb_modprobe iommufd
	tb_modprobe vfio_iommu_type1 vfio-pci
	for bdf in "$TB_C0_BDF" "$TB_C1_BDF"; do
		tb_bind "$bdf" vfio-pci || tap_diag "binding $bdf to vfio-pci failed ('$(tb_driver "$bdf")')"
	done
else
	tb_bind "$TB_C0_BDF" uio_pci_generic || tap_diag "binding $TB_C0_BDF to uio_pci_generic failed"
fi
tap_diag "$(dmesg | grep -m1 'iommu_map_pa: version')"
exec /bin/t_kmod_iommu "$TB_C0_BDF" "$TB_C1_BDF" "$TB_VRAM_BDF"
