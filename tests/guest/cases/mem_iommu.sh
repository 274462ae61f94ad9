#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# mem_iommu: the IOMMU mode stated and checked, and the IOMMU bookkeeping, on NVMe c0
# (progs/t_mem_iommu.c). A: vfio in no-IOMMU mode is refused with a message that says so (a
# SKIP on kernels built without CONFIG_VFIO_NOIOMMU, Debian's among them).
# B, C: uio refused under the translating vIOMMU; the type1 DMA-mapping budget named when it
# runs out; plain memory charged to RLIMIT_MEMLOCK once; memory destroyed after its controller
# was reopened leaves the new mapping at its IOVA alone; bus mastering after VFIO_DEVICE_RESET.
# C: iommufd dmamem at IOVAs from upcie's allocator (at or above 4 GiB, aligned to the page size).
#
# configs: A B C
# timeout: 180
# shellcheck source=../lib/tb.sh
. /tests/lib/tb.sh

echo 32 >/proc/sys/vm/nr_hugepages
tb_modprobe nvme uio_pci_generic
if [ "$TB_IOMMU" = 1 ]; then
	[ "$TB_OOT" = 1 ] && tb_modprobe iommufd
	tb_modprobe vfio_iommu_type1 vfio-pci
	parts=translating
	[ "$TB_OOT" = 1 ] && parts="translating iommufd"
else
	modprobe vfio enable_unsafe_noiommu_mode=1 || tap_diag "modprobe vfio enable_unsafe_noiommu_mode=1 failed"
	if [ ! -e /sys/module/vfio/parameters/enable_unsafe_noiommu_mode ]; then
		# Debian builds vfio without CONFIG_VFIO_NOIOMMU (6.1 and 7.x): the parameter is
		# ignored and vfio-pci's probe fails, so there is no no-IOMMU group to be refused
		# (the refusal itself is a unit test, test_vfio_sysfs)
		tap_skip "no-IOMMU vfio: the type1 path is refused with a message" \
			"this kernel's vfio has no no-IOMMU mode (CONFIG_VFIO_NOIOMMU is not set)"
		tap_done
		exit $?
	fi
	tb_modprobe vfio-pci
	tb_bind "$TB_C0_BDF" vfio-pci || tap_diag "binding $TB_C0_BDF to vfio-pci (no-IOMMU) failed"
	parts=noiommu
fi
# shellcheck disable=SC2086
exec /bin/t_mem_iommu $parts
