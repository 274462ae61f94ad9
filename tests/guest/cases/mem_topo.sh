#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# mem_topo: what configuration D's topology asks of the memory layer (progs/t_mem_topo.c). NVMe
# c5 and the ivshmem function vrm2 share one IOMMU group (one multi-function device): two handles
# share the one group file, and c5 on the type1 path reads into vrm2's BAR as its peer
# (mem_topo.host.sh finds the data in vrm2.img). c4 on NUMA node 1 gets its host and DMA memory
# from node 1 on the uio and type1 paths while the program runs on node 0. A hugepage behind a
# physical-address LUT moves when asked (and the LUT check sees it); one pinned by vfio does not.
#
# configs: D
# timeout: 180
# shellcheck source=../lib/tb.sh
. /tests/lib/tb.sh

tb_modprobe nvme uio_pci_generic vfio_iommu_type1 vfio-pci
for n in 0 1; do
	echo 16 >/sys/devices/system/node/node$n/hugepages/hugepages-2048kB/nr_hugepages ||
		tap_diag "cannot reserve hugepages on node $n"
done
for bdf in "$TB_C5_BDF" "$TB_VRM2_BDF"; do
	tb_bind "$bdf" vfio-pci || tap_diag "binding $bdf to vfio-pci failed"
done
exec /bin/t_mem_topo
