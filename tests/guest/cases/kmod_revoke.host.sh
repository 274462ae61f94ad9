#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
#
# kmod_revoke (host side): what c0 Read into the BAR before the revocation is in vram.img; of
# the batch in flight at the revocation each chunk holds either its data or the old pattern;
# nothing c0 was told to write after the revocation point is there; the control Read through a
# fresh attachment is; everything else of vram.img and every other file keeps its pattern.
set -u
# shellcheck source=../lib/tb.sh
. "$TB_LIB/tb.sh"

check() { tb_pat_check "$@"; } # DESC FILE TAG OFFSET LEN [AT]

vram=$(tb_img vram)
vsize=$(stat -c %s "$vram")
vtag=$(tb_tag vram)
ntag=$(tb_tag c0n1)
before=$(tb_guest_info revoke_before)
if [ -z "$before" ]; then
	# the guest skipped (no vfio BAR dma-buf, or no peer-to-peer path): nothing may have changed
	for f in c0n1 c1n1 c1n2 c1n3 vram pmr; do
		img=$(tb_img "$f")
		check "$f.img is untouched" "$img" "$(tb_tag "$f")" 0 "$(stat -c %s "$img")"
	done
	tap_done
	exit
fi
IFS=+ read -r at len _ src <<<"$before"
check "before: vram.img [$at, +$len) holds c0n1 [$src, +$len)" "$vram" "$ntag" "$src" "$len" "$at"
ranges=("$at $len")

mid=$(tb_guest_info revoke_mid)
if [ -n "$mid" ]; then
	IFS=+ read -r at len lba <<<"$mid"
	chunk=16384 landed=0 odd=
	for ((o = 0; o < len; o += chunk)); do
		if "$TB_PAT" check "$vram" "$ntag" $((lba * 512 + o)) "$chunk" $((at + o)) >/dev/null 2>&1; then
			landed=$((landed + 1))
		elif ! "$TB_PAT" check "$vram" "$vtag" $((at + o)) "$chunk" >/dev/null 2>&1; then
			odd+=" $((at + o))"
		fi
	done
	if [ -z "$odd" ]; then
		tap_ok "mid: every chunk of the batch in flight holds its Read's data ($landed) or the old pattern"
	else
		tap_fail "mid: chunks with neither their Read's data nor the old pattern:$odd"
	fi
	ranges+=("$at $len")
else
	tap_fail "guest reported the batch in flight at the revocation"
fi

after=$(tb_guest_info revoke_after)
if [ -n "$after" ]; then
	IFS=+ read -r at len <<<"$after"
	check "after the revocation point: nothing landed in vram.img [$at, +$len)" "$vram" "$vtag" "$at" "$len"
else
	tap_fail "guest reported the Reads after the revocation point"
fi

control=$(tb_guest_info revoke_control)
if [ -n "$control" ]; then
	IFS=+ read -r at len _ src <<<"$control"
	check "control: vram.img [$at, +$len) holds c0n1 [$src, +$len) (a fresh attachment)" "$vram" "$ntag" "$src" "$len" "$at"
	ranges+=("$at $len")
else
	tap_fail "guest reported the control Read"
fi

pos=0
while read -r at len; do
	[ "$at" -gt "$pos" ] && check "vram.img [$pos, $at) untouched" "$vram" "$vtag" "$pos" $((at - pos))
	[ $((at + len)) -gt "$pos" ] && pos=$((at + len))
done < <(printf '%s\n' "${ranges[@]}" | sort -n)
check "vram.img [$pos, end) untouched" "$vram" "$vtag" "$pos" $((vsize - pos))
for f in c0n1 c1n1 c1n2 c1n3 pmr; do
	img=$(tb_img "$f")
	check "$f.img is untouched" "$img" "$(tb_tag "$f")" 0 "$(stat -c %s "$img")"
done
tap_done
