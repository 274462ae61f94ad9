#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
#
# served (host side): c0n1 as the clients of upcie-served left it. Each client that ended
# normally wrote its pattern over its whole range and read it back: sc0..sc7 (LBA k * 2048,
# 2048 blocks), ss0/ss1 (16384, 18432: the survivors of the kill -9 loop), su0 (28672, 1024:
# the unprivileged client), sr0/sr1 (29696, 30720, 1024: the clients of the killed and
# restarted server); on C, vram.img holds what a served queue read into the ivshmem BAR. The
# range of the killed clients (20480..28671) holds whatever they had
# written; from LBA 31744 on no client was given anything and the image must be untouched.
set -u
# shellcheck source=../lib/tb.sh
. "$TB_LIB/tb.sh"

img=$(tb_img c0n1)
size=$(stat -c %s "$img")
check() { # DESC TAG LBA BLOCKS
	local out
	if out=$("$TB_PAT" check "$img" "$2" $(($3 * 512)) $(($4 * 512)) 2>&1); then
		tap_ok "$1"
	else
		tap_fail "$1" "$out"
	fi
}
for k in 0 1 2 3 4 5 6 7; do
	check "c0n1.img: client sc$k's range holds its data" "$(tb_tag sc$k)" $((k * 2048)) 2048
done
check "c0n1.img: survivor ss0's range holds its data" "$(tb_tag ss0)" 16384 2048
check "c0n1.img: survivor ss1's range holds its data" "$(tb_tag ss1)" 18432 2048
check "c0n1.img: the unprivileged client's range holds its data" "$(tb_tag su0)" 28672 1024
check "c0n1.img: client sr0 (server restarted under it) holds its data" "$(tb_tag sr0)" 29696 1024
check "c0n1.img: client sr1 (server restarted under it) holds its data" "$(tb_tag sr1)" 30720 1024
check "c0n1.img: nothing written where no client was given a range" "$(tb_tag c0n1)" 31744 \
	$((size / 512 - 31744))
w=$(tb_guest_info served_dmabuf)
if [ -n "$w" ]; then
	IFS=+ read -r off len nsoff <<<"$w"
	v=$(tb_img vram)
	if out=$("$TB_PAT" check "$v" "$(tb_tag c0n1)" "$nsoff" "$len" "$off" 2>&1); then
		tap_ok "vram.img [$off, +$len) holds c0n1.img [$nsoff, +$len): the controller wrote the BAR"
	else
		tap_fail "vram.img holds what the served queue read into the BAR" "$out"
	fi
	check_raw() { "$TB_PAT" check "$v" "$(tb_tag vram)" "$1" "$2" >/dev/null 2>&1; }
	if check_raw 0 "$off"; then tap_ok "vram.img before the slice untouched"; else tap_fail "vram.img before the slice untouched"; fi
fi
tap_done
