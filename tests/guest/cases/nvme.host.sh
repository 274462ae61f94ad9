#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
#
# nvme (host side): what the guest's driver wrote is in the backing files. Every range the guest
# reported as written ("# tb: w_<ns>_..." = offset+length+tag) holds that tag's pattern in the
# namespace image (data and the c1n2 metadata area); the P2P placements are in vram.img
# (Identify data, c1n1 blocks read into it) and in c1n1.img (a write from the BAR); the parts of
# the images nobody wrote still hold the test bed's pattern, and so does the rest of vram.img.
set -u
# shellcheck source=../lib/tb.sh
. "$TB_LIB/tb.sh"

check() { # DESC FILE TAG OFFSET LEN [AT]
	local out
	if out=$("$TB_PAT" check "$2" "$3" "$4" "$5" ${6:+"$6"} 2>&1); then
		tap_ok "$1"
	else
		tap_fail "$1" "$out"
	fi
}

infos() { sed -n "s/^# tb: \($1[^=]*\)=\(.*\)$/\1 \2/p" "$TB_GUEST_OUTPUT"; }

n=0
while read -r key val; do
	ns=$(echo "$key" | cut -d_ -f2)
	IFS=+ read -r off len tag <<<"$val"
	check "$key: $ns.img [$off, +$len) holds '$tag'" "$(tb_img "$ns")" "$tag" "$off" "$len"
	n=$((n + 1))
done < <(infos w_)
[ "$n" -gt 0 ] || tap_fail "the guest reported writes"

# pristine parts: nothing may have written there
MiB=1048576
check "c0n1.img [24 MiB, 32 MiB) untouched" "$(tb_img c0n1)" "$(tb_tag c0n1)" $((24 * MiB)) $((8 * MiB))
check "c1n1.img [24 MiB, 32 MiB) untouched" "$(tb_img c1n1)" "$(tb_tag c1n1)" $((24 * MiB)) $((8 * MiB))
check "c1n3.img [6 MiB, 8 MiB) untouched" "$(tb_img c1n3)" "$(tb_tag c1n3)" $((6 * MiB)) $((2 * MiB))
c1n2=$(tb_img c1n2)
nlbas=$(($(stat -c %s "$c1n2") / (4096 + 16)))
check "c1n2.img data of blocks [3072, $nlbas) untouched" "$c1n2" "$(tb_tag c1n2)" $((3072 * 4096)) $(((nlbas - 3072) * 4096))
check "c1n2.img metadata of blocks [3072, $nlbas) untouched" "$c1n2" "$(tb_tag c1n2)" $((nlbas * 4096 + 3072 * 16)) $(((nlbas - 3072) * 16))
check "pmr.img untouched" "$(tb_img pmr)" "$(tb_tag pmr)" 0 "$(stat -c %s "$(tb_img pmr)")"

# P2P
vram=$(tb_img vram)
c1n1=$(tb_img c1n1)
used=()
while read -r key off; do
	vid=$(od -An -tx1 -j "$off" -N 2 "$vram" | tr -d ' \n')
	sn=$(dd if="$vram" bs=1 skip=$((off + 4)) count=20 2>/dev/null | tr -d ' \0')
	if [ "$vid" = 361b ] && [ "$sn" = "${TB_C1_SN:-cafe0001}" ]; then
		tap_ok "$key: Identify data in vram.img at $off (vendor 1b36, serial $sn)"
	else
		tap_fail "$key: Identify data in vram.img at $off" "vendor '$vid', serial '$sn'"
	fi
	used+=("$off+4096")
done < <(infos p2p_identify_)
while read -r key val; do
	IFS=+ read -r voff len noff <<<"$val"
	check "$key: vram.img [$voff, +$len) holds c1n1 from $noff" "$vram" "$(tb_tag c1n1)" "$noff" "$len" "$voff"
	used+=("$voff+$len")
done < <(infos p2p_read_)
while read -r key val; do
	IFS=+ read -r noff len voff <<<"$val"
	check "$key: c1n1.img [$noff, +$len) holds vram from $voff" "$c1n1" "$(tb_tag vram)" "$voff" "$len" "$noff"
done < <(infos p2p_write_)
if [ "${#used[@]}" -eq 0 ]; then
	tap_fail "the guest reported P2P placements"
fi

# the rest of vram.img is untouched: no stray DMA into the emulated device memory
tag=$(tb_tag vram)
size=$(stat -c %s "$vram")
pos=0
for r in $(printf '%s\n' "${used[@]}" | sort -t+ -k1,1n); do
	off=${r%+*}
	len=${r#*+}
	if [ "$off" -gt "$pos" ]; then
		check "vram.img [$pos, $off) untouched" "$vram" "$tag" "$pos" $((off - pos))
	fi
	pos=$((off + len))
done
check "vram.img [$pos, $size) untouched" "$vram" "$tag" "$pos" $((size - pos))
tap_done
