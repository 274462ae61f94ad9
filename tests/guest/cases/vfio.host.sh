#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
#
# vfio (host side): the NVMe wrote Identify controller data (vendor 1b36, serial of c0) into the
# ivshmem BAR at the offsets the guest reported, through a type1 container and (on 7.x with
# iommufd) through a vfio dma-buf imported into an IOAS; the rest of vram.img still holds its
# pattern, so nothing else in the emulated device memory was written.
set -u
# shellcheck source=../lib/tb.sh
. "$TB_LIB/tb.sh"

vram=$(tb_img vram)
size=$(stat -c %s "$vram")
offs=()
for key in type1_identify iommufd_identify; do
	off=$(tb_guest_info "$key")
	if [ -z "$off" ]; then
		if [ "$key" = iommufd_identify ] && [ "$TB_OOT" != 1 ]; then
			tap_skip "iommufd Identify data in vram.img" "no iommufd in config $TB_CONFIG"
		else
			tap_fail "guest reported where the $key data went"
		fi
		continue
	fi
	vid=$(od -An -tx1 -j "$off" -N 2 "$vram" | tr -d ' \n')
	sn=$(dd if="$vram" bs=1 skip=$((off + 4)) count=20 2>/dev/null | tr -d ' \0')
	if [ "$vid" = 361b ] && [ "$sn" = deadbeef ]; then
		tap_ok "${key%_identify}: Identify data in vram.img at $off (vendor 1b36, serial $sn)"
	else
		tap_fail "${key%_identify}: Identify data in vram.img at $off" "vendor bytes '$vid', serial '$sn'"
	fi
	offs+=("$off")
done

# everything outside the written pages keeps the test bed's pattern
tag=$(tb_tag vram)
pos=0
for off in $(printf '%s\n' "${offs[@]}" | sort -n); do
	if [ "$off" -gt "$pos" ]; then
		if out=$("$TB_PAT" check "$vram" "$tag" "$pos" $((off - pos)) 2>&1); then
			tap_ok "vram.img [$pos, $off) untouched"
		else
			tap_fail "vram.img [$pos, $off) untouched" "$out"
		fi
	fi
	pos=$((off + 4096))
done
if out=$("$TB_PAT" check "$vram" "$tag" "$pos" $((size - pos)) 2>&1); then
	tap_ok "vram.img [$pos, $size) untouched"
else
	tap_fail "vram.img [$pos, $size) untouched" "$out"
fi
tap_done
