#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
#
# hip_bridge (host side): every range the bridged queues wrote ("# tb: w_c0n1=offset+length+tag")
# holds that tag's pattern in c0n1.img, and the rest of the image (the first MiB and everything
# after the test's blocks) still holds the test bed's pattern.
set -u
# shellcheck source=../lib/tb.sh
. "$TB_LIB/tb.sh"

img=$(tb_img c0n1)
check() { # DESC TAG OFFSET LEN
	local out
	if out=$("$TB_PAT" check "$img" "$2" "$3" "$4" 2>&1); then
		tap_ok "$1"
	else
		tap_fail "$1" "$out"
	fi
}

n=0
end=0
while IFS=+ read -r off len tag; do
	check "c0n1.img [$off, +$len) holds '$tag'" "$tag" "$off" "$len"
	[ $((off + len)) -gt "$end" ] && end=$((off + len))
	n=$((n + 1))
done < <(sed -n 's/^# tb: w_c0n1=\(.*\)$/\1/p' "$TB_GUEST_OUTPUT")
want=$(sed -n 's/^# tb: nwrites=//p' "$TB_GUEST_OUTPUT")
if [ -n "$want" ] && [ "$n" -eq "$want" ] && [ "$n" -ge 19 ]; then
	tap_ok "the guest reported $n written ranges, as many as it verified"
else
	tap_fail "the guest reported its written ranges" "$n lines, guest counted '${want:-none}'"
fi
MiB=1048576
check "c0n1.img [0, 512 KiB) untouched" "$(tb_tag c0n1)" 0 $((512 * 1024))
size=$(stat -c %s "$img")
[ "$end" -lt $((2 * MiB)) ] && end=$((2 * MiB))
check "c0n1.img [$end, $size) untouched" "$(tb_tag c0n1)" "$end" $((size - end))
tap_done
