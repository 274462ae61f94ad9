#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
#
# mem_topo (host side): c5's read into vrm2's BAR (the two functions of one IOMMU group) is in
# vrm2.img where the guest said, holding c5n1's pattern; the rest of vrm2.img is untouched, and
# c5n1.img and c4n1.img too (the guest only read).
set -u
# shellcheck source=../lib/tb.sh
. "$TB_LIB/tb.sh"

check() { tb_pat_check "$@"; } # DESC FILE TAG OFFSET LEN [AT]

vrm2=$(tb_img vrm2)
size=$(stat -c %s "$vrm2")
val=$(tb_guest_info p2p_read_vrm2)
if [ -z "$val" ]; then
	tap_fail "the guest reported its read into vrm2"
	check "vrm2.img untouched" "$vrm2" "$(tb_tag vrm2)" 0 "$size"
else
	IFS=+ read -r off len noff <<<"$val"
	check "vrm2.img [$off, +$len) holds c5n1 from $noff" "$vrm2" "$(tb_tag c5n1)" "$noff" "$len" "$off"
	check "vrm2.img [0, $off) untouched" "$vrm2" "$(tb_tag vrm2)" 0 "$off"
	check "vrm2.img [$((off + len)), $size) untouched" "$vrm2" "$(tb_tag vrm2)" $((off + len)) $((size - off - len))
fi
for ns in c4n1 c5n1; do
	img=$(tb_img "$ns")
	check "$ns.img untouched" "$img" "$(tb_tag "$ns")" 0 "$(stat -c %s "$img")"
done
tap_done
