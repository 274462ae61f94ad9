#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
#
# hip_mirror (host side): every range the guest wrote from VRAM ("# tb: w_c0n1=offset+length+tag")
# holds that tag's pattern in c0n1.img, every range it read back into VRAM
# ("# tb: r_vram=vram offset+length+c0n1 offset+tag") holds the same bytes in vram.img, and what
# lies outside the test's blocks of c0n1.img and outside its slice of vram.img is untouched.
set -u
# shellcheck source=../lib/tb.sh
. "$TB_LIB/tb.sh"

img=$(tb_img c0n1)
vram=$(tb_img vram)
check() { # DESC FILE TAG OFFSET LEN [AT]
	local out
	if out=$("$TB_PAT" check "$2" "$3" "$4" "$5" ${6:+"$6"} 2>&1); then
		tap_ok "$1"
	else
		tap_fail "$1" "$out"
	fi
}

n=0
end=0
while IFS=+ read -r off len tag; do
	check "c0n1.img [$off, +$len) holds '$tag'" "$img" "$tag" "$off" "$len"
	[ $((off + len)) -gt "$end" ] && end=$((off + len))
	n=$((n + 1))
done < <(sed -n 's/^# tb: w_c0n1=\(.*\)$/\1/p' "$TB_GUEST_OUTPUT")
m=0
while IFS=+ read -r voff len noff tag; do
	check "vram.img [$voff, +$len) holds '$tag' as read from c0n1 at $noff" "$vram" "$tag" "$noff" "$len" "$voff"
	m=$((m + 1))
done < <(sed -n 's/^# tb: r_vram=\(.*\)$/\1/p' "$TB_GUEST_OUTPUT")
want=$(sed -n 's/^# tb: nranges=//p' "$TB_GUEST_OUTPUT")
if [ -n "$want" ] && [ "$n" -eq "$want" ] && [ "$m" -eq "$want" ] && [ "$n" -ge 20 ]; then
	tap_ok "the guest reported $n ranges written from and read back into VRAM, as many as it verified"
else
	tap_fail "the guest reported its ranges" "$n written, $m read back, guest counted '${want:-none}'"
fi
MiB=1048576
check "c0n1.img [0, 512 KiB) untouched" "$img" "$(tb_tag c0n1)" 0 $((512 * 1024))
size=$(stat -c %s "$img")
[ "$end" -lt $((2 * MiB)) ] && end=$((2 * MiB))
check "c0n1.img [$end, $size) untouched" "$img" "$(tb_tag c0n1)" "$end" $((size - end))
vsize=$(stat -c %s "$vram")
check "vram.img [0, 16 MiB) untouched" "$vram" "$(tb_tag vram)" 0 $((16 * MiB))
check "vram.img [20 MiB, $vsize) untouched" "$vram" "$(tb_tag vram)" $((20 * MiB)) $((vsize - 20 * MiB))
tap_done
