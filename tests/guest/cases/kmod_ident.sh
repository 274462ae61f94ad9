#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# kmod_ident: the identity of upcie's kernel modules and what upcie's wrappers do with a module
# of the same name that is not upcie's. For dmabuf_import and iommu_map_pa (built for this kernel
# by the test bed): /sys/module/<m>/parameters/abi reads "upcie-<m> <ABI>" (the UAPI header's
# values), cannot be written, and cannot be set as a load argument; the wrapper opens the device.
# Then a stand-in for another project's module of the same name (tests/guest/kmod-other: same
# device node, no identity, version 0.2.0) is loaded in its place: the wrapper refuses it with
# -EPROTO and a message naming the node, what was found and the package to install, and sends it
# no request at all (the stand-in logs every request it gets; one sent past the wrapper shows up,
# so the count can fail). Back to upcie's module: the wrapper opens it again.
#
# configs: A C
# timeout: 120
# shellcheck source=../lib/tb.sh
. /tests/lib/tb.sh

ko_dir=/lib/modules/$(uname -r)/extra
for m in dmabuf_import iommu_map_pa; do
	want=$(/bin/t_kmod_ident want "$m")
	if ! tb_modprobe "$m"; then
		tap_fail "$m: upcie's module loads"
		continue
	fi
	tap_is "$(cat "/sys/module/$m/parameters/abi" 2>&1)" "$want" \
		"$m: /sys/module/$m/parameters/abi reads '$want'"
	if (echo "upcie-$m 99" >"/sys/module/$m/parameters/abi") 2>/dev/null; then
		tap_fail "$m: the identity cannot be written" "writing it succeeded"
	else
		tap_is "$(cat "/sys/module/$m/parameters/abi")" "$want" \
			"$m: the identity cannot be written (and still reads '$want')"
	fi
	out=$(/bin/t_kmod_ident open "$m")
	tap_is "$(echo "$out" | head -n 1)" "rc=0" "$m: the wrapper opens upcie's module"
	echo "$out" | tail -n +2 | sed 's/^/# /'

	rmmod "$m" || tap_diag "rmmod $m failed"
	if out=$(insmod "$ko_dir/$m.ko" abi=upcie-"$m" 2>&1); then
		tap_fail "$m: 'abi=...' as a load argument is refused" "insmod succeeded"
		rmmod "$m"
	else
		tap_ok "$m: 'abi=...' as a load argument is refused ($(echo "$out" | head -n 1))"
	fi

	# another project's module of the same name
	if ! out=$(insmod "/lib/tb-other/$m.ko" 2>&1); then
		tap_fail "$m: the stand-in for another project's module loads" "$out"
		tb_modprobe "$m"
		continue
	fi
	tb_wait 5 test -c "/dev/$m" || tap_diag "/dev/$m did not appear"
	tap_is "$(cat "/sys/module/$m/version" 2>&1)" "0.2.0" "$m: the stand-in is loaded as $m (version 0.2.0)"
	dmesg -c >/dev/null
	out=$(/bin/t_kmod_ident open "$m")
	rc=$(echo "$out" | head -n 1)
	msg=$(echo "$out" | tail -n +2)
	tap_is "$rc" "rc=EPROTO" "$m: the wrapper refuses another project's module: -EPROTO"
	case $msg in
	*"/dev/$m is not upcie's module"*"version 0.2.0"*"has no ABI identity"*"rmmod $m"*"install "*-dkms*)
		tap_ok "$m: the message names the node, what was found and what to do: $msg" ;;
	*) tap_fail "$m: the message names the node, what was found and what to do" "got: $msg" ;;
	esac
	n=$(dmesg | grep -c "tb-other $m: request")
	tap_is "$n" 0 "$m: the wrapper sent the other module no request"
	/bin/t_kmod_ident poke "$m" >/dev/null
	n=$(dmesg | grep -c "tb-other $m: request")
	tap_is "$n" 1 "$m: (control) a request sent past the wrapper reaches it and is seen"
	rmmod "$m" || tap_diag "rmmod of the stand-in failed"

	if tb_modprobe "$m"; then
		out=$(/bin/t_kmod_ident open "$m")
		tap_is "$(echo "$out" | head -n 1)" "rc=0" "$m: upcie's module again: the wrapper opens it"
	else
		tap_fail "$m: upcie's module loads again"
	fi
done
tap_done
