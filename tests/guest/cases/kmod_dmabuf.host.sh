#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
#
# kmod_dmabuf (host side): the controller wrote the imported dma-buf's contents, which the guest
# filled with its pattern, into c0n1.img at the offset the guest reported; the rest of c0n1.img
# and every other backing file are untouched.
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

img=$(tb_img c0n1)
size=$(stat -c %s "$img")
w=$(tb_guest_info write_c0n1)
if [ -z "$w" ]; then
	tap_fail "guest reported its write to c0n1"
	w="0+0+none"
fi
IFS=+ read -r off len tag <<<"$w"
if [ "$len" != 0 ]; then
	check "c0n1.img holds the dma-buf's pattern '$tag' at [$off, +$len)" "$img" "$tag" "$off" "$len"
fi
check "c0n1.img before it is untouched" "$img" "$(tb_tag c0n1)" 0 "$off"
check "c0n1.img after it is untouched" "$img" "$(tb_tag c0n1)" $((off + len)) $((size - off - len))
for f in c1n1 c1n2 c1n3 vram pmr; do
	f_img=$(tb_img "$f")
	check "$f.img is untouched" "$f_img" "$(tb_tag "$f")" 0 "$(stat -c %s "$f_img")"
done
tap_done
