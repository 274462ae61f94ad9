#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# include/upcie/vfio/uapi.h carries kernel UAPI definitions under upcie names because Debian
# bookworm's headers (6.1) lack them. This check compares every one of them with a current
# kernel's: it fetches linux-libc-dev from sid / trixie-backports through a private apt
# configuration (the system's apt state is not touched; the mirror is the one in
# /etc/apt/sources.list.d/debian.sources), unpacks it, and compiles a generated C file with one
# static assertion per fact: ioctl numbers, command and flag values, struct sizes and alignment,
# the offset, size and signedness of every field. Every UPCIE_ macro and upcie_ struct in uapi.h
# must be covered. TAP output; exit status 1 on any mismatch. "ok 1 # SKIP" only when the
# archive is unreachable and nothing is cached.
#
# Environment: UPCIE_UAPI_CACHE (default /var/cache/upcie-uapi) holds the apt lists, the .deb
# and the unpacked headers; a later run without network reuses them. UPCIE_UAPI_SUITES (default
# "sid trixie-backports"), UPCIE_UAPI_MIRROR (default: from the system's apt configuration),
# CC (default gcc).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${UPCIE_UAPI_CACHE:-/var/cache/upcie-uapi}
suites=${UPCIE_UAPI_SUITES:-sid trixie-backports}
cc=${CC:-gcc}
uapi=$root/include/upcie/vfio/uapi.h

skip() {
	echo "ok 1 # SKIP $*"
	echo "1..1"
	exit 0
}
bail() {
	echo "not ok 1 - $*"
	echo "1..1"
	exit 1
}

mirror_uri() {
	local uri=${UPCIE_UAPI_MIRROR:-}
	if [ -z "$uri" ] && [ -r /etc/apt/sources.list.d/debian.sources ]; then
		uri=$(awk 'tolower($1) == "uris:" { for (i = 2; i <= NF; i++) if ($i !~ /security/) { print $i; exit } }' \
			/etc/apt/sources.list.d/debian.sources)
	fi
	if [ -z "$uri" ] && [ -r /etc/apt/sources.list ]; then
		uri=$(awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { if ($i !~ /security/) { print $i; exit } break } }' \
			/etc/apt/sources.list)
	fi
	echo "$uri"
}

mkdir -p "$cache" 2>/dev/null || bail "cannot create the cache $cache (set UPCIE_UAPI_CACHE)"
exec 9>"$cache/.lock"
command -v flock >/dev/null && flock 9

# --- fetch linux-libc-dev ---------------------------------------------------------------
A=(-o "Dir::Etc::SourceList=$cache/sources.list" -o Dir::Etc::SourceParts=/dev/null
	-o Dir::Etc::Preferences=/dev/null -o Dir::Etc::PreferencesParts=/dev/null
	-o "Dir::State::Lists=$cache/lists" -o "Dir::State::status=$cache/status"
	-o "Dir::Cache=$cache/apt"
	-o APT::Architecture=amd64 -o APT::Architectures=amd64 -o Acquire::Languages=none
	-o APT::Sandbox::User=root -o Acquire::Retries=2)
inc=
ver=
uri=$(mirror_uri)
if [ -n "$uri" ] && command -v apt-get >/dev/null; then
	mkdir -p "$cache/lists/partial" "$cache/apt/archives/partial" "$cache/debs"
	: >"$cache/status" # no installed packages: candidates come from the fetched lists only
	for s in $suites; do echo "deb $uri $s main"; done >"$cache/sources.list"
	if apt-get "${A[@]}" -q update >"$cache/update.log" 2>&1 &&
		! grep -qE '^(W|E): (Failed to fetch|Some index files failed)' "$cache/update.log"; then
		ver=$(apt-cache "${A[@]}" show --no-all-versions linux-libc-dev 2>/dev/null |
			awk '/^Version:/ { print $2; exit }')
	fi
fi
if [ -n "$ver" ]; then
	dir=$cache/linux-libc-dev_$ver
	if [ ! -f "$dir/.ready" ]; then
		rm -rf "$dir" "$cache/debs"/linux-libc-dev_*.deb
		(cd "$cache/debs" && apt-get "${A[@]}" -q download "linux-libc-dev=$ver") \
			>"$cache/download.log" 2>&1 || bail "apt-get download linux-libc-dev=$ver failed (see $cache/download.log)"
		deb=$(find "$cache/debs" -maxdepth 1 -name 'linux-libc-dev_*.deb' | head -n 1)
		[ -n "$deb" ] || bail "no linux-libc-dev .deb after the download"
		dpkg -x "$deb" "$dir" || bail "dpkg -x $deb failed"
		touch "$dir/.ready"
	fi
	ln -sfn "linux-libc-dev_$ver" "$cache/current"
	inc=$dir/usr/include
else
	# archive unreachable: a cached copy still gives a real answer
	if [ -f "$cache/current/.ready" ]; then
		ver=$(basename "$(readlink "$cache/current")")
		ver=${ver#linux-libc-dev_}
		echo "# Debian archive unreachable (${uri:-no mirror configured}); using the cached linux-libc-dev $ver"
		inc=$cache/current/usr/include
	else
		skip "Debian archive unreachable (${uri:-no mirror configured}) and nothing cached in $cache"
	fi
fi
[ -f "$inc/linux/iommufd.h" ] || bail "linux-libc-dev $ver has no linux/iommufd.h"
echo "# comparing include/upcie/vfio/uapi.h with linux-libc-dev $ver"

# --- what to compare -----------------------------------------------------------------------
# struct <kernel name>: fields (kernel=upcie when the names differ, [] for arrays)
# value <kernel name>...: macros and enumerators; the upcie name is UPCIE_<kernel name>
spec=$(
	cat <<'EOF'
struct iommu_destroy: size id
struct iommu_ioas_alloc: size flags out_ioas_id
struct iommu_iova_range: start last
struct iommu_ioas_iova_ranges: size ioas_id num_iovas __reserved=reserved allowed_iovas out_iova_alignment
struct iommu_ioas_allow_iovas: size ioas_id num_iovas __reserved=reserved allowed_iovas
struct iommu_ioas_map: size flags ioas_id __reserved=reserved user_va length iova
struct iommu_ioas_map_file: size flags ioas_id fd start length iova
struct iommu_ioas_copy: size flags dst_ioas_id src_ioas_id length dst_iova src_iova
struct iommu_ioas_unmap: size ioas_id iova length
struct iommu_option: size option_id op __reserved=reserved object_id val64
struct vfio_device_bind_iommufd: argsz flags iommufd out_devid token_uuid_ptr
struct vfio_device_attach_iommufd_pt: argsz flags pt_id pasid
struct vfio_device_detach_iommufd_pt: argsz flags pasid
struct vfio_region_dma_range: offset length
struct vfio_device_feature_dma_buf: region_index open_flags flags nr_ranges dma_ranges[]
value IOMMUFD_TYPE
value IOMMUFD_CMD_DESTROY IOMMUFD_CMD_IOAS_ALLOC IOMMUFD_CMD_IOAS_ALLOW_IOVAS IOMMUFD_CMD_IOAS_COPY
value IOMMUFD_CMD_IOAS_IOVA_RANGES IOMMUFD_CMD_IOAS_MAP IOMMUFD_CMD_IOAS_UNMAP IOMMUFD_CMD_OPTION
value IOMMUFD_CMD_IOAS_MAP_FILE
value IOMMU_DESTROY IOMMU_IOAS_ALLOC IOMMU_IOAS_ALLOW_IOVAS IOMMU_IOAS_COPY IOMMU_IOAS_IOVA_RANGES
value IOMMU_IOAS_MAP IOMMU_IOAS_MAP_FILE IOMMU_IOAS_UNMAP IOMMU_OPTION
value IOMMU_IOAS_MAP_FIXED_IOVA IOMMU_IOAS_MAP_WRITEABLE IOMMU_IOAS_MAP_READABLE
value IOMMU_OPTION_RLIMIT_MODE IOMMU_OPTION_HUGE_PAGES IOMMU_OPTION_OP_SET IOMMU_OPTION_OP_GET
value VFIO_DEVICE_BIND_FLAG_TOKEN VFIO_DEVICE_BIND_IOMMUFD
value VFIO_DEVICE_ATTACH_PASID VFIO_DEVICE_ATTACH_IOMMUFD_PT
value VFIO_DEVICE_DETACH_PASID VFIO_DEVICE_DETACH_IOMMUFD_PT
value VFIO_DEVICE_FEATURE_DMA_BUF
EOF
)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
src=$tmp/uapi_check.c
labels=()
{
	echo '#include <stddef.h>'
	echo '#include <linux/types.h>'
	echo '#include <linux/vfio.h>'
	echo '#include <linux/iommufd.h>'
	echo '#include <upcie/vfio/uapi.h>'
	echo '#define SIGNED_(t, f) ((__typeof__(((t *)0)->f))-1 < 0)'
	echo '#define FSZ_(t, f) sizeof(((t *)0)->f)'
} >"$src"
first_line=$(($(wc -l <"$src") + 1))
emit() { # LABEL EXPR
	labels+=("$1")
	printf '_Static_assert(%s, "%s");\n' "$2" "$1" >>"$src"
}
covered=" "
while read -r kind rest; do
	case $kind in
	struct)
		name=${rest%%:*}
		k="struct $name"
		u="struct upcie_$name"
		covered+="upcie_$name "
		emit "sizeof($k) == sizeof($u)" "sizeof($k) == sizeof($u)"
		emit "_Alignof($k) == _Alignof($u)" "_Alignof($k) == _Alignof($u)"
		for f in ${rest#*:}; do
			arr=0
			case $f in *'[]') arr=1 f=${f%'[]'} ;; esac
			kf=${f%%=*}
			uf=${f#*=}
			expr="offsetof($k, $kf) == offsetof($u, $uf)"
			desc="$name.$kf: offset"
			if [ "$arr" = 0 ]; then
				expr+=" && FSZ_($k, $kf) == FSZ_($u, $uf) && SIGNED_($k, $kf) == SIGNED_($u, $uf)"
				desc+=", size and signedness"
			fi
			emit "$desc" "$expr"
		done
		;;
	value)
		for v in $rest; do
			covered+="UPCIE_$v "
			emit "UPCIE_$v == $v" "(unsigned long)(UPCIE_$v) == (unsigned long)($v)"
		done
		;;
	esac
done <<<"$spec"

n=0
fail=0
$cc -std=gnu11 -fsyntax-only -fmax-errors=0 -isystem "$inc" -I "$root/include" "$src" \
	>"$tmp/cc.log" 2>&1
cc_rc=$?
for i in "${!labels[@]}"; do
	n=$((n + 1))
	line=$((first_line + i))
	if grep -q "uapi_check.c:$line:" "$tmp/cc.log"; then
		echo "not ok $n - ${labels[$i]}"
		grep "uapi_check.c:$line:" "$tmp/cc.log" | head -n 3 | sed 's/^/#   /'
		fail=$((fail + 1))
	else
		echo "ok $n - ${labels[$i]}"
	fi
done
# errors outside the assertions (a header that does not compile) fail the run as well
last_line=$((first_line + ${#labels[@]} - 1))
other=$(grep -E '(fatal )?error:' "$tmp/cc.log" | awk -v f="$first_line" -v l="$last_line" '{
	if (match($0, /uapi_check\.c:[0-9]+:/)) {
		ln = substr($0, RSTART + 13, RLENGTH - 14) + 0
		if (ln >= f && ln <= l)
			next
	}
	print
}')
n=$((n + 1))
if [ -n "$other" ] || { [ "$cc_rc" -ne 0 ] && [ "$fail" -eq 0 ]; }; then
	echo "not ok $n - the generated check compiles against linux-libc-dev $ver"
	if [ -n "$other" ]; then echo "$other"; else cat "$tmp/cc.log"; fi | head -n 20 | sed 's/^/#   /'
	fail=$((fail + 1))
else
	echo "ok $n - the generated check compiles against linux-libc-dev $ver"
fi

# every UPCIE_ macro and upcie_ struct of uapi.h is compared
missing=
for d in $(sed -nE 's/^#define (UPCIE_[A-Z0-9_]+).*/\1/p; s/^struct (upcie_[a-z0-9_]+) \{.*/\1/p' "$uapi"); do
	case $d in UPCIE_VFIO_UAPI_H) continue ;; esac
	case "$covered" in *" $d "*) ;; *) missing+=" $d" ;; esac
done
n=$((n + 1))
if [ -n "$missing" ]; then
	echo "not ok $n - every definition in uapi.h is compared (missing:$missing)"
	fail=$((fail + 1))
else
	echo "ok $n - every definition in uapi.h is compared"
fi
echo "1..$n"
[ "$fail" -eq 0 ]
