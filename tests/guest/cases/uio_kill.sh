#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# uio_kill: a uio driver killed with reads in flight must not leave a device writing into memory
# that went back to the system. NVMe c4 (on NUMA node 1, reads throttled to a few hundred KiB/s)
# on uio_pci_generic; a child brings it up, submits 32 reads of 64 KiB and is killed with
# SIGKILL; the next owner takes every free hugepage of the node, fills them and watches them
# until the last read would have landed. First a raw driver that never opens /dev/uioN (the
# negative control: the late reads land in the watched pages), then upcie_nvme_ctrl_open() on
# the uio path (nothing lands: the kernel turned bus mastering off as the process died, and the
# second open stops the controller the raw driver left running before bus mastering comes on).
# The checks are in progs/t_uio_kill.c.
#
# configs: D
# timeout: 120
# shellcheck source=../lib/tb.sh
. /tests/lib/tb.sh

tb_modprobe uio_pci_generic
for n in 0 1; do
	echo 16 >/sys/devices/system/node/node$n/hugepages/hugepages-2048kB/nr_hugepages ||
		tap_diag "cannot reserve hugepages on node $n"
done
tb_bind "$TB_C4_BDF" uio_pci_generic || tap_diag "binding $TB_C4_BDF to uio_pci_generic failed"
exec /bin/t_uio_kill raw upcie
