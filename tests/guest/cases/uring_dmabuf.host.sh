#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
#
# uring_dmabuf (host side), configuration U: c0n1.img [8 MiB, 10 MiB) holds what the udmabuf
# wrote (tag uw), [10 MiB, 11 MiB) what the VRAM BAR wrote (tag uv), the rest of the image its
# own data; vram.img [1 MiB, 2 MiB) holds c0n1 [0, 1 MiB), read peer to peer. Nothing to check
# on the stock kernels, where the guest only probed.
set -u
# shellcheck source=../lib/tb.sh
. "$TB_LIB/tb.sh"

if [ "$TB_CONFIG" != U ] && [ "$TB_CONFIG" != V ]; then
	tap_skip "the images" "nothing was written on a stock kernel"
	tap_done
	exit 0
fi
MiB=$((1 << 20))
check() { tb_pat_check "$@"; } # DESC FILE TAG OFFSET LEN [AT]
img=$(tb_img c0n1)
size=$(stat -c %s "$img")
check "c0n1.img [0, 8 MiB) untouched" "$img" "$(tb_tag c0n1)" 0 $((8 * MiB))
check "c0n1.img [8, 10) MiB holds the udmabuf's writes" "$img" "$(tb_tag uw)" $((8 * MiB)) $((2 * MiB))
if [ -n "$(tb_guest_info uring_vram)" ]; then
	check "c0n1.img [10, 11) MiB holds what the VRAM BAR wrote" "$img" "$(tb_tag uv)" $((10 * MiB)) $MiB
	v=$(tb_img vram)
	check "vram.img [1, 2) MiB holds c0n1 [0, 1 MiB): the controller wrote the BAR" "$v" \
		"$(tb_tag c0n1)" 0 $MiB $MiB
	check "vram.img [0, 1 MiB) untouched" "$v" "$(tb_tag vram)" 0 $MiB
	check "c0n1.img [11 MiB, end) untouched" "$img" "$(tb_tag c0n1)" $((11 * MiB)) $((size - 11 * MiB))
else
	tap_fail "the guest reported the VRAM transfers"
	check "c0n1.img [10 MiB, end) untouched" "$img" "$(tb_tag c0n1)" $((10 * MiB)) $((size - 10 * MiB))
fi
if [ -n "$(tb_guest_info uring_vram_sw)" ]; then
	img6=$(tb_img c6n1)
	v3=$(tb_img vrm3)
	check "c6n1.img [4, 5) MiB holds what vrm3's BAR wrote through the switch" "$img6" "$(tb_tag uv)" $((4 * MiB)) $MiB
	check "vrm3.img [1, 2) MiB holds c6n1 [0, 1 MiB): c6 wrote the BAR through the switch" "$v3" \
		"$(tb_tag c6n1)" 0 $MiB $MiB
	check "c6n1.img [0, 4 MiB) untouched" "$img6" "$(tb_tag c6n1)" 0 $((4 * MiB))
	check "c6n1.img [5 MiB, end) untouched" "$img6" "$(tb_tag c6n1)" $((5 * MiB)) $((3 * MiB))
elif [ "$TB_CONFIG" = V ]; then
	tap_fail "the guest reported the transfers through the switch"
else
	tap_skip "the images behind the switch" "the guest skipped them under the translating IOMMU"
fi
tap_done
