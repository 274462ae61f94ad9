#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# uring_dmabuf: io_uring with dma-buf registered buffers (include/upcie/uring/) through the
# kernel's nvme driver. On the stock kernels (A: 6.1, C: 7.x) the probe must answer "not
# supported" and the table refuse; the rest is skipped with the reason. On U (the 7.x kernel with
# the io_uring dma-buf series, testbed.sh build-iouring): udmabuf writes and reads of c0n1, a
# vfio-pci BAR dma-buf of the ivshmem "VRAM" read and written peer to peer (through the host
# bridge, and through a PCIe switch: c6 and vrm3 under one switch), the refusals
# (in-flight unregister, another file, vectored, unaligned, full table), the IOMMU rule (a
# udmabuf refused, a loop device -ENODEV) and the negative control of the in-flight rule
# (progs/t_uring.c). uring_dmabuf.host.sh checks c0n1.img and vram.img.
#
# configs: A C U V
# timeout: 300
# The series' nvme driver syncs the dma-buf's addresses with dma_sync_single_for_device(), which
# the exporter mapped as a scatter list (udmabuf: dma_map_sgtable for the NVMe): DMA-API
# debugging on U reports it once. A defect of the series, not of this case (docs/guide-iouring.md).
# dmesg-allow: WARNING: at check_sync[+]
# shellcheck source=../lib/tb.sh
. /tests/lib/tb.sh

if [ "$TB_CONFIG" != U ] && [ "$TB_CONFIG" != V ]; then
	exec /bin/t_uring /dev/null /dev/null
fi
tb_modprobe nvme || tap_diag "nvme did not load"
tb_modprobe dmabuf_import iommu_map_pa || tap_diag "upcie's modules did not load"
# a block device that is not NVMe, for the IOMMU rule's -ENODEV
dd if=/dev/zero of=/tmp/loop.img bs=1M count=4 2>/dev/null
losetup /dev/loop0 /tmp/loop.img && export TB_LOOP=/dev/loop0
tb_modprobe vfio_iommu_type1 vfio-pci
tb_bind "$TB_VRAM_BDF" vfio-pci || tap_diag "binding $TB_VRAM_BDF to vfio-pci failed"
# c6 and vrm3 behind one PCIe switch: the same transfers through the switch
if [ -n "${TB_VRM3_BDF:-}" ]; then
	tb_bind "$TB_VRM3_BDF" vfio-pci || tap_diag "binding $TB_VRM3_BDF to vfio-pci failed"
	if d6=$(tb_blockdev c6n1); then
		export TB_SW_DEV=$d6
	else
		tap_diag "c6n1 did not come up"
	fi
fi
if ! d0=$(tb_blockdev c0n1) || ! d1=$(tb_blockdev c1n1); then
	tap_fail "the kernel's nvme driver brought up c0n1 and c1n1"
	tap_done
	exit 1
fi
exec /bin/t_uring "$d0" "$d1" "$TB_VRAM_BDF"
