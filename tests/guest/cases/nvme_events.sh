#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# nvme_events: QEMU's c1 changing beneath upcie's driver (progs/t_nvme_events.c): the
# Asynchronous Event Requests kept from bring-up; SMART / health events raised by an
# over-temperature threshold below QEMU's temperature and by setting QEMU's
# smart_critical_warning through QMP (tools/qmp_hook.py), each handed on with its log page and
# the AER sent again; Format NVM of c1n3 from 512-byte to 4 KiB blocks through the driver
# (revalidated: the old handle refuses I/O, a new one has 4 KiB blocks). nvme_events.host.sh
# checks c1n3.img: zeroed by the format, the 4 KiB-block write where the guest put it. On c3, a
# controller of an NVM subsystem, namespace 2 is detached while reads of it are in flight.
#
# configs: A B C
# devices: subsys qmp
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
exec /bin/t_nvme_events "$path"
