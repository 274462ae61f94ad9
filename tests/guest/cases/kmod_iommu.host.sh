#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
#
# kmod_iommu (host side): what the controllers read through iommu_map_pa mappings is in vram.img
# at the offsets the guest reported (namespace patterns, so it came from the disks); what c0
# wrote from the window is in c0n1.img (the guest's pattern, which it put into the ivshmem BAR);
# everything else keeps its pattern. Without an IOMMU (A) nothing may have changed.
set -u
# shellcheck source=../lib/tb.sh
. "$TB_LIB/tb.sh"

check() { tb_pat_check "$@"; } # DESC FILE TAG OFFSET LEN [AT]

vram=$(tb_img vram)
vsize=$(stat -c %s "$vram")
c0n1=$(tb_img c0n1)
csize=$(stat -c %s "$c0n1")
if [ "$TB_IOMMU" != 1 ]; then
	for f in c0n1 c1n1 c1n2 c1n3 vram pmr; do
		img=$(tb_img "$f")
		check "$f.img is untouched (no IOMMU: nothing mapped)" "$img" "$(tb_tag "$f")" 0 "$(stat -c %s "$img")"
	done
	tap_done
	exit
fi

# reads into vram: "<vram offset>+<len>+<namespace>+<namespace offset>"
ranges=()
keys=(read_vram_c0 read_vram_c1 read_vram_2m ident_vram)
[ "$TB_OOT" = 1 ] && keys+=(read_vram_iommufd) # iommufd: 7.x with the out-of-tree rebuild
for key in "${keys[@]}"; do
	v=$(tb_guest_info "$key")
	if [ -z "$v" ]; then
		tap_fail "guest reported $key"
		continue
	fi
	IFS=+ read -r at len ns src <<<"$v"
	check "$key: vram.img [$at, +$len) holds $ns [$src, +$len)" "$vram" "$(tb_tag "$ns")" "$src" "$len" "$at"
	ranges+=("$at $len")
done
# the rest of vram.img: the pattern, except where the guest itself wrote through the CPU view
# (the source of the Write, 0xee fills before reads): those ranges are skipped
skip=("$((8 << 20)) $((64 << 10))" "$((9 << 20)) $((12 << 10))" "$((32 << 20)) $((64 << 10))")
pos=0
while read -r at len; do
	[ "$at" -gt "$pos" ] && check "vram.img [$pos, $at) untouched" "$vram" "$(tb_tag vram)" "$pos" $((at - pos))
	[ $((at + len)) -gt "$pos" ] && pos=$((at + len))
done < <(printf '%s\n' "${ranges[@]}" "${skip[@]}" | sort -n)
check "vram.img [$pos, end) untouched" "$vram" "$(tb_tag vram)" "$pos" $((vsize - pos))

w=$(tb_guest_info write_c0n1)
if [ -n "$w" ]; then
	IFS=+ read -r off len tag <<<"$w"
	check "c0n1.img holds the pattern '$tag' written from the vram window at [$off, +$len)" "$c0n1" "$tag" "$off" "$len"
	check "c0n1.img before it is untouched" "$c0n1" "$(tb_tag c0n1)" 0 "$off"
	check "c0n1.img after it is untouched" "$c0n1" "$(tb_tag c0n1)" $((off + len)) $((csize - off - len))
else
	tap_fail "guest reported its write to c0n1"
fi
# c1n3 LBA 100 carries the doorbell values the stand-in GPU wrote to c0's doorbells
img=$(tb_img c1n3)
w=$(tb_guest_info write_c1n3)
if [ -n "$w" ]; then
	IFS=+ read -r off len _ <<<"$w"
	sq=$(od -An -tu4 -j "$off" -N 4 "$img" | tr -d ' ')
	if [ "$sq" -gt 0 ] 2>/dev/null && [ "$(dd if="$img" bs=1 skip=$((off + 8)) count=$((len - 8)) 2>/dev/null | tr -d '\0' | wc -c)" = 0 ]; then
		tap_ok "c1n3.img LBA $((off / 512)): the doorbell payload (SQ tail $sq, zeros after the CQ head)"
	else
		tap_fail "c1n3.img LBA $((off / 512)): the doorbell payload" "first dword '$sq'"
	fi
	check "c1n3.img before it is untouched" "$img" "$(tb_tag c1n3)" 0 "$off"
	check "c1n3.img after it is untouched" "$img" "$(tb_tag c1n3)" $((off + len)) $(($(stat -c %s "$img") - off - len))
else
	tap_fail "guest reported the doorbell payload on c1n3"
fi
for f in c1n1 c1n2 pmr; do
	img=$(tb_img "$f")
	check "$f.img is untouched" "$img" "$(tb_tag "$f")" 0 "$(stat -c %s "$img")"
done
tap_done
