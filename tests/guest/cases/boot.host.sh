#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
#
# boot (host side): after the guest exits, the patterns boot.sh wrote are in
# the namespace images at the offsets the guest reported, and nothing else in
# the backing files changed.
set -u
# shellcheck source=../lib/tb.sh
. "$TB_LIB/tb.sh"

check() { # DESC FILE TAG OFFSET LEN
	local out
	if out=$("$TB_PAT" check "$2" "$3" "$4" "$5" 2>&1); then
		tap_ok "$1"
	else
		tap_fail "$1" "$out"
	fi
}

size_of() { stat -c %s "$1"; }

# the ranges the guest wrote: "# tb: write_<ns>=<offset>+<length>+<tag>"
for ns in c0n1 c1n1; do
	img=$(tb_img "$ns")
	w=$(tb_guest_info "write_$ns")
	if [ -z "$w" ]; then
		tap_fail "guest reported its write to $ns"
		continue
	fi
	IFS=+ read -r off len tag <<<"$w"
	check "$ns.img holds the guest's pattern '$tag' at [$off, +$len)" "$img" "$tag" "$off" "$len"
	check "$ns.img before the write is untouched" "$img" "$(tb_tag "$ns")" 0 "$off"
	check "$ns.img after the write is untouched" "$img" "$(tb_tag "$ns")" $((off + len)) \
		$(($(size_of "$img") - off - len))
done

for f in c1n2 c1n3 c1n4 vram pmr; do
	img=$(tb_img "$f")
	check "$f.img is untouched" "$img" "$(tb_tag "$f")" 0 "$(size_of "$img")"
done
# c1n5: pattern in the data, all ones in the metadata (4 KiB blocks + 8 bytes of PI each)
img=$(tb_img c1n5)
md=$(($(size_of "$img") / 4104 * 4096))
check "c1n5.img data is untouched" "$img" "$(tb_tag c1n5)" 0 "$md"
if out=$("$TB_PAT" byte "$img" "$md" $(($(size_of "$img") - md)) 255 2>&1); then
	tap_ok "c1n5.img metadata is untouched (all ones)"
else
	tap_fail "c1n5.img metadata is untouched (all ones)" "$out"
fi

tap_done
