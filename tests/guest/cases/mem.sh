#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# mem: hugepage memory and its physical-address LUT (what a uio driver gives the device), checked
# page by page against pagemap; the unprivileged -EPERM; the "no hugepages" error naming the fix;
# hugetlbfs; a granule-aware heap over it. The checks are in progs/t_mem.c.
#
# configs: A B C
# timeout: 120
# shellcheck source=../lib/tb.sh
. /tests/lib/tb.sh

mkdir -p /dev/hugepages
mount -t hugetlbfs -o pagesize=2M nodev /dev/hugepages
exec /bin/t_mem /dev/hugepages
