#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# nvme_ns: namespaces of other I/O command sets and formats on c1, through upcie's driver: c1n4
# is zoned (1 MiB zones), c1n5 has protection information type 1 in 8 bytes of metadata. The
# checks are in progs/t_nvme_ns.c (command set and zone size found, plain writes refused, zoned
# writes at the write pointer, zoned status named; PI made and checked by the controller with
# PRACT; examples/nvme_driver refuses both namespaces by NSID). nvme_ns.host.sh checks the
# images: the zoned data, the PI tuples QEMU stored, everything else untouched.
#
# configs: A C
# timeout: 200
# shellcheck source=../lib/tb.sh
. /tests/lib/tb.sh

echo 64 >/proc/sys/vm/nr_hugepages
tb_modprobe uio_pci_generic
path=uio
if [ "$TB_IOMMU" = 1 ]; then
	tb_modprobe vfio_iommu_type1 vfio-pci
	path=type1
	[ "$TB_OOT" = 1 ] && tb_modprobe iommufd && path=iommufd
fi
exec /bin/t_nvme_ns "$path"
