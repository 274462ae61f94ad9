#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
#
# examples (host side): nvme_async left c0n1.img exactly as the test bed made it (its slices
# written, read back, restored); peer_bar_dma changed no namespace, and its read landed in
# vram.img at the slice's offset, equal to c1n1.img at the LBA it read, with the rest of vram.img
# untouched.
set -u
# shellcheck source=../lib/tb.sh
. "$TB_LIB/tb.sh"

run() { # DESC CMD...
	local desc=$1 out
	shift
	if out=$("$@" 2>&1); then
		tap_ok "$desc"
	else
		tap_fail "$desc" "$out"
	fi
}

img=$(tb_img c0n1)
w=$(tb_guest_info async_c0n1)
if [ -n "$w" ]; then
	run "c0n1.img: the slices nvme_async wrote ($w) hold the original data again" \
		"$TB_PAT" check "$img" "$(tb_tag c0n1)" "${w%+*}" "${w#*+}"
else
	tap_fail "the guest reported nvme_async's slices"
fi
run "c0n1.img is as the test bed made it" "$TB_PAT" check "$img" "$(tb_tag c0n1)" 0 "$(stat -c %s "$img")"
for ns in c1n1 c1n3; do
	img=$(tb_img $ns)
	run "$ns.img untouched" "$TB_PAT" check "$img" "$(tb_tag $ns)" 0 "$(stat -c %s "$img")"
done

v=$(tb_img vram)
w=$(tb_guest_info p2p_vram)
if [ -n "$w" ]; then
	IFS=+ read -r off len nsoff <<<"$w"
	run "vram.img [$off, +$len) holds c1n1.img [$nsoff, +$len): the controller wrote the BAR" \
		cmp -n "$len" -i "$off:$nsoff" "$v" "$(tb_img c1n1)"
	run "vram.img before the slice untouched" "$TB_PAT" check "$v" "$(tb_tag vram)" 0 "$off"
	run "vram.img after the slice untouched" "$TB_PAT" check "$v" "$(tb_tag vram)" \
		$((off + len)) $(($(stat -c %s "$v") - off - len))
else
	tap_fail "the guest reported peer_bar_dma's read"
fi
tap_done
