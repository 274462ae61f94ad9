#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
#
# served_vf (host side): what the VF clients wrote: c7n1 holds vfa's pattern at LBA 2048 (64 KiB,
# uid 1000 through VF 1), c7n2 vfb's at LBA 4096 (uid 1001 through VF 2); the rest of each image
# is the test bed's fill.
set -u
# shellcheck source=../lib/tb.sh
. "$TB_LIB/tb.sh"

tb_pat_check "c7n1 holds uid 1000's 64 KiB at LBA 2048" "$(tb_img c7n1)" "$(tb_tag vfa)" \
	$((2048 * 512)) 65536
tb_pat_check "c7n2 holds uid 1001's 64 KiB at LBA 4096" "$(tb_img c7n2)" "$(tb_tag vfb)" \
	$((4096 * 512)) 65536
tb_pat_check "c7n1 past it is untouched" "$(tb_img c7n1)" "$(tb_tag c7n1)" $((2176 * 512)) 1048576
tap_done
