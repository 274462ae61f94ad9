#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
#
# nvme_ns (host side): the zoned write landed in c1n4.img where zone 2's write pointer was, and
# nothing else of the image changed (nvme_driver, refused, wrote nothing); in c1n5.img the data
# written with PRACT is there, the protection information QEMU made for it is right (guard =
# the T10 DIF CRC of each block, application tag 0, reference tag = the LBA), the rest of the
# data and of the metadata (all ones) is as the test bed made it.
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

z=$(tb_img c1n4)
zs=$(stat -c %s "$z")
w=$(tb_guest_info zoned_c1n4)
if [ -n "$w" ]; then
	IFS=+ read -r off len tag <<<"$w"
	run "c1n4.img [$off, +$len) holds the zoned write '$tag'" "$TB_PAT" check "$z" "$tag" "$off" "$len"
	run "c1n4.img before it is untouched" "$TB_PAT" check "$z" "$(tb_tag c1n4)" 0 "$off"
	run "c1n4.img after it is untouched" "$TB_PAT" check "$z" "$(tb_tag c1n4)" $((off + len)) $((zs - off - len))
else
	tap_fail "the guest reported its zoned write"
fi

p=$(tb_img c1n5)
ps=$(stat -c %s "$p")
lbs=4096
nlbas=$((ps / (lbs + 8)))
md=$((nlbas * lbs))
w=$(tb_guest_info pi_c1n5)
if [ -n "$w" ]; then
	IFS=+ read -r lba cnt tag <<<"$w"
	off=$((lba * lbs))
	len=$((cnt * lbs))
	run "c1n5.img blocks [$lba, +$cnt) hold '$tag'" "$TB_PAT" check "$p" "$tag" "$off" "$len"
	run "c1n5.img data before and after them untouched" sh -c \
		"'$TB_PAT' check '$p' '$(tb_tag c1n5)' 0 $off &&
		 '$TB_PAT' check '$p' '$(tb_tag c1n5)' $((off + len)) $((md - off - len))"
	run "c1n5 PI of blocks [$lba, +$cnt): CRC guard, application tag 0, reference tag = LBA" \
		"$TB_PAT" pi "$p" "$lbs" "$md" "$lba" "$cnt"
	run "c1n5 metadata of every other block still all ones" sh -c \
		"'$TB_PAT' byte '$p' $md $((lba * 8)) 255 &&
		 '$TB_PAT' byte '$p' $((md + (lba + cnt) * 8)) $((ps - md - (lba + cnt) * 8)) 255"
else
	tap_fail "the guest reported its PI write"
fi
tap_done
