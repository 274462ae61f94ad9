#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# pci: the pci/ and vfio type1 layers on the emulated functions. Every NVMe function is bound to
# uio_pci_generic through the pci layer, BAR0 mapped through sysfs, CAP and VS read, bus mastering
# enabled; with an IOMMU (B, C) also bound to vfio-pci and read through the vfio region (mmap and
# pread), which must agree. The ivshmem BAR (emulated device memory) is mapped both ways and shows
# the host's fill pattern. Bad input gets the documented errno. The checks are in progs/t_pci.c.
#
# configs: A B C
# timeout: 120
# shellcheck source=../lib/tb.sh
. /tests/lib/tb.sh

tb_modprobe uio_pci_generic
if [ "$TB_IOMMU" = 1 ]; then
	tb_modprobe vfio-pci
	exec /bin/t_pci --vfio
fi
exec /bin/t_pci
