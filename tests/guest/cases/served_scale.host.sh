#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
#
# served_scale (host side): on each of the eight controllers' first namespace (c0n1, s1n1..s7n1)
# the scale client filled LBA 0..8191 with "sk<k>" and a client process of its own verified
# LBA 8192..16383 with "sp<k>"; past that (c0n1 only) nothing was written.
set -u
# shellcheck source=../lib/tb.sh
. "$TB_LIB/tb.sh"

check() { # DESC IMG TAG LBA BLOCKS
	local out
	if out=$("$TB_PAT" check "$2" "$3" $(($4 * 512)) $(($5 * 512)) 2>&1); then
		tap_ok "$1"
	else
		tap_fail "$1" "$out"
	fi
}
k=0
for ns in c0n1 s1n1 s2n1 s3n1 s4n1 s5n1 s6n1 s7n1; do
	img=$(tb_img $ns)
	check "$ns.img: the scale client's 4 queue ranges hold controller $k's pattern" "$img" "$(tb_tag sk$k)" 0 8192
	check "$ns.img: client process sp$k's range holds its pattern" "$img" "$(tb_tag sp$k)" 8192 8192
	k=$((k + 1))
done
img=$(tb_img c0n1)
check "c0n1.img: untouched past LBA 16384" "$img" "$(tb_tag c0n1)" 16384 $(($(stat -c %s "$img") / 512 - 16384))
tap_done
