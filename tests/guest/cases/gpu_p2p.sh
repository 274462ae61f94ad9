#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# gpu_p2p: the P2P placement check (gpu/p2p_check.h) against this kernel's sysfs and /proc/iomem,
# the emulated device memory's BAR (ivshmem BAR 2) standing in for a GPU's BAR window. Its
# negative control: host-memory dma-bufs (vgem; udmabuf on 7.x) imported through the
# dmabuf_import module as if they were device memory must be refused as system RAM. The checks
# are in progs/t_gpu_p2p.c.
#
# configs: A C
# timeout: 120
# shellcheck source=../lib/tb.sh
. /tests/lib/tb.sh

tb_modprobe dmabuf_import || tap_diag "dmabuf_import did not load"
tb_modprobe vgem || tap_diag "vgem did not load"
exec /bin/t_gpu_p2p "$TB_VRAM_BDF"
