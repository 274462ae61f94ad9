#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
#
# nvme_faults (host side): the write to c2n1's bad sector left the image alone, the write beside
# it landed, and c2n1 outside the soak area (LBA 8000..13119) and c2n2 hold their original
# pattern.
set -u
# shellcheck source=../lib/tb.sh
. "$TB_LIB/tb.sh"

check() { # DESC FILE TAG OFFSET LEN
	local out
	if out=$("$TB_PAT" check "$2" "$3" "$4" "$5" 2>&1); then
		tap_ok "$1"
	else
		tap_fail "$1" "$out"
	fi
}

img=$(tb_img c2n1)
tag=$(tb_tag c2n1)
size=$(stat -c %s "$img")
w=$(tb_guest_info c2n1_werr)
if [ -n "$w" ]; then
	IFS=+ read -r off len <<<"$w"
	check "c2n1.img: the failed write to the bad sector left it alone" "$img" "$tag" "$off" "$len"
else
	tap_fail "guest reported the bad write sector"
fi
w=$(tb_guest_info c2n1_write)
if [ -n "$w" ]; then
	IFS=+ read -r off len wtag <<<"$w"
	check "c2n1.img holds the write beside the bad sectors ('$wtag' at $off)" "$img" "$wtag" "$off" "$len"
	check "c2n1.img before it is untouched" "$img" "$tag" 0 "$off"
	check "c2n1.img from it to the soak area is untouched" "$img" "$tag" $((off + len)) $((8000 * 512 - off - len))
else
	tap_fail "guest reported its write beside the bad sectors"
fi
check "c2n1.img after the soak area is untouched" "$img" "$tag" $((13120 * 512)) $((size - 13120 * 512))
img=$(tb_img c2n2)
check "c2n2.img is untouched (reads only)" "$img" "$(tb_tag c2n2)" 0 "$(stat -c %s "$img")"
soak=$(tb_guest_info soak)
if [ -n "$soak" ]; then
	tap_ok "guest soak figures: $soak"
else
	tap_fail "guest reported its soak figures"
fi
tap_done
