#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# kmod_dmabuf: upcie's dmabuf_import module (dkms/dmabuf_import, built for this kernel by the test
# bed) and its wrapper upcie/kmod/dmabuf_import.h. vgem (6.1, 7.x) and udmabuf (7.x) buffers:
# the scatter list equals pagemap, LUT dmamem, handles, capacity, refusals, file ownership,
# unload while attached, the NVMe c0 as named importer (refused under nvme and vfio-pci, IOVAs
# under the vIOMMU, removed while attached), and c0 on uio_pci_generic reading into / writing
# from an imported buffer through its LUT. The checks are in progs/t_kmod_dmabuf.c;
# kmod_dmabuf.host.sh finds the Write in c0n1.img.
#
# configs: A B C K
# timeout: 240
# shellcheck source=../lib/tb.sh
. /tests/lib/tb.sh

echo 16 >/proc/sys/vm/nr_hugepages
# TAP comes from t_kmod_dmabuf alone (one plan); setup problems are diagnostics, and the
# program's own checks fail when a module is missing.
tb_modprobe dmabuf_import || tap_diag "dmabuf_import did not load"
tb_modprobe vgem || tap_diag "vgem did not load"
tb_modprobe nvme uio_pci_generic
if [ "$TB_IOMMU" = 1 ]; then
	[ "$TB_OOT" = 1 ] && tb_modprobe iommufd
	tb_modprobe vfio_iommu_type1 vfio-pci
fi
tap_diag "$(dmesg | grep -m1 'dmabuf_import: version')"
exec /bin/t_kmod_dmabuf "$TB_C0_BDF" "$TB_VRAM_BDF"
