#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# hip_bridge: the HIP doorbell bridge and completion relay (gpuq/bridge_hip.h) against the
# emulated NVMe c0, with CPU threads playing the GPU on a consumer RDNA GPU's memory layout and
# running the HIP device layer's code (gpuq/gqp_hip.h compiled as C): one I/O, 2 and 4 queues at
# once, 8 rounds on one queue, a wrapping batch across relaunches (the stale-doorbell sequence),
# doorbells written only on change (the poller's trace of MMIO writes checked against what the
# launches rang), data read back and compared. A uio, B vfio type1, C vfio cdev + iommufd.
# hip_bridge.host.sh checks c0n1.img for every range the guest wrote. No GPU is involved.
#
# configs: A B C
# timeout: 240
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
exec /bin/t_hip_bridge "$path"
