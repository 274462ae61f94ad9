#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# nvme_faults: the user-space NVMe driver against the faulty controller c2: media errors from
# QEMU's blkdebug on c2n1 (a bad read sector and a bad write sector: -EIO with the status QEMU
# posts, the failed write leaves the image alone), slow commands from QEMU's throttling on c2n2
# (a late completion after an Abort QEMU does not perform; a synchronous read that does not end
# within the abort timeout resets the controller and no buffer changes after its request ended),
# and a soak on c2n1 (random reads, writes, flushes, bad sectors, resets, short timeouts; every
# request ends exactly once, known data verified). The checks are in progs/t_nvme_faults.c;
# nvme_faults.host.sh checks the c2n1 image. The soak lasts tb_soak seconds (kernel command
# line, UPCIE_TESTBED_APPEND="tb_soak=N"; default 20).
#
# configs: A B
# devices: faulty
# timeout: 600
# shellcheck source=../lib/tb.sh
. /tests/lib/tb.sh

echo 64 >/proc/sys/vm/nr_hugepages
tb_modprobe nvme uio_pci_generic
path=uio
if [ "$TB_IOMMU" = 1 ]; then
	tb_modprobe vfio_iommu_type1 vfio-pci
	path=type1
fi
exec /bin/t_nvme_faults "$path" "${TB_SOAK:-20}"
