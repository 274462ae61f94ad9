#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
#
# nvme_events (host side): c1n3.img after the guest's Format NVM to 4 KiB blocks and its 8 KiB
# write at 4 KiB-block 8: the write is there, and everything before it is zero (the format
# cleared the pattern the test bed wrote; the image had it before the boot).
set -u
# shellcheck source=../lib/tb.sh
. "$TB_LIB/tb.sh"

img=$(tb_img c1n3)
w=$(tb_guest_info format_c1n3)
if [ -n "$w" ]; then
	IFS=+ read -r off len tag <<<"$w"
	tb_pat_check "c1n3.img [$off, +$len) holds the write through the re-opened 4 KiB handle" \
		"$img" "$tag" 0 "$len" "$off"
	if out=$("$TB_PAT" byte "$img" 0 "$off" 0 2>&1); then
		tap_ok "c1n3.img before it is zero: the format reached the medium"
	else
		tap_fail "c1n3.img before it is zero: the format reached the medium" "$out"
	fi
else
	tap_fail "the guest reported its write after the format"
fi
tap_done
