#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The kernel modules of dkms/ (dmabuf_import, iommu_map_pa) as CI sees them, TAP output:
#  - the UAPI headers: include/upcie/kmod/uapi/<m>.h is a link to dkms/<m>/uapi/<m>.h, and the
#    module and the wrapper provably compile from that one file (kbuild's and gcc's dependency
#    lists both resolve to it);
#  - MODULE_VERSION agrees with debian/changelog;
#  - each module builds against the headers of both guest kernels (Debian bookworm 6.1 with
#    gcc-12, Debian 7.x with the kernel's own gcc, fetched and unpacked by the guest test bed:
#    tests/guest/testbed.sh kbuild-env) with -Werror, modpost clean, the kernel's vermagic;
#  - each builds as a .deb with dpkg-buildpackage (debhelper + dh-dkms), holding the sources,
#    dkms.conf and the UAPI header;
#  - the contents of each .deb are added, built and installed with dkms against each unpacked
#    kernel tree (private dkms, source and install trees: nothing on this system changes), and
#    depmod/modprobe resolve the installed module.
# What this cannot do: install the .deb into the system (its postinst runs dkms for the running
# kernel, whose headers this machine does not have) or load a module (the guest tests do).
#
#   scripts/build-dkms.sh [OUTDIR]    the .debs are left in OUTDIR (default build-dkms/)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/build-dkms}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mods=(dmabuf_import iommu_map_pa)
n=0
fail=0

ok() { n=$((n + 1)); echo "ok $n - $*"; }
nok() { # DESC [LOGFILE]
	n=$((n + 1))
	fail=$((fail + 1))
	echo "not ok $n - $1"
	[ -n "${2:-}" ] && [ -f "$2" ] && tail -n 25 "$2" | sed 's/^/# /'
}
skip() { n=$((n + 1)); echo "ok $n - $1 # SKIP $2"; }
t() { # DESC CMD... (output to a log shown on failure)
	local desc=$1 log=$tmp/log.$n
	shift
	if "$@" >"$log" 2>&1; then ok "$desc"; else nok "$desc" "$log"; fi
}

for tool in make gcc dpkg-buildpackage dpkg-deb dkms depmod modprobe modinfo; do
	command -v "$tool" >/dev/null || { nok "tool $tool present (scripts/deps.sh installs it)"; }
done

# --- one UAPI file ------------------------------------------------------------------------
for m in "${mods[@]}"; do
	canon=$root/dkms/$m/uapi/$m.h
	link=$root/include/upcie/kmod/uapi/$m.h
	if [ -L "$link" ] && [ "$(readlink -f "$link")" = "$(readlink -f "$canon")" ]; then
		ok "$m: include/upcie/kmod/uapi/$m.h is a link to dkms/$m/uapi/$m.h"
	else
		nok "$m: include/upcie/kmod/uapi/$m.h is a link to dkms/$m/uapi/$m.h"
	fi
	head -n 1 "$canon" | grep -q 'SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note' &&
		ok "$m: UAPI header licence GPL-2.0 WITH Linux-syscall-note" ||
		nok "$m: UAPI header licence GPL-2.0 WITH Linux-syscall-note"
	# the wrapper's translation unit: gcc's dependency list resolves to the canonical file
	printf '#include <upcie/kmod/%s.h>\n' "$m" >"$tmp/w.c"
	if gcc -std=c11 -I"$root/include" -MM "$tmp/w.c" -MF "$tmp/w.d" -o /dev/null 2>"$tmp/w.err" &&
		tr ' \\' '\n\n' <"$tmp/w.d" | grep -F "kmod/uapi/$m.h" | xargs -r readlink -f |
		grep -qx "$(readlink -f "$canon")"; then
		ok "$m: the wrapper compiles from dkms/$m/uapi/$m.h"
	else
		nok "$m: the wrapper compiles from dkms/$m/uapi/$m.h" "$tmp/w.err"
	fi
	cver=$(cd "$root/dkms/$m" && dpkg-parsechangelog -SVersion 2>/dev/null)
	mver=$(sed -n 's/^#define [A-Z]*_VERSION "\(.*\)"$/\1/p' "$root/dkms/$m/$m.c" | head -n 1)
	if [ -n "$cver" ] && [ "$cver" = "$mver" ]; then
		ok "$m: MODULE_VERSION $mver = debian/changelog"
	else
		nok "$m: MODULE_VERSION '$mver' = debian/changelog '$cver'"
	fi
done

# --- builds against the guest kernels' headers ---------------------------------------------
declare -A KV_OF HDR_OF TOOLBIN_OF MODROOT_OF
for slot in k61 k7; do
	if ! "$root/tests/guest/testbed.sh" kbuild-env "$slot" >"$tmp/env.$slot" 2>"$tmp/env.$slot.log"; then
		nok "build environment of the $slot guest kernel (tests/guest/testbed.sh kbuild-env $slot)" \
			"$tmp/env.$slot.log"
		continue
	fi
	# shellcheck disable=SC1090
	(
		. "$tmp/env.$slot"
		printf 'KV_OF[%s]=%q HDR_OF[%s]=%q TOOLBIN_OF[%s]=%q MODROOT_OF[%s]=%q\n' \
			"$slot" "$KV" "$slot" "$HDR" "$slot" "$TOOLBIN" "$slot" "$MODROOT"
		printf 'KMAKE_%s=(%s)\n' "$slot" "$(printf '%q ' "${KMAKE[@]}")"
	) >"$tmp/vars.$slot"
	# shellcheck disable=SC1090
	. "$tmp/vars.$slot"
	for m in "${mods[@]}"; do
		kv=${KV_OF[$slot]}
		b=$tmp/build-$slot-$m
		rm -rf "$b"
		cp -rL "$root/dkms/$m" "$b"
		rm -rf "$b/debian"
		log=$tmp/build-$slot-$m.log
		eval "kmake=(\"\${KMAKE_$slot[@]}\")"
		# shellcheck disable=SC2154
		if PATH="${TOOLBIN_OF[$slot]:+${TOOLBIN_OF[$slot]}:}$PATH" "${kmake[@]}" M="$b" \
			UPCIE_KMOD_WERROR=y modules >"$log" 2>&1; then
			ok "$m builds against $kv with -Werror"
		else
			nok "$m builds against $kv with -Werror" "$log"
			continue
		fi
		if grep -qE '^(ERROR|WARNING): |: (warning|error): ' "$log"; then
			nok "$m for $kv: no compiler or modpost warnings" "$log"
		else
			ok "$m for $kv: no compiler or modpost warnings"
		fi
		vm=$(modinfo -F vermagic "$b/$m.ko")
		ns=$(modinfo -F import_ns "$b/$m.ko")
		if [[ $vm == "$kv "* ]] && [ "$ns" = DMA_BUF ] && [ -z "$(modinfo -F depends "$b/$m.ko")" ]; then
			ok "$m for $kv: vermagic '$vm', imports DMA_BUF, no module dependencies"
		else
			nok "$m for $kv: vermagic '$vm' import_ns '$ns' depends '$(modinfo -F depends "$b/$m.ko")'"
		fi
		# kbuild's dependency list names the one UAPI file (the copy of it in the build dir)
		if grep -q "uapi/$m.h" "$b/.$m.o.cmd" && cmp -s "$b/uapi/$m.h" "$root/dkms/$m/uapi/$m.h"; then
			ok "$m for $kv: compiled from uapi/$m.h (identical to the wrapper's)"
		else
			nok "$m for $kv: compiled from uapi/$m.h (identical to the wrapper's)"
		fi
	done
done

# --- .debs --------------------------------------------------------------------------------
mkdir -p "$out"
for m in "${mods[@]}"; do
	pkg=$(echo "$m" | tr _ -)
	ver=$(cd "$root/dkms/$m" && dpkg-parsechangelog -SVersion 2>/dev/null)
	stage=$tmp/pkg/$pkg-$ver
	mkdir -p "$tmp/pkg"
	cp -rL "$root/dkms/$m" "$stage"
	log=$tmp/deb-$m.log
	if (cd "$stage" && dpkg-buildpackage -us -uc -b) >"$log" 2>&1; then
		ok "$pkg-dkms_${ver}_all.deb built (dpkg-buildpackage, debhelper, dh-dkms)"
	else
		nok "$pkg-dkms .deb built (dpkg-buildpackage)" "$log"
		continue
	fi
	deb=$tmp/pkg/${pkg}-dkms_${ver}_all.deb
	cp "$deb" "$out/"
	dpkg-deb -c "$deb" | awk '{print $NF}' | sed 's|^\./|/|' >"$tmp/contents.$m"
	missing=
	for f in "/usr/src/$pkg-$ver/Kbuild" "/usr/src/$pkg-$ver/Makefile" "/usr/src/$pkg-$ver/$m.c" \
		"/usr/src/$pkg-$ver/uapi/$m.h" "/usr/src/$pkg-$ver/dkms.conf" \
		"/usr/include/upcie/kmod/uapi/$m.h"; do
		grep -qx "$f" "$tmp/contents.$m" || missing+=" $f"
	done
	[ -z "$missing" ] && ok "$pkg-dkms holds the sources, dkms.conf and the UAPI header" ||
		nok "$pkg-dkms holds the sources, dkms.conf and the UAPI header (missing:$missing)"
	rm -rf "$tmp/x.$m" && mkdir -p "$tmp/x.$m" && dpkg-deb -x "$deb" "$tmp/x.$m"
	dpkg-deb -e "$deb" "$tmp/ctl.$m"
	if cmp -s "$tmp/x.$m/usr/include/upcie/kmod/uapi/$m.h" "$root/dkms/$m/uapi/$m.h" &&
		cmp -s "$tmp/x.$m/usr/src/$pkg-$ver/uapi/$m.h" "$root/dkms/$m/uapi/$m.h"; then
		ok "$pkg-dkms: installed UAPI header and module copy are dkms/$m/uapi/$m.h"
	else
		nok "$pkg-dkms: installed UAPI header and module copy are dkms/$m/uapi/$m.h"
	fi
	if grep -q "PACKAGE_VERSION=\"$ver\"" "$tmp/x.$m/usr/src/$pkg-$ver/dkms.conf" &&
		grep -q 'dkms' "$tmp/ctl.$m/postinst" && grep -q '^Depends:.*dkms' "$tmp/ctl.$m/control"; then
		ok "$pkg-dkms: dkms.conf version $ver, postinst runs dkms, depends on dkms"
	else
		nok "$pkg-dkms: dkms.conf version $ver, postinst runs dkms, depends on dkms"
	fi

	# dkms add/build/install of the package's contents, per kernel, in private trees
	for slot in k61 k7; do
		[ -n "${KV_OF[$slot]:-}" ] || { skip "$pkg: dkms install for $slot" "no build environment"; continue; }
		kv=${KV_OF[$slot]}
		d=$tmp/dkms-$m-$slot
		rm -rf "$d"
		mkdir -p "$d/tree" "$d/lib/modules/$kv"
		for f in modules.order modules.builtin modules.builtin.modinfo; do
			[ -f "${MODROOT_OF[$slot]}/lib/modules/$kv/$f" ] && cp "${MODROOT_OF[$slot]}/lib/modules/$kv/$f" "$d/lib/modules/$kv/"
		done
		dk=(dkms --dkmstree "$d/tree" --sourcetree "$tmp/x.$m/usr/src" --installtree "$d/lib/modules")
		log=$d.log
		# the environment reaches kbuild through the module's Makefile (UPCIE_KMOD_KBUILD_ARGS)
		if PATH="${TOOLBIN_OF[$slot]:+${TOOLBIN_OF[$slot]}:}$PATH" \
			UPCIE_KMOD_KBUILD_ARGS="CONFIG_DEBUG_INFO_BTF_MODULES=" \
			P="$pkg" V="$ver" K="$kv" H="${HDR_OF[$slot]}" \
			bash -c '"$@" add -m "$P" -v "$V" &&
				"$@" build -m "$P" -v "$V" -k "$K" --kernelsourcedir "$H" &&
				"$@" install -m "$P" -v "$V" -k "$K" --kernelsourcedir "$H" --no-depmod' \
			_ "${dk[@]}" >"$log" 2>&1; then
			ok "$pkg: dkms add, build and install for $kv (private trees)"
		else
			cat "$d"/tree/"$pkg"/"$ver"/build/make.log >>"$log" 2>/dev/null
			nok "$pkg: dkms add, build and install for $kv (private trees)" "$log"
			continue
		fi
		ko=$(find "$d/lib/modules/$kv" -name "$m.ko*" | head -n 1)
		if [ -n "$ko" ] && [[ $(modinfo -F vermagic "$ko") == "$kv "* ]] &&
			depmod -b "$d" "$kv" 2>>"$log" &&
			modprobe -d "$d" -S "$kv" --show-depends "$m" 2>>"$log" | grep -q "insmod $ko"; then
			ok "$pkg: installed as ${ko#"$d"/lib/modules/} (vermagic $kv), modprobe resolves it"
		else
			nok "$pkg: installed module found by depmod/modprobe" "$log"
		fi
	done
done
echo "1..$n"
[ "$fail" -eq 0 ]
