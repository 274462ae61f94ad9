#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
#
# upcie guest test bed: boots stock Debian kernels in QEMU (TCG) with emulated
# NVMe controllers, an emulated device-memory BAR ("vram") and optionally an
# emulated VT-d IOMMU, runs test cases inside the guest and checks the files
# that back the emulated devices afterwards. See tests/guest/README.md.
#
# kernel facts (KV, KDIR, MODROOT, ...) come from sourced state files:
# shellcheck disable=SC1090,SC1091,SC2153
set -euo pipefail
shopt -s nullglob

TB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$TB_DIR/../.." && pwd)
readonly TB_DIR REPO
readonly CACHE=${UPCIE_TESTBED_CACHE:-/var/cache/upcie-testbed}
readonly WORK=${UPCIE_TESTBED_WORK:-/var/tmp/upcie-testbed}
readonly K61_SUITES=${UPCIE_TESTBED_K61_SUITES:-bookworm}
readonly K7_SUITES=${UPCIE_TESTBED_K7_SUITES:-trixie trixie-backports}
readonly K7_MIN_MAJOR=${UPCIE_TESTBED_K7_MIN_MAJOR:-7}
readonly OOT_CC=${UPCIE_TESTBED_OOT_CC:-kernel}          # kernel | host
readonly QEMU=${UPCIE_TESTBED_QEMU:-qemu-system-x86_64}
readonly BOOT_TIMEOUT=${UPCIE_TESTBED_BOOT_TIMEOUT:-90}  # seconds on top of the cases' own timeouts
readonly CASE_TIMEOUT=${UPCIE_TESTBED_CASE_TIMEOUT:-120} # default per case, "# timeout: N" overrides
readonly APPEND=${UPCIE_TESTBED_APPEND:-} # extra tb_KEY=VALUE words for the kernel command line
readonly JOBS=${UPCIE_TESTBED_JOBS:-$(nproc)}
# guests never run in parallel on this machine, whatever the cache and work dirs
readonly GUEST_LOCK=${UPCIE_TESTBED_GUEST_LOCK:-/run/lock/upcie-testbed-guests.lock}
readonly CONFIGS=(A B C D)  # what 'run' boots by default
# K: the debug kernel (build-debug; run --config K); U and V: the io_uring dma-buf kernel
# (build-iouring; run --config U), V with identity IOMMU domains; extra tiers, booted only when named
readonly ALL_CONFIGS=(A B C D K U V)
# dmesg lines that fail a case unless the case allows them ("# dmesg-allow: ERE"): warnings and
# BUG reports (KASAN, lockdep, sleeping in atomic context, DMA-API debugging, soft lockups),
# oopses, IOMMU faults, panics, hung tasks
readonly DMESG_BAD='WARNING:|BUG:|Oops|DMAR: \[DMA|general protection fault|Kernel panic|INFO: task .* blocked for more than'
# kernel modules put into every initramfs (with their dependencies), where they exist
readonly GUEST_MODULES="nvme uio_pci_generic vfio_pci vfio_iommu_type1 vgem udmabuf ext4"

# machine configurations: kernel slot, vIOMMU, out-of-tree iommufd/vfio modules; D also has
# the vIOMMU in passthrough (identity default domains), two NUMA nodes and the D-only devices
declare -A CFG_SLOT=([A]=k61 [B]=k61 [C]=k7 [D]=k61 [K]=k7d [U]=k7u [V]=k7u)
declare -A CFG_IOMMU=([A]=0 [B]=1 [C]=1 [D]=1 [K]=1 [U]=1 [V]=1)
# guests are told (tb_oot) whether iommufd and the vfio cdev exist; C gets them from the
# out-of-tree rebuild, K's and U's kernels have them themselves
declare -A CFG_OOT=([A]=0 [B]=0 [C]=1 [D]=0 [K]=1 [U]=1 [V]=1)
declare -A CFG_OOTDIR=([A]=0 [B]=0 [C]=1 [D]=0 [K]=0 [U]=0 [V]=0)
# case timeouts are multiplied by this (KASAN and lockdep under TCG are slow)
declare -A CFG_TSCALE=([A]=1 [B]=1 [C]=1 [D]=1 [K]=${UPCIE_TESTBED_K_TIMEOUT_SCALE:-4} [U]=1 [V]=1)
# QEMU CPU model ('' = QEMU's default): the PCI core allows peer-to-peer DMA through q35's host
# bridge only on AMD Zen (drivers/pci/p2pdma.c), which K and U need for vfio-pci's BAR dma-bufs
declare -A CFG_CPU=([A]= [B]= [C]= [D]= [K]=qemu64,family=23 [U]=qemu64,family=23 [V]=qemu64,family=23)
declare -A CFG_TEXT=(
	[A]="6.1, no IOMMU"
	[B]="6.1, intel-iommu (translating)"
	[C]="7.x, intel-iommu (translating), out-of-tree iommufd + vfio cdev"
	[D]="6.1, intel-iommu passthrough (iommu=pt), 2 NUMA nodes; also NVMe c4 on node 1 (throttled reads) and NVMe c5 + ivshmem vrm2 as one multi-function device (one IOMMU group)"
	[K]="7.x debug kernel (KASAN, lockdep, DMA-API debug; build-debug), intel-iommu, iommufd + vfio cdev"
	[U]="7.x with the io_uring dma-buf registered-buffer series (build-iouring), intel-iommu, iommufd + vfio cdev; also NVMe c6 + ivshmem vrm3 behind one PCIe switch"
	[V]="U's kernel and devices with intel-iommu in passthrough (iommu=pt): peer-to-peer DMA through the switch reaches the BAR"
)

# emulated device layout; the guest learns it from the kernel command line
readonly BDF_C0=0000:00:04.0 BDF_C1=0000:00:05.0 BDF_VRAM=0000:00:06.0
readonly SN_C0=deadbeef SN_C1=cafe0001
# namespaces: name ctrl nsid lba-size metadata-size image-size [more nvme-ns properties]
readonly NAMESPACES=(
	"c0n1 c0 1 512 0 32M"
	"c1n1 c1 1 4096 0 32M"
	"c1n2 c1 2 4096 16 16M"
	"c1n3 c1 3 512 0 8M"
	"c1n4 c1 4 4096 0 8M zoned=on,zoned.zone_size=1M"
	"c1n5 c1 5 4096 8 8M pi=1"
)
readonly VRAM_SIZE=64M PMR_SIZE=16M
# configuration D only: c4 behind a PCIe expander bridge on NUMA node 1, its reads throttled so
# that they stay in flight for seconds; c5 and an ivshmem function as functions 0 and 1 of one
# multi-function device (no ACS: one IOMMU group)
readonly BDF_C4=0000:81:00.0 BDF_C5=0000:00:0a.0 BDF_VRM2=0000:00:0a.1
readonly SN_C4=cafe0004 SN_C5=cafe0005
readonly NAMESPACES_D=(
	"c4n1 c4 1 512 0 8M"
	"c5n1 c5 1 512 0 8M"
)
readonly VRM2_SIZE=16M C4_READ_BPS=262144
# configuration U only: NVMe c6 and ivshmem vrm3 behind one PCIe switch (a root port, an x3130
# upstream port, two xio3130 downstream ports), for peer-to-peer DMA through a switch
readonly BDF_C6=0000:03:00.0 BDF_VRM3=0000:04:00.0 SN_C6=cafe0006 VRM3_SIZE=16M
readonly NAMESPACES_U=("c6n1 c6 1 512 0 8M")
cfg_switch() { [ "$1" = U ] || [ "$1" = V ]; } # CONFIG : whether it has c6 + vrm3 behind the switch
# The faulty controller c2, only on boots of cases that ask for it ("# devices: faulty"): c2n1
# fails reads and writes at fixed sectors (QEMU blkdebug, errno EIO: QEMU posts Unrecovered Read
# Error and Write Fault), c2n2 is throttled to C2_IOPS commands per second (slow commands).
readonly BDF_C2=0000:00:07.0 SN_C2=fa170001
readonly NAMESPACES_FAULTY=(
	"c2n1 c2 1 512 0 8M"
	"c2n2 c2 2 512 0 8M"
)
readonly C2_RERR=8192 C2_WERR=12288 C2_IOPS=20 # 512-byte sectors; commands per second
# Controller c3 in an NVM subsystem (QEMU nvme-subsys: namespace attachment works), only on boots
# of cases that ask for it ("# devices: subsys"): two shared namespaces of 8 MiB, 512 B LBAs.
readonly BDF_C3=0000:00:08.0 SN_C3=cafe0003
readonly NAMESPACES_SUBSYS=(
	"c3n1 c3 1 512 0 8M"
	"c3n2 c3 2 512 0 8M"
)
# Controller c7, an SR-IOV physical function in an NVM subsystem of its own, only on boots of
# cases that ask for it ("# devices: sriov"): two VFs (00:0c.1, 00:0c.2) with 4 queue and 2
# interrupt flexible resources each, two shared namespaces of 8 MiB, 512 B LBAs.
readonly BDF_C7=0000:00:0c.0 SN_C7=cafe0007
readonly NAMESPACES_SRIOV=(
	"c7n1 c7 1 512 0 8M"
	"c7n2 c7 2 512 0 8M"
)
# Seven more plain controllers s1..s7 (with c0: eight), only on boots of cases that ask for them
# ("# devices: scale"): one namespace of 8 MiB, 512 B LBAs each, at slots 10..16 of the root bus.
readonly SCALE_N=7
readonly NAMESPACES_SCALE=(
	"s1n1 s1 1 512 0 8M" "s2n1 s2 1 512 0 8M" "s3n1 s3 1 512 0 8M" "s4n1 s4 1 512 0 8M"
	"s5n1 s5 1 512 0 8M" "s6n1 s6 1 512 0 8M" "s7n1 s7 1 512 0 8M"
)

# ---------------------------------------------------------------------------
# small helpers

log()  { printf 'testbed: %s\n' "$*" >&2; }
warn() { printf 'testbed: warning: %s\n' "$*" >&2; }
die()  { printf 'testbed: error: %s\n' "$*" >&2; exit 2; }

now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

PHASES=()
T_START=$(now)
phase() { # NAME CMD... : run a phase and record its duration (a failing phase exits)
	local name=$1 t0
	shift
	t0=$(now)
	log "== $name"
	"$@"
	PHASES+=("$name $(secs "$t0" "$(now)")")
	log "== $name done in $(secs "$t0" "$(now)") s"
}
print_phases() {
	local p
	for p in "${PHASES[@]}"; do
		printf 'phase %-10s %7s s\n' "${p%% *}" "${p##* }"
	done
	printf 'phase %-10s %7s s\n' total "$(secs "$T_START" "$(now)")"
}

retry() { # CMD... : up to 3 attempts with a growing pause
	local n=1
	until "$@"; do
		if [ "$n" -ge 3 ]; then
			return 1
		fi
		warn "attempt $n of '$1 ...' failed; retrying in $((n * 5)) s"
		sleep $((n * 5))
		n=$((n + 1))
	done
}

logged() { # LOGFILE CMD... : append output to LOGFILE, show its tail on failure
	local lf=$1 rc=0
	shift
	mkdir -p "$(dirname "$lf")"
	printf '+ %s\n' "$*" >>"$lf"
	"$@" >>"$lf" 2>&1 || rc=$?
	if [ "$rc" -ne 0 ]; then
		if [ $# -gt 6 ]; then
			warn "command failed (status $rc): $1 ... ${*: -1} (full command in the log)"
		else
			warn "command failed (status $rc): $*"
		fi
		tail -n 25 "$lf" | sed 's/^/    /' >&2
		warn "full log: $lf"
	fi
	return "$rc"
}

need_tools() {
	local t missing=()
	for t in "$@"; do
		command -v "$t" >/dev/null 2>&1 || missing+=("$t")
	done
	if [ "${#missing[@]}" -gt 0 ]; then
		die "missing host tools: ${missing[*]} (Debian: apt-get install -y qemu-system-x86 busybox-static kmod cpio xz-utils zstd gcc make libc6-dev binutils)"
	fi
}

LOCKED=" "
declare -A LOCK_FD=()
lock() { # DIR : one testbed.sh at a time per cache/work dir (guests must not run in parallel)
	local fd
	[[ $LOCKED == *" $1 "* ]] && return 0
	mkdir -p "$1"
	exec {fd}>"$1/.lock"
	if ! flock -n "$fd"; then
		log "waiting for another testbed.sh to release $1"
		flock -w 3600 "$fd" || die "could not lock $1"
	fi
	LOCKED+="$1 "
	LOCK_FD[$1]=$fd
}

unlock() { # DIR : release a lock taken with lock (no-op when not held)
	local fd=${LOCK_FD[$1]:-}
	[ -n "$fd" ] || return 0
	flock -u "$fd"
	exec {fd}>&-
	unset "LOCK_FD[$1]"
	LOCKED=${LOCKED/ $1 / }
}

lock_guests() {
	local fd
	[[ $LOCKED == *" guests "* ]] && return 0
	mkdir -p "$(dirname "$GUEST_LOCK")"
	exec {fd}>"$GUEST_LOCK"
	if ! flock -n "$fd"; then
		log "waiting for the guests of another testbed.sh to finish ($GUEST_LOCK)"
		flock -w 3600 "$fd" || die "could not lock $GUEST_LOCK"
	fi
	LOCKED+="guests "
}

# ---------------------------------------------------------------------------
# private apt configuration: <cache>/apt/<set>/{sources.list,lists,cache}

mirror_uri() {
	local uri=
	if [ -n "${UPCIE_TESTBED_MIRROR:-}" ]; then
		echo "$UPCIE_TESTBED_MIRROR"
		return
	fi
	if [ -r /etc/apt/sources.list.d/debian.sources ]; then
		uri=$(awk '/^URIs:/ { for (i = 2; i <= NF; i++) if ($i !~ /security/) { print $i; exit } }' \
			/etc/apt/sources.list.d/debian.sources)
	fi
	if [ -z "$uri" ] && [ -r /etc/apt/sources.list ]; then
		uri=$(awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { if ($i !~ /security/) { print $i; exit } break } }' \
			/etc/apt/sources.list)
	fi
	[ -n "$uri" ] || die "no Debian mirror found in /etc/apt/sources.list.d/debian.sources (URIs:) or /etc/apt/sources.list; set UPCIE_TESTBED_MIRROR"
	echo "$uri"
}

APT_O=()
apt_set() { # SET : select the private apt configuration SET
	local d=$CACHE/apt/$1
	APT_O=(-o "Dir::Etc::SourceList=$d/sources.list" -o Dir::Etc::SourceParts=/dev/null
		-o Dir::Etc::Preferences=/dev/null -o Dir::Etc::PreferencesParts=/dev/null
		-o "Dir::State::Lists=$d/lists" -o "Dir::Cache=$d/cache"
		-o Dir::Cache::pkgcache=pkgcache.bin -o Dir::Cache::srcpkgcache=srcpkgcache.bin
		-o APT::Architecture=amd64 -o APT::Architectures=amd64
		-o Acquire::Languages=none -o APT::Sandbox::User=root -o Acquire::Retries=2)
}

MIRROR=
apt_update() { # SET SUITES... (MIRROR set)
	local set=$1 d=$CACHE/apt/$1 uri=$MIRROR s
	shift
	mkdir -p "$d/lists/partial" "$d/cache/archives/partial"
	for s in "$@"; do
		echo "deb $uri $s main"
	done >"$d/sources.list.new"
	mv "$d/sources.list.new" "$d/sources.list"
	apt_set "$set"
	log "apt update ($set: $* from $uri)"
	# --error-on=any: an unreachable mirror is an error, not a warning
	retry logged "$CACHE/logs/apt.log" apt-get "${APT_O[@]}" -q --error-on=any update
}

pkg_ver() { # PKG : candidate version in the selected set ('' if none)
	apt-cache "${APT_O[@]}" show --no-all-versions "$1" 2>/dev/null | awk '/^Version:/ { print $2; exit }'
}

apt_download() { # DIR PKG[=VER]... : download .debs into DIR (no install)
	local dir=$1
	shift
	mkdir -p "$dir"
	(cd "$dir" && retry logged "$CACHE/logs/apt.log" apt-get "${APT_O[@]}" -q download "$@")
}

# ---------------------------------------------------------------------------
# kernels

state_file() { echo "$CACHE/state/$1.env"; }

load_state() { # SLOT : source the kernel facts of SLOT (k61, k7)
	local f
	f=$(state_file "$1")
	[ -r "$f" ] || die "no $1 kernel in $CACHE yet: run '$0 fetch' first"
	. "$f"
	[ -f "$KDIR/.ready" ] || die "kernel cache $KDIR is incomplete: run '$0 fetch' again"
}

extract_vmlinux() { # BZIMAGE OUT : uncompressed ELF vmlinux (PVH-bootable) from a bzImage
	local bz=$1 out=$2 magic cmd off
	for magic in 'xz:\xfd\x37\x7a\x58\x5a\x00' 'zstd:\x28\xb5\x2f\xfd' 'gzip:\x1f\x8b\x08'; do
		cmd=${magic%%:*}
		for off in $(LC_ALL=C grep -obUaP "${magic#*:}" "$bz" | head -n 8 | cut -d: -f1); do
			# the compressed payload is followed by other data: the decompressor
			# complains about it after writing the kernel, so judge by the output
			tail -c "+$((off + 1))" "$bz" | "$cmd" -dc >"$out" 2>/dev/null || true
			if [ "$(head -c 4 "$out" | od -An -tx1 | tr -d ' \n')" = 7f454c46 ]; then
				if readelf -n "$out" 2>/dev/null | grep -q 'Xen.*(0x00000012)'; then  # XEN_ELFNOTE_PHYS32_ENTRY
					return 0
				fi
				warn "$bz: the ELF kernel has no PVH note"
				rm -f "$out"
				return 1
			fi
		done
	done
	rm -f "$out"
	return 1
}

unpack_kernel() { # SLOT KV PKGVER PKG... : download + unpack into the cache, write the slot state
	local slot=$1 kv=$2 ver=$3 key dir tmp deb moddir bz cfg vml=
	shift 3
	key="${kv}_${ver//:/%}"
	dir=$CACHE/kernels/$key
	if [ -f "$dir/.ready" ]; then
		log "kernel $kv ($ver) is cached"
	else
		log "fetching kernel $kv ($ver): $*"
		tmp=$CACHE/tmp/kernel-$key
		rm -rf "$tmp"
		mkdir -p "$tmp/root"
		apt_download "$tmp/debs" "${@/%/=$ver}" || die "download of $* failed"
		for deb in "$tmp"/debs/*.deb; do
			dpkg -x "$deb" "$tmp/root"
		done
		rm -rf "$tmp/debs"
		if [ ! -e "$tmp/root/lib" ]; then
			ln -s usr/lib "$tmp/root/lib" # 7.x ships /usr/lib/modules only
		fi
		moddir=$tmp/root/lib/modules/$kv
		[ -d "$moddir" ] || die "$kv: no lib/modules/$kv in the packages"
		for bz in "$tmp/root/boot/vmlinuz-$kv" "$moddir/vmlinuz.unsigned" "$moddir/vmlinuz" ""; do
			[ -f "$bz" ] && break
		done
		[ -n "$bz" ] || die "$kv: no vmlinuz in the packages"
		for cfg in "$tmp/root/boot/config-$kv" "$moddir/config" ""; do
			[ -f "$cfg" ] && break
		done
		logged "$CACHE/logs/fetch.log" depmod -b "$tmp/root" "$kv" || die "depmod failed for $kv"
		if extract_vmlinux "$bz" "$tmp/vmlinux"; then
			vml=vmlinux
		else
			warn "$kv: could not extract a PVH vmlinux; guests boot the bzImage (slower)"
		fi
		{
			echo "KV=$kv"
			echo "PKGVER=$ver"
			echo "BZIMAGE_REL=${bz#"$tmp/"}"
			echo "CONFIG_REL=${cfg#"$tmp/"}"
			echo "VMLINUX_REL=$vml"
		} >"$tmp/kernel.env"
		touch "$tmp/.ready"
		rm -rf "$dir"
		mkdir -p "$CACHE/kernels"
		mv "$tmp" "$dir"
		log "kernel $kv unpacked to $dir"
	fi
	. "$dir/kernel.env"
	mkdir -p "$CACHE/state"
	{
		printf 'KV=%q\n' "$kv"
		printf 'PKGVER=%q\n' "$ver"
		printf 'KDIR=%q\n' "$dir"
		printf 'MODROOT=%q\n' "$dir/root"
		printf 'BZIMAGE=%q\n' "$dir/$BZIMAGE_REL"
		printf 'KCONFIG=%q\n' "$dir/$CONFIG_REL"
		printf 'VMLINUX=%q\n' "${VMLINUX_REL:+$dir/$VMLINUX_REL}"
		printf 'SUITES=%q\n' "$(cat "$CACHE/apt/$slot/suites" 2>/dev/null || true)"
	} >"$(state_file "$slot").new"
	mv "$(state_file "$slot").new" "$(state_file "$slot")"
}

resolve_k61() { # -> "KV PKGVER PKG"
	local pkg ver
	pkg=$(apt-cache "${APT_O[@]}" depends --no-recommends --no-suggests --no-conflicts --no-breaks \
		--no-replaces --no-enhances linux-image-amd64 2>/dev/null |
		awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { print $2; exit }')
	[ -n "$pkg" ] || return 1
	ver=$(pkg_ver "$pkg")
	[ -n "$ver" ] || return 1
	echo "${pkg#linux-image-} $ver $pkg"
}

resolve_k7() { # -> "KV PKGVER" : newest generic amd64 kernel >= K7_MIN_MAJOR with the split
	# packaging and everything the out-of-tree build needs, all of one version
	local kv abi mm ver p ok
	for kv in $(apt-cache "${APT_O[@]}" pkgnames linux-modules- 2>/dev/null |
		sed -n 's/^linux-modules-\([0-9][^-]*-amd64\)$/\1/p' | sort -rV); do
		[ "${kv%%.*}" -ge "$K7_MIN_MAJOR" ] 2>/dev/null || continue
		abi=${kv%-amd64}
		mm=$(echo "$kv" | cut -d. -f1-2)
		ver=$(pkg_ver "linux-modules-$kv")
		[ -n "$ver" ] || continue
		ok=1
		for p in "linux-base-$kv" "linux-binary-unsigned-$kv" "linux-headers-$kv" \
			"linux-headers-$abi-common" "linux-kbuild-$abi" "linux-source-$mm"; do
			if [ "$(pkg_ver "$p")" != "$ver" ]; then
				ok=0
				log "skipping $kv: $p is not at version $ver"
				break
			fi
		done
		if [ "$ok" = 1 ]; then
			echo "$kv $ver"
			return 0
		fi
	done
	return 1
}

fetch_slot() { # SLOT SUITES
	local slot=$1 suites=$2 r kv ver pkg
	mkdir -p "$CACHE/apt/$slot"
	# shellcheck disable=SC2086
	if ! apt_update "$slot" $suites; then
		if [ -r "$(state_file "$slot")" ]; then
			warn "apt update failed for $slot; using the cached kernel"
			load_state "$slot"
			return 0
		fi
		die "apt update failed for $slot ($suites) and nothing is cached"
	fi
	echo "$suites" >"$CACHE/apt/$slot/suites"
	case $slot in
	k61)
		r=$(resolve_k61) || die "could not resolve bookworm's linux-image-amd64 dependency"
		read -r kv ver pkg <<<"$r"
		unpack_kernel k61 "$kv" "$ver" "$pkg"
		;;
	k7)
		r=$(resolve_k7) || die "no ${K7_MIN_MAJOR}.x kernel with split packaging, headers, kbuild and source in: $suites"
		read -r kv ver <<<"$r"
		unpack_kernel k7 "$kv" "$ver" "linux-base-$kv" "linux-binary-unsigned-$kv" "linux-modules-$kv"
		;;
	esac
	log "$slot: $kv ($ver)"
}

prune_cache() { # drop kernels, builds and scratch not referenced by the current state
	local keep=() d k s
	for s in k61 k7; do
		[ -r "$(state_file "$s")" ] || continue
		keep+=("$(. "$(state_file "$s")"; basename "$KDIR")")
	done
	for d in "$CACHE"/kernels/* "$CACHE"/oot/* "$CACHE"/kbuild/* "$CACHE"/uapi/*; do
		k=$(basename "$d")
		if [[ " ${keep[*]} " != *" $k "* ]]; then
			log "pruning stale cache entry $d"
			rm -rf "$d"
		fi
	done
	# debug kernels (build-debug) are named after the 7.x kernel they come from
	for d in "$CACHE"/debug/*; do
		k=$(basename "$d")
		[ -r "$(state_file k7)" ] && [[ $k == "$(. "$(state_file k7)"; basename "$KDIR")"* ]] && continue
		log "pruning stale cache entry $d"
		rm -rf "$d"
	done
	for d in "$CACHE"/iouring/*; do
		[ -e "$d" ] || continue
		k=$(basename "$d")
		[ -r "$(state_file k7)" ] && [ "$k" = "$(. "$(state_file k7)"; basename "$KDIR")" ] && continue
		log "pruning stale cache entry $d"
		rm -rf "$d"
	done
	for s in k7d k7u; do
		if [ -r "$(state_file $s)" ] && [ ! -d "$(. "$(state_file $s)"; echo "$KDIR")" ]; then
			rm -f "$(state_file $s)"
		fi
	done
	rm -rf "$CACHE/tmp"
}

cmd_fetch() {
	need_tools apt-get apt-cache dpkg depmod modprobe xz zstd readelf
	lock "$CACHE"
	MIRROR=$(mirror_uri)
	fetch_slot k61 "$K61_SUITES"
	fetch_slot k7 "$K7_SUITES"
	prune_cache
}

# ---------------------------------------------------------------------------
# out-of-tree iommufd + vfio (cdev) for the 7.x kernel

host_glibc() { getconf GNU_LIBC_VERSION | awk '{ print $2 }'; }

wrap_newer_glibc() { # DIR RUNTIME : run ELF programs under DIR that need a newer glibc
	# than the host's through RUNTIME's dynamic loader and libraries
	local dir=$1 rt=$2 have ld libpath f need n=0
	have=$(host_glibc)
	ld=$(find "$rt" -name 'ld-linux-x86-64.so.2' -type f | head -n 1)
	[ -n "$ld" ] || die "no ld-linux-x86-64.so.2 in $rt"
	libpath=$(find "$rt" -name 'libc.so.6' -type f -printf '%h\n' | head -n 1)
	[ -d "$rt/usr/lib/x86_64-linux-gnu" ] && libpath+=":$rt/usr/lib/x86_64-linux-gnu"
	[ -d "$rt/lib/x86_64-linux-gnu" ] && libpath+=":$rt/lib/x86_64-linux-gnu"
	while IFS= read -r -d '' f; do
		case $f in *.real) continue ;; esac
		[ "$(head -c 4 "$f" | od -An -tx1 | tr -d ' \n')" = 7f454c46 ] || continue
		readelf -l "$f" 2>/dev/null | grep -q 'program interpreter' || continue
		need=$(objdump -T "$f" 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -n 1)
		[ -n "$need" ] || continue
		[ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | tail -n 1)" = "$have" ] && continue
		mv "$f" "$f.real"
		# shellcheck disable=SC2016
		printf '#!/bin/sh\nexec %q --library-path %q --argv0 "$0" %q "$@"\n' "$ld" "$libpath" "$f.real" >"$f"
		chmod +x "$f"
		n=$((n + 1))
	done < <(find "$dir" -type f -perm -u+x -print0)
	log "wrapped $n programs under $dir (they need a glibc newer than the host's $have)"
}

kbuild_env() { # KEY : headers + kbuild + compiler + source subset for the k7 kernel -> $CACHE/kbuild/KEY
	local key=$1 env=$CACHE/kbuild/$1 tmp abi mm hdr cc_text gccn gccv roots pkgs p v dl deb
	if [ -f "$env/.ready" ]; then
		return 0
	fi
	abi=${KV%-amd64}
	mm=$(echo "$KV" | cut -d. -f1-2)
	tmp=$CACHE/tmp/kbuild-$key
	rm -rf "$tmp"
	mkdir -p "$tmp/root" "$tmp/toolroot" "$tmp/src"
	apt_set k7
	dl=$tmp/debs
	apt_download "$dl/hdr" "linux-headers-$KV=$PKGVER" "linux-headers-$abi-common=$PKGVER" \
		"linux-kbuild-$abi=$PKGVER" || die "download of the $KV headers failed"
	for deb in "$dl"/hdr/*.deb; do
		dpkg -x "$deb" "$tmp/root"
	done
	hdr=$tmp/root/usr/src/linux-headers-$KV
	[ -f "$hdr/Makefile" ] || die "no $hdr/Makefile"
	# the package Makefile refers to /usr/src/...: point it at the unpacked tree
	sed -i "s|/usr/src/|$env/root/usr/src/|g" "$hdr/Makefile"

	cc_text=$(sed -n 's/^CONFIG_CC_VERSION_TEXT="\(.*\)"$/\1/p' "$hdr/.config")
	log "$KV was built with: $cc_text"
	# runtime (loader, libc, libelf, ...) of the kernel's suite for kbuild's host tools
	roots="libc6 libelf1t64 zlib1g libzstd1"
	gccn=$(echo "$cc_text" | sed -n 's/.*gcc-\([0-9][0-9]*\) .*/\1/p')
	gccv=$(echo "$cc_text" | sed -n 's/.*(Debian \([^)]*\)).*/\1/p')
	if [ "$OOT_CC" = kernel ]; then
		[ -n "$gccn" ] || die "cannot parse the compiler of $KV from '$cc_text' (set UPCIE_TESTBED_OOT_CC=host)"
		roots+=" gcc-$gccn-x86-64-linux-gnu"
	fi
	# shellcheck disable=SC2086
	pkgs=$(apt-cache "${APT_O[@]}" depends --recurse --no-recommends --no-suggests --no-conflicts \
		--no-breaks --no-replaces --no-enhances $roots 2>/dev/null | grep -v '^ ' | grep -v '^<' | sort -u)
	set --
	for p in $pkgs; do
		v=$(pkg_ver "$p")
		case $p in
		gcc-"$gccn"-* | cpp-"$gccn"-* | libgcc-"$gccn"-dev)
			# the kernel's exact compiler when the archive still has it
			if [ -n "$gccv" ] && apt-cache "${APT_O[@]}" show "$p=$gccv" >/dev/null 2>&1; then
				v=$gccv
			elif [ -n "$gccv" ]; then
				warn "$p $gccv (the kernel's compiler) is gone from the archive; using $v"
			fi
			;;
		esac
		set -- "$@" "$p=$v"
	done
	apt_download "$dl/tools" "$@" || die "download of the build tools failed"
	for deb in "$dl"/tools/*.deb; do
		dpkg -x "$deb" "$tmp/toolroot"
	done

	apt_download "$dl/src" "linux-source-$mm=$PKGVER" || die "download of linux-source-$mm failed"
	deb=$(echo "$dl"/src/linux-source-"$mm"_*.deb)
	# only the parts the rebuild needs
	dpkg-deb --fsys-tarfile "$deb" | tar -xO --wildcards '*/linux-source-*.tar.xz' |
		tar -xJ -C "$tmp/src" --wildcards "linux-source-$mm/drivers/iommu/*" \
			"linux-source-$mm/drivers/vfio/*" "linux-source-$mm/lib/interval_tree.c" ||
		die "cannot unpack linux-source-$mm"
	rm -rf "$dl"

	# the tree is used from its final place: wrappers and Makefile carry absolute paths
	rm -rf "$env"
	mkdir -p "$CACHE/kbuild"
	mv "$tmp" "$env"
	wrap_newer_glibc "$env/root/usr/lib/linux-kbuild-$abi" "$env/toolroot"
	wrap_newer_glibc "$env/toolroot/usr/bin" "$env/toolroot"
	wrap_newer_glibc "$env/toolroot/usr/libexec" "$env/toolroot"
	{
		printf 'HDR=%q\n' "$env/root/usr/src/linux-headers-$KV"
		printf 'SRC=%q\n' "$env/src/linux-source-$mm"
		printf 'TOOLBIN=%q\n' "$env/toolroot/usr/bin"
		printf 'CC_TEXT=%q\n' "$cc_text"
	} >"$env/kbuild.env"
	touch "$env/.ready"
}

oot_kbuild_file() { # SRC HDRCONFIG : the Kbuild of the rebuild
	local src=$1 config=$2 d m
	cat <<'EOF'
# generated by tests/guest/testbed.sh: iommufd + the vfio stack, rebuilt with
# CONFIG_IOMMUFD=m and CONFIG_VFIO_DEVICE_CDEV=y (no Debian kernel enables them)
CONFIG_IOMMUFD := m
CONFIG_VFIO_DEVICE_CDEV := y
ccflags-y += -DCONFIG_IOMMUFD_MODULE=1 -DCONFIG_IOMMUFD_DRIVER_CORE_MODULE=1
ccflags-y += -DCONFIG_VFIO_DEVICE_CDEV=1 -DCONFIG_INTERVAL_TREE_SPAN_ITER=1
EOF
	# the object lists come from the source's own Makefiles, evaluated by make
	for d in "drivers/iommu/iommufd iommufd iommufd_driver" "drivers/vfio vfio vfio_iommu_type1" \
		"drivers/vfio/pci vfio-pci-core vfio-pci"; do
		# shellcheck disable=SC2086
		set -- $d
		local dir=$1
		shift
		echo "# from $dir/Makefile"
		for m in "$@"; do
			if [ "$m" = vfio_iommu_type1 ]; then
				echo "obj-m += vfio_iommu_type1.o"
				echo "vfio_iommu_type1-y := $dir/vfio_iommu_type1.o"
				continue
			fi
			if [ "$m" = iommufd_driver ] && ! grep -q '^iommufd_driver-' "$src/$dir/Makefile"; then
				continue
			fi
			echo "obj-m += $m.o"
			# joined continuation lines; only "<module>-y/-m/-$(CONFIG_...) :=/+=" lines
			sed -e ':a' -e '/\\$/N; s/\\\n/ /; ta' "$src/$dir/Makefile" |
				grep -E "^$m-(y|m|objs|\\\$\\(CONFIG_[A-Z0-9_]+\\))[[:space:]]*[:+]?=" || true
			echo "$m-y := \$(addprefix $dir/,\$($m-y))"
			echo "$m-m := \$(addprefix $dir/,\$($m-m))"
		done
	done
	if ! grep -q '^CONFIG_INTERVAL_TREE_SPAN_ITER=y' "$config"; then
		echo "# lib/interval_tree.c's span iterator is only built when IOMMUFD selects it"
		echo "iommufd-y += span_iter.o"
	fi
}

cmd_build_oot() {
	need_tools make gcc dpkg-deb tar objdump readelf strip modinfo
	lock "$CACHE"
	load_state k7
	local key out tmp log mk=() f
	key=$(basename "$KDIR")
	out=$CACHE/oot/$key
	if [ -f "$out/.ready" ]; then
		log "out-of-tree iommufd/vfio for $KV is cached: $out"
		return 0
	fi
	kbuild_env "$key"
	. "$CACHE/kbuild/$key/kbuild.env"
	tmp=$CACHE/tmp/oot-$key
	rm -rf "$tmp"
	mkdir -p "$tmp/drivers/iommu" "$tmp/drivers/vfio/pci"
	cp -r "$SRC/drivers/iommu/iommufd" "$tmp/drivers/iommu/"
	cp "$SRC"/drivers/iommu/*.h "$tmp/drivers/iommu/"
	cp "$SRC"/drivers/vfio/*.[ch] "$SRC/drivers/vfio/Makefile" "$tmp/drivers/vfio/"
	cp "$SRC"/drivers/vfio/pci/*.[ch] "$SRC/drivers/vfio/pci/Makefile" "$tmp/drivers/vfio/pci/"
	{
		echo '// SPDX-License-Identifier: GPL-2.0-only'
		echo '/* lib/interval_tree.c span iterator, carried by iommufd.ko (generated) */'
		echo '#include <linux/interval_tree.h>'
		echo '#include <linux/export.h>'
		sed -n '/^#ifdef CONFIG_INTERVAL_TREE_SPAN_ITER/,$p' "$SRC/lib/interval_tree.c"
	} >"$tmp/span_iter.c"
	oot_kbuild_file "$SRC" "$HDR/.config" >"$tmp/Kbuild"
	mk=(make -C "$HDR" M="$tmp" -j"$JOBS" CONFIG_DEBUG_INFO_BTF_MODULES=)
	if [ "$OOT_CC" = host ]; then
		mk+=(CC=gcc-12 CONFIG_CC_HAS_MIN_FUNCTION_ALIGNMENT=)
	fi
	log "building iommufd + vfio for $KV ($([ "$OOT_CC" = host ] && echo "host gcc-12" || echo "$CC_TEXT"))"
	log=$tmp/build.log
	PATH="$TOOLBIN:$PATH" logged "$log" "${mk[@]}" modules || die "out-of-tree build failed (log: $log)"
	if grep -E 'ERROR:|WARNING: modpost: .*undefined' "$log"; then
		die "modpost reported problems (log: $log)"
	fi
	mkdir -p "$tmp/out"
	for f in "$tmp"/*.ko; do
		strip --strip-debug -o "$tmp/out/$(basename "$f")" "$f"
		case $(modinfo -F vermagic "$f") in
		"$KV "*) ;;
		*) die "$f: vermagic '$(modinfo -F vermagic "$f")' does not match $KV" ;;
		esac
	done
	for f in iommufd vfio vfio-pci vfio-pci-core vfio_iommu_type1; do
		[ -f "$tmp/out/$f.ko" ] || die "the rebuild did not produce $f.ko (log: $log)"
	done
	cp "$log" "$tmp/Kbuild" "$tmp/out/"
	echo "$CC_TEXT" >"$tmp/out/compiler"
	rm -rf "$out"
	mkdir -p "$CACHE/oot"
	mv "$tmp/out" "$out"
	rm -rf "$tmp"
	touch "$out/.ready"
	log "out-of-tree modules for $KV: $(cd "$out" && echo *.ko)"
}

# ---------------------------------------------------------------------------
# kernels built from Debian's linux-source of the 7.x slot, configured from allnoconfig with a
# fragment of exactly the options the guests need (KCONFIG_ALLCONFIG) and built with the host's
# gcc. Too slow for every CI run on a small machine: extra tiers, built on request.
# K: the debug kernel (tests/guest/debug.config: KASAN, lockdep, ...).
# U: the io_uring dma-buf kernel (tests/guest/iouring.config), the source patched with the
#    io_uring dma-buf registered-buffer series by tests/guest/tools/iouring-port.py; the series'
#    patches are read from UPCIE_TESTBED_IOURING_SERIES (default: ../shared/field/
#    iouring-dmabuf-v3 beside the repository) and never stored here.

k7_source() { # -> SRC: the 7.x slot's linux-source, unpacked once into the cache (shared)
	local kkey mm srcdir deb
	load_state k7
	mm=$(echo "$KV" | cut -d. -f1-2)
	kkey=$(basename "$KDIR")
	srcdir=$CACHE/debug/$kkey-src
	SRC=$srcdir/linux-source-$mm
	[ -f "$srcdir/.ready" ] && return 0
	log "fetching linux-source-$mm ($PKGVER)"
	rm -rf "$srcdir"
	(
		lock "$CACHE" # the private apt configuration is shared
		apt_set k7
		apt_download "$srcdir/debs" "linux-source-$mm=$PKGVER"
	) || die "download of linux-source-$mm failed"
	deb=$(echo "$srcdir"/debs/linux-source-"$mm"_*.deb)
	dpkg-deb --fsys-tarfile "$deb" | tar -xO --wildcards '*/linux-source-*.tar.xz' |
		tar -xJ -C "$srcdir" || die "cannot unpack linux-source-$mm"
	rm -rf "$srcdir/debs"
	touch "$srcdir/.ready"
}

build_kernel() { # SLOT FRAG DIR SRC WHAT : configure + build in DIR/build, write SLOT's state
	local slot=$1 frag=$2 dir=$3 src=$4 what=$5 log line opt want got kv t0 pkgver=$PKGVER suites=$SUITES
	if [ ! -f "$dir/.ready" ]; then
		log "configuring the $what ($frag)"
		mkdir -p "$dir/build"
		log=$dir/build.log
		logged "$log" make -C "$src" O="$dir/build" ARCH=x86_64 KCONFIG_ALLCONFIG="$frag" allnoconfig ||
			die "allnoconfig failed (log: $log)"
		while IFS= read -r line; do
			case $line in CONFIG_*=*) ;; *) continue ;; esac
			opt=${line%%=*}
			want=${line#*=}
			got=$(grep -E "^$opt=|^# $opt is not set" "$dir/build/.config" | head -n 1 || true)
			if [ "$want" = n ]; then
				[ -z "$got" ] || [[ $got == "# $opt is not set" ]] || die "$what: $opt is '$got', wanted n"
			elif [ "$got" != "$opt=$want" ]; then
				die "$what: Kconfig dropped $line (got '${got:-nothing}'): a dependency is missing in $frag"
			fi
		done <"$frag"
		t0=$(now)
		log "building the $what (nice; log: $log)"
		# incremental: an interrupted build resumes where it stopped
		logged "$log" nice -n 19 make -C "$src" O="$dir/build" ARCH=x86_64 -j"$JOBS" vmlinux modules ||
			die "$what build failed (log: $log)"
		kv=$(make -s -C "$src" O="$dir/build" ARCH=x86_64 kernelrelease)
		rm -rf "$dir/root"
		logged "$log" make -C "$src" O="$dir/build" ARCH=x86_64 INSTALL_MOD_PATH="$dir/root" \
			INSTALL_MOD_STRIP=1 DEPMOD=/sbin/depmod modules_install || die "modules_install failed (log: $log)"
		rm -f "$dir/root/lib/modules/$kv/build" "$dir/root/lib/modules/$kv/source"
		readelf -n "$dir/build/vmlinux" | grep -q 'Xen.*(0x00000012)' || die "the $what vmlinux has no PVH note"
		strip --strip-debug -o "$dir/vmlinux" "$dir/build/vmlinux"
		printf 'KV=%q\n' "$kv" >"$dir/kernel.env"
		log "$what $kv built in $(secs "$t0" "$(now)") s"
		touch "$dir/.ready"
	fi
	. "$dir/kernel.env"
	{
		printf 'KV=%q\n' "$KV"
		printf 'PKGVER=%q\n' "$pkgver"
		printf 'KDIR=%q\n' "$dir"
		printf 'MODROOT=%q\n' "$dir/root"
		printf 'BZIMAGE=\n'
		printf 'KCONFIG=%q\n' "$dir/build/.config"
		printf 'VMLINUX=%q\n' "$dir/vmlinux"
		printf 'SUITES=%q\n' "$suites"
	} >"$(state_file "$slot").new"
	mv "$(state_file "$slot").new" "$(state_file "$slot")"
}

cmd_build_debug() {
	need_tools make gcc flex bison bc dpkg-deb tar xz depmod
	local frag=$TB_DIR/debug.config key dir
	# not the cache lock: other test bed commands must not wait for a build of this length
	lock "$CACHE/debug"
	k7_source
	# named after the options, so that editing the comments does not rebuild
	key="$(basename "$KDIR")-$(grep '^CONFIG_' "$frag" | sha256sum | cut -c1-12)"
	dir=$CACHE/debug/$key
	build_kernel k7d "$frag" "$dir" "$SRC" "debug kernel"
	log "configuration K: kernel $KV ($dir)"
}

cmd_build_iouring() {
	need_tools make gcc flex bison bc dpkg-deb tar xz depmod patch python3 cmp
	local frag=$TB_DIR/iouring.config port=$TB_DIR/tools/iouring-port.py dir src stamp f
	local series=${UPCIE_TESTBED_IOURING_SERIES:-$REPO/../shared/field/iouring-dmabuf-v3}
	local patches=("$series"/[0-9][0-9][0-9][0-9]-*.patch)
	[ -f "${patches[0]:-}" ] || die "no io_uring dma-buf series in $series (set UPCIE_TESTBED_IOURING_SERIES)"
	mkdir -p "$CACHE/iouring"
	lock "$CACHE/iouring"
	k7_source
	# one tree per 7.x kernel, updated in place: a changed series, port or fragment rewrites
	# only the files whose content changed, so the rebuild is incremental
	dir=$CACHE/iouring/$(basename "$KDIR")
	src=$dir/src/$(basename "$SRC")
	stamp=$( (cat "$series"/[0-9][0-9][0-9][0-9]-*.patch "$port" "$frag") | sha256sum | cut -c1-16)
	if [ "$(cat "$dir/port.stamp" 2>/dev/null)" != "$stamp" ]; then
		rm -f "$dir/.ready"
		rm -rf "$dir/stage"
		mkdir -p "$dir/stage" "$dir/src"
		log "patching a copy of $(basename "$SRC") with $series"
		cp -a "$SRC" "$dir/stage/"
		python3 "$port" "$series" "$dir/stage/$(basename "$SRC")" >"$dir/port.log" 2>&1 ||
			die "porting the series failed (log: $dir/port.log)"
		if [ ! -d "$src" ]; then
			mv "$dir/stage/$(basename "$SRC")" "$src"
		else
			# what differs: copied over (new files too), what only the old tree has: removed
			{ diff -rq "$dir/stage/$(basename "$SRC")" "$src" || true; } | while IFS= read -r line; do
				case $line in
				"Files $dir/stage/"*" differ")
					f=${line#"Files $dir/stage/$(basename "$SRC")/"}
					f=${f%% and *}
					cp "$dir/stage/$(basename "$SRC")/$f" "$src/$f"
					log "  updated $f"
					;;
				"Only in $dir/stage/"*)
					f=${line#"Only in $dir/stage/$(basename "$SRC")"}
					f=${f#/}
					f="${f%%: *}/${f#*: }"
					f=${f#/}
					cp -a "$dir/stage/$(basename "$SRC")/$f" "$src/$f"
					log "  added $f"
					;;
				"Only in $src"*)
					f=${line#"Only in $src"}
					f=${f#/}
					f="${f%%: *}/${f#*: }"
					f=${f#/}
					rm -rf "${src:?}/$f"
					log "  removed $f"
					;;
				esac
			done
		fi
		rm -rf "$dir/stage"
		echo "$stamp" >"$dir/port.stamp"
	fi
	build_kernel k7u "$frag" "$dir" "$src" "io_uring dma-buf kernel"
	log "configuration U: kernel $KV ($dir; port log $dir/port.log)"
}

# ---------------------------------------------------------------------------
# upcie's own kernel modules (dkms/): built for every guest kernel with warnings as errors and
# put into its initramfs as /lib/modules/<KV>/extra/<module>.ko. 6.1 builds against bookworm's
# linux-headers with the host's gcc-12 (the kernel's compiler); 7.x against the build
# environment that build-oot unpacks. See tests/guest/README.md, "upcie's kernel modules".

readonly KMODS="dmabuf_import iommu_map_pa"

kbuild_env_k61() { # KEY : linux-headers + linux-kbuild of the 6.1 kernel -> $CACHE/kbuild/KEY
	local key=$1 env=$CACHE/kbuild/$1 tmp abi mm hdr deb
	[ -f "$env/.ready" ] && return 0
	abi=${KV%-amd64}
	mm=$(echo "$KV" | cut -d. -f1-2)
	tmp=$CACHE/tmp/kbuild-$key
	rm -rf "$tmp"
	mkdir -p "$tmp/root"
	apt_set k61
	apt_download "$tmp/debs" "linux-headers-$KV=$PKGVER" "linux-headers-$abi-common=$PKGVER" \
		"linux-kbuild-$mm=$PKGVER" || die "download of the $KV headers failed"
	for deb in "$tmp"/debs/*.deb; do
		dpkg -x "$deb" "$tmp/root"
	done
	rm -rf "$tmp/debs"
	hdr=$tmp/root/usr/src/linux-headers-$KV
	[ -f "$hdr/Makefile" ] || die "no $hdr/Makefile"
	sed -i "s|/usr/src/|$env/root/usr/src/|g" "$hdr/Makefile"
	rm -rf "$env"
	mkdir -p "$CACHE/kbuild"
	mv "$tmp" "$env"
	{
		printf 'HDR=%q\n' "$env/root/usr/src/linux-headers-$KV"
		printf 'TOOLBIN=\n'
		printf 'CC_TEXT=%q\n' "$(sed -n 's/^CONFIG_CC_VERSION_TEXT="\(.*\)"$/\1/p' \
			"$env/root/usr/src/linux-headers-$KV/.config")"
	} >"$env/kbuild.env"
	touch "$env/.ready"
}

kmod_env() { # SLOT : the slot's kernel facts plus its module build environment (HDR, TOOLBIN)
	local key
	load_state "$1"
	key=$(basename "$KDIR")
	if [ "$1" = k7d ] || [ "$1" = k7u ]; then
		# the kernel's own build tree, built with the host's gcc
		HDR=$KDIR/build TOOLBIN= CC_TEXT=$(sed -n 's/^CONFIG_CC_VERSION_TEXT="\(.*\)"$/\1/p' "$KDIR/build/.config")
		KMAKE=(make -C "$HDR" -j"$JOBS" CONFIG_DEBUG_INFO_BTF_MODULES=)
		return 0
	fi
	if [ "$1" = k61 ]; then
		kbuild_env_k61 "$key"
	else
		kbuild_env "$key"
	fi
	. "$CACHE/kbuild/$key/kbuild.env"
	KMAKE=(make -C "$HDR" -j"$JOBS" CONFIG_DEBUG_INFO_BTF_MODULES=)
	if [ "$1" = k7 ] && [ "$OOT_CC" = host ]; then
		KMAKE+=(CC=gcc-12 CONFIG_CC_HAS_MIN_FUNCTION_ALIGNMENT=)
	fi
}

build_kmods() { # SLOT : dkms/ modules for the slot's kernel -> $WORK/build/kmod/<KV>/
	local slot=$1 out tmp m log
	kmod_env "$slot"
	out=$WORK/build/kmod/$KV
	tmp=$WORK/build/kmod-tmp
	rm -rf "$out" "$tmp"
	mkdir -p "$out" "$tmp"
	for m in $KMODS; do
		cp -rL "$REPO/dkms/$m" "$tmp/$m" # -L: the UAPI header may be reached through a link
		rm -rf "$tmp/$m/debian"
		log=$WORK/build/kmod-$KV-$m.log
		rm -f "$log"
		PATH="${TOOLBIN:+$TOOLBIN:}$PATH" logged "$log" "${KMAKE[@]}" M="$tmp/$m" \
			UPCIE_KMOD_WERROR=y UPCIE_KMOD_TEST=y modules || die "building dkms/$m for $KV failed (log: $log)"
		if grep -E 'ERROR:|WARNING:' "$log"; then
			die "building dkms/$m for $KV: modpost reported problems (log: $log)"
		fi
		case $(modinfo -F vermagic "$tmp/$m/$m.ko") in
		"$KV "*) ;;
		*) die "dkms/$m: vermagic '$(modinfo -F vermagic "$tmp/$m/$m.ko")' is not $KV" ;;
		esac
		strip --strip-debug -o "$out/$m.ko" "$tmp/$m/$m.ko"
	done
	# stand-ins for another project's modules of the same names (case kmod_ident)
	cp -r "$TB_DIR/kmod-other" "$tmp/other"
	log=$WORK/build/kmod-$KV-other.log
	rm -f "$log"
	PATH="${TOOLBIN:+$TOOLBIN:}$PATH" logged "$log" "${KMAKE[@]}" M="$tmp/other" modules ||
		die "building tests/guest/kmod-other for $KV failed (log: $log)"
	mkdir -p "$out/other"
	for m in $KMODS; do
		strip --strip-debug -o "$out/other/$m.ko" "$tmp/other/$m.ko"
	done
	# test modules (tb_barbuf: an exporter of BAR memory, case kmod_iommu), beside the stand-ins
	cp -r "$TB_DIR/kmod-test" "$tmp/test"
	log=$WORK/build/kmod-$KV-test.log
	rm -f "$log"
	PATH="${TOOLBIN:+$TOOLBIN:}$PATH" logged "$log" "${KMAKE[@]}" M="$tmp/test" modules ||
		die "building tests/guest/kmod-test for $KV failed (log: $log)"
	strip --strip-debug -o "$out/other/tb_barbuf.ko" "$tmp/test/tb_barbuf.ko"
	rm -rf "$tmp"
	log "dkms modules for $KV: $(cd "$out" && echo *.ko) (and stand-ins, test modules: other/)"
}

cmd_kbuild_env() { # SLOT : print the module build environment of a guest kernel (for scripts)
	[ "${1:-}" = k61 ] || [ "${1:-}" = k7 ] || die "kbuild-env needs a slot: k61 or k7"
	lock "$CACHE"
	kmod_env "$1" >&2
	printf 'KV=%q\nPKGVER=%q\nHDR=%q\nTOOLBIN=%q\nCC_TEXT=%q\nMODROOT=%q\n' \
		"$KV" "$PKGVER" "$HDR" "$TOOLBIN" "$CC_TEXT" "$MODROOT"
	printf 'KMAKE=(%s)\n' "$(printf '%q ' "${KMAKE[@]}")"
}

# ---------------------------------------------------------------------------
# build: static programs and initramfs images

build_progs() { # -> $WORK/build/bin
	# Programs see bookworm's 6.1 uapi headers only: upcie carries what they lack (iommufd, the
	# vfio cdev, BAR dma-buf export) in include/upcie/vfio/uapi.h, and this proves it suffices.
	local bin=$WORK/build/bin src name flags broken=()
	rm -rf "$bin"
	mkdir -p "$bin"
	gcc -static -O2 -std=c11 -Wall -Wextra -Werror -o "$bin/tbpat" "$TB_DIR/tools/tbpat.c" ||
		die "cannot build tools/tbpat.c"
	# test programs, examples and tools (the README main command runs them in a guest)
	for src in "$TB_DIR"/progs/*.c "$REPO"/examples/*.c "$REPO"/tools/*.c; do
		name=$(basename "$src" .c)
		# optional per-program link flags: a line "// testbed-ldflags: -lpthread"
		flags=$(sed -n 's|^// *testbed-ldflags: *||p' "$src" | tr '\n' ' ')
		# shellcheck disable=SC2086
		if ! gcc -static -O2 -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE -I"$REPO/include" \
			-I"$TB_DIR/progs" -o "$bin/$name" "$src" $flags; then
			broken+=("${src#"$REPO"/}")
		fi
	done
	[ "${#broken[@]}" = 0 ] || die "cannot build: ${broken[*]}"
	log "built $(find "$bin" -type f | wc -l) static programs into $bin"
	build_fio_engine
}

# fio (built from Debian's source by build-fio) and upcie's ioengine against the same tree; both
# are dynamic (fio loads engines with dlopen), so the initramfs gets their libraries too
build_fio_engine() { # -> $WORK/build/fio/{fio,upcie_fio.so} when fio is built
	local out=$WORK/build/fio tree
	rm -rf "$out"
	tree=$("$REPO/tools/fio/build-fio.sh" --dir "$CACHE/fio" --print 2>/dev/null) || {
		log "no fio built (testbed.sh build-fio): the fio cases will skip"
		return 0
	}
	tree=${tree#FIO_SRC=}
	mkdir -p "$out"
	gcc -std=gnu11 -O2 -Wall -Wextra -Werror -Wshadow -Wundef -D_GNU_SOURCE -D_LARGEFILE_SOURCE \
		-D_FILE_OFFSET_BITS=64 -I"$REPO/include" -isystem "$tree" -include "$tree/config-host.h" \
		-fPIC -shared -o "$out/upcie_fio.so" "$REPO/tools/fio/upcie_fio.c" ||
		die "cannot build tools/fio/upcie_fio.c against $tree"
	cp "$tree/fio" "$out/fio"
	log "fio $("$out/fio" --version) and its upcie engine in $out"
}

add_dynamic() { # ROOT FILE DEST : FILE at DEST in ROOT, with the shared libraries it needs
	local root=$1 f=$2 dest=$3 lib
	mkdir -p "$root/$(dirname "$dest")"
	cp "$f" "$root/$dest"
	for lib in $(ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }'); do
		[ -e "$root/$lib" ] && continue
		mkdir -p "$root/$(dirname "$lib")"
		cp -L "$lib" "$root/$lib"
	done
}

copy_module() { # SRC DST : plain .ko (busybox modprobe has no xz/zstd)
	mkdir -p "$(dirname "$2")"
	case $1 in
	*.ko.xz) xz -dc "$1" >"$2" ;;
	*.ko.zst) zstd -qdc "$1" >"$2" ;;
	*) cp "$1" "$2" ;;
	esac
}

add_module_deps() { # ROOT MODROOT KV MODULE SKIP-RE : MODULE and its dependencies from MODROOT
	local root=$1 modroot=$2 kv=$3 m=$4 skip=$5 out f rel name
	if ! out=$(modprobe -d "$modroot" -S "$kv" --show-depends "$m" 2>&1); then
		if grep -q "^CONFIG_$(echo "$m" | tr 'a-z-' 'A-Z_')=y" "$KCONFIG" 2>/dev/null; then
			log "  $m is built into $kv"
		else
			log "  $m is not available for $kv"
		fi
		return 0
	fi
	while read -r kind f _; do
		[ "$kind" = insmod ] || continue
		name=$(basename "$f")
		name=${name%%.ko*}
		name=${name//-/_}
		if [ -n "$skip" ] && [[ $name =~ $skip ]]; then
			continue
		fi
		rel=${f#"$modroot"/lib/modules/"$kv"/}
		rel=${rel%.xz}
		rel=${rel%.zst}
		[ -f "$root/lib/modules/$kv/$rel" ] || copy_module "$f" "$root/lib/modules/$kv/$rel"
	done <<<"$out"
}

build_initramfs() { # SLOT OOTDIR(or '') OUT
	local slot=$1 oot=$2 out=$3 root m f dep skip=
	load_state "$slot"
	root=$WORK/build/root-$(basename "$out" .cpio)
	rm -rf "$root"
	mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,dev,proc,sys,tmp,run,etc,tests/lib,lib/modules/"$KV"}
	cp /bin/busybox "$root/bin/busybox"
	ln -s busybox "$root/bin/sh"
	cp "$TB_DIR/init" "$root/init"
	chmod 755 "$root/init"
	if [ -n "$oot" ]; then
		# the whole vfio stack and iommufd come from the rebuild
		for f in "$oot"/*.ko; do
			cp "$f" "$root/lib/modules/$KV/updates/" 2>/dev/null ||
				{ mkdir -p "$root/lib/modules/$KV/updates" && cp "$f" "$root/lib/modules/$KV/updates/"; }
		done
		skip="^($(cd "$oot" && printf '%s\n' ./*.ko | sed 's|^\./||; s/\.ko$//; s/-/_/g' | paste -sd '|'))\$"
	fi
	for m in $GUEST_MODULES; do
		case $m in vfio*) [ -n "$oot" ] && continue ;; esac
		add_module_deps "$root" "$MODROOT" "$KV" "$m" "$skip"
	done
	if [ -n "$oot" ]; then
		for f in "$oot"/*.ko; do
			for dep in $(modinfo -F depends "$f" | tr ',' ' '); do
				[[ ${dep//-/_} =~ $skip ]] && continue
				add_module_deps "$root" "$MODROOT" "$KV" "$dep" "$skip"
			done
		done
	fi
	for f in modules.order modules.builtin modules.builtin.modinfo; do
		[ -f "$MODROOT/lib/modules/$KV/$f" ] && cp "$MODROOT/lib/modules/$KV/$f" "$root/lib/modules/$KV/"
	done
	if [ -d "$WORK/build/kmod/$KV" ]; then # upcie's modules (dkms/), from build_kmods
		mkdir -p "$root/lib/modules/$KV/extra"
		cp "$WORK/build/kmod/$KV"/*.ko "$root/lib/modules/$KV/extra/"
		# the stand-ins stay out of depmod's sight: loaded by path only
		if [ -d "$WORK/build/kmod/$KV/other" ]; then
			mkdir -p "$root/lib/tb-other"
			cp "$WORK/build/kmod/$KV"/other/*.ko "$root/lib/tb-other/"
		fi
	fi
	depmod -b "$root" "$KV" || die "depmod failed for the $KV initramfs"
	cp "$WORK"/build/bin/* "$root/bin/"
	if [ -f "$WORK/build/fio/fio" ]; then
		add_dynamic "$root" "$WORK/build/fio/fio" /usr/bin/fio
		add_dynamic "$root" "$WORK/build/fio/upcie_fio.so" /usr/lib/upcie/upcie_fio.so
		mkdir -p "$root/usr/share/upcie/fio"
		cp "$REPO"/tools/fio/jobs/*.fio "$root/usr/share/upcie/fio/"
	fi
	cp "$TB_DIR"/lib/*.sh "$root/tests/lib/"
	for f in "$TB_DIR"/cases/*.sh; do
		case $f in *.host.sh) continue ;; esac
		cp "$f" "$root/tests/"
	done
	{
		echo "kernel=$KV"
		echo "package=$PKGVER"
		echo "oot=${oot:+$(basename "$oot")}"
		echo "built=$(date -u +%FT%TZ)"
	} >"$root/etc/testbed-build"
	(cd "$root" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet -R 0:0) >"$out.new"
	mv "$out.new" "$out"
	rm -rf "$root"
	log "initramfs $out ($(du -h "$out" | cut -f1), kernel $KV${oot:+, out-of-tree iommufd/vfio})"
}

initramfs_path() { # CONFIG
	if [ "${CFG_OOTDIR[$1]}" = 1 ]; then
		echo "$WORK/build/initramfs-${CFG_SLOT[$1]}-oot.cpio"
	else
		echo "$WORK/build/initramfs-${CFG_SLOT[$1]}.cpio"
	fi
}

cmd_build() { # [CONFIG...] : programs + the initramfs images the configurations need
	local cfgs=("$@") c done_imgs=" " img oot
	[ "${#cfgs[@]}" -gt 0 ] || cfgs=("${CONFIGS[@]}")
	need_tools gcc make strip cpio depmod modprobe modinfo xz zstd
	[ -x /bin/busybox ] || die "/bin/busybox missing (apt-get install busybox-static)"
	lock "$CACHE"
	lock "$WORK"
	build_progs
	for c in "${cfgs[@]}"; do
		if [ "${CFG_SLOT[$c]}" = k7d ] && [ ! -r "$(state_file k7d)" ]; then
			die "configuration K needs the debug kernel: run '$0 build-debug' first"
		fi
		if [ "${CFG_SLOT[$c]}" = k7u ] && [ ! -r "$(state_file k7u)" ]; then
			die "configuration U needs the io_uring dma-buf kernel: run '$0 build-iouring' first"
		fi
		[[ $done_imgs == *" kmod-${CFG_SLOT[$c]} "* ]] && continue
		build_kmods "${CFG_SLOT[$c]}"
		done_imgs+="kmod-${CFG_SLOT[$c]} "
	done
	for c in "${cfgs[@]}"; do
		img=$(initramfs_path "$c")
		[[ $done_imgs == *" $img "* ]] && continue
		oot=
		if [ "${CFG_OOTDIR[$c]}" = 1 ]; then
			load_state "${CFG_SLOT[$c]}"
			oot=$CACHE/oot/$(basename "$KDIR")
			[ -f "$oot/.ready" ] || die "no out-of-tree modules for $KV: run '$0 build-oot' first"
		fi
		build_initramfs "${CFG_SLOT[$c]}" "$oot" "$img"
		done_imgs+="$img "
	done
}

cmd_build_fio() { # fio from Debian's source package, cached in $CACHE/fio (tools/fio/build-fio.sh)
	lock "$CACHE"
	"$REPO/tools/fio/build-fio.sh" --dir "$CACHE/fio" >/dev/null || die "building fio failed"
}

# ---------------------------------------------------------------------------
# run

case_file() { echo "$TB_DIR/cases/$1.sh"; }

case_header() { # CASE KEY : values of "# KEY: value" lines in the case's leading comment block
	awk -v key="$2" '
		NR == 1 && /^#!/ { next }
		!/^#/ { exit }
		{ line = $0; sub(/^#[ \t]*/, "", line)
		  if (index(line, key ":") == 1) { v = substr(line, length(key) + 2); sub(/^[ \t]+/, "", v); sub(/[ \t]+$/, "", v); print v } }
	' "$(case_file "$1")"
}

case_configs() { # CASE : configurations the case applies to (default: all)
	local c
	c=$(case_header "$1" configs | tr -s ' \t' ' ')
	echo "${c:-${CONFIGS[*]}}"
}

case_timeout() {
	local t
	t=$(case_header "$1" timeout | head -n 1)
	[[ $t =~ ^[0-9]+$ ]] || t=$CASE_TIMEOUT
	echo "$t"
}

all_cases() {
	local f
	for f in "$TB_DIR"/cases/*.sh; do
		case $f in *.host.sh) continue ;; esac
		basename "$f" .sh
	done
}

img_var() { echo "TB_IMG_$(echo "$1" | tr '[:lower:]' '[:upper:]')"; }

boot_devices() { # CASE[,CASE...] NAME : whether one of the cases asks for devices NAME
	local k
	for k in ${1//,/ }; do
		[ "$k" = shell ] && continue
		case " $(case_header "$k" devices) " in *" $2 "*) return 0 ;; esac
	done
	return 1
}
boot_faulty() { boot_devices "$1" faulty; } # the faulty controller c2
boot_scale() { boot_devices "$1" scale; }   # s1..s7
boot_subsys() { boot_devices "$1" subsys; } # c3 in an NVM subsystem
boot_sriov() { boot_devices "$1" sriov; }   # c7, an SR-IOV PF with two VFs
boot_qmp() { boot_devices "$1" qmp; }       # a QMP socket and tools/qmp_hook.py beside the boot

cfg_namespaces() { # CONFIG CASES : the namespace lines of a boot (into array CFG_NS)
	CFG_NS=("${NAMESPACES[@]}")
	[ "$1" = D ] && CFG_NS+=("${NAMESPACES_D[@]}")
	cfg_switch "$1" && CFG_NS+=("${NAMESPACES_U[@]}")
	if boot_faulty "$2"; then
		CFG_NS+=("${NAMESPACES_FAULTY[@]}")
	fi
	if boot_scale "$2"; then
		CFG_NS+=("${NAMESPACES_SCALE[@]}")
	fi
	if boot_subsys "$2"; then
		CFG_NS+=("${NAMESPACES_SUBSYS[@]}")
	fi
	if boot_sriov "$2"; then
		CFG_NS+=("${NAMESPACES_SRIOV[@]}")
	fi
	return 0
}

make_backing_files() { # RUNDIR NONCE CONFIG CASES : fresh pattern-filled files for one boot
	local dir=$1 nonce=$2 c=$3 ns name
	local lbs ms extra bytes nlbas
	cfg_namespaces "$c" "$4"
	for ns in "${CFG_NS[@]}"; do
		read -r name _ _ lbs ms size extra <<<"$ns"
		"$WORK/build/bin/tbpat" fill "$dir/$name.img" "$size" "$name$nonce"
		case ",$extra," in
		*,pi=[123],*)
			# protection information: metadata all ones (application tag ffffh: the checks
			# are off for blocks never written with PI, as after a format)
			bytes=$(numfmt --from=iec "$size")
			nlbas=$((bytes / (lbs + ms)))
			head -c $((bytes - nlbas * lbs)) /dev/zero | tr '\0' '\377' |
				dd of="$dir/$name.img" bs=4096 seek=$((nlbas * lbs)) oflag=seek_bytes \
					conv=notrunc status=none
			;;
		esac
	done
	"$WORK/build/bin/tbpat" fill "$dir/vram.img" "$VRAM_SIZE" "vram$nonce"
	"$WORK/build/bin/tbpat" fill "$dir/pmr.img" "$PMR_SIZE" "pmr_$nonce"
	if [ "$c" = D ]; then
		"$WORK/build/bin/tbpat" fill "$dir/vrm2.img" "$VRM2_SIZE" "vrm2$nonce"
	fi
	if cfg_switch "$c"; then
		"$WORK/build/bin/tbpat" fill "$dir/vrm3.img" "$VRM3_SIZE" "vrm3$nonce"
	fi
}

qemu_args() { # CONFIG RUNDIR NONCE CASES : the QEMU command line (into array QARGS)
	local c=$1 dir=$2 nonce=$3 cases=$4 ns name ctrl nsid lbs ms size extra kernel nsfacts=()
	load_state "${CFG_SLOT[$c]}"
	kernel=${VMLINUX:-$BZIMAGE}
	[ -n "$kernel" ] && [ -f "$kernel" ] || kernel=$BZIMAGE
	local smp=2
	# D: one socket per node, or the kernel warns that CPUs sharing a cache sit on two nodes
	[ "$c" = D ] && smp=2,sockets=2,cores=1,threads=1
	QARGS=("$QEMU" -machine q35 -accel tcg -m 2G -smp "$smp" -nographic -nic none -vga none -no-reboot
		-kernel "$kernel" -initrd "$(initramfs_path "$c")")
	if [ "$c" = D ]; then
		# two NUMA nodes of 1 GiB and one vCPU each
		# shellcheck disable=SC2054
		QARGS+=(-object memory-backend-ram,id=m0,size=1G -object memory-backend-ram,id=m1,size=1G
			-numa node,nodeid=0,cpus=0,memdev=m0 -numa node,nodeid=1,cpus=1,memdev=m1)
	fi
	[ -n "${CFG_CPU[$c]}" ] && QARGS+=(-cpu "${CFG_CPU[$c]}")
	if [ "${CFG_IOMMU[$c]}" = 1 ]; then
		# shellcheck disable=SC2054
		QARGS+=(-device intel-iommu,intremap=on,caching-mode=on)
	fi
	QARGS+=(-object "memory-backend-file,id=pmr,size=$PMR_SIZE,mem-path=$dir/pmr.img,share=on"
		-device "nvme,id=c0,serial=$SN_C0,addr=${BDF_C0:8:2}.${BDF_C0:11:1}"
		-device "nvme,id=c1,serial=$SN_C1,addr=${BDF_C1:8:2}.${BDF_C1:11:1},mdts=0,cmb_size_mb=16,pmrdev=pmr")
	local qns=("${NAMESPACES[@]}")
	if boot_faulty "$cases"; then
		qns+=("${NAMESPACES_FAULTY[@]}")
		QARGS+=(-device "nvme,id=c2,serial=$SN_C2,addr=${BDF_C2:8:2}.${BDF_C2:11:1}")
		printf '[inject-error]\nevent = "%s"\nerrno = "5"\nsector = "%s"\nonce = "off"\n\n' \
			read_aio "$C2_RERR" write_aio "$C2_WERR" >"$dir/c2n1.blkdebug"
	fi
	boot_qmp "$cases" && QARGS+=(-qmp "unix:$dir/qmp.sock,server=on,wait=off")
	if boot_subsys "$cases"; then
		qns+=("${NAMESPACES_SUBSYS[@]}")
		QARGS+=(-device "nvme-subsys,id=subsys0,nqn=upcie-testbed-subsys"
			-device "nvme,id=c3,serial=$SN_C3,subsys=subsys0,addr=${BDF_C3:8:2}.${BDF_C3:11:1}")
	fi
	if boot_sriov "$cases"; then
		qns+=("${NAMESPACES_SRIOV[@]}")
		QARGS+=(-device "nvme-subsys,id=subsys1,nqn=upcie-testbed-sriov"
			-device "nvme,id=c7,serial=$SN_C7,subsys=subsys1,addr=${BDF_C7:8:2}.${BDF_C7:11:1},sriov_max_vfs=2,sriov_vq_flexible=8,sriov_vi_flexible=4")
	fi
	local scale_bdfs=
	if boot_scale "$cases"; then
		local i
		qns+=("${NAMESPACES_SCALE[@]}")
		for ((i = 1; i <= SCALE_N; i++)); do
			QARGS+=(-device "nvme,id=s$i,serial=5ca1e00$i,addr=1$((i - 1)).0")
			scale_bdfs+=${scale_bdfs:+,}0000:00:1$((i - 1)).0
		done
	fi
	for ns in "${qns[@]}"; do
		read -r name ctrl nsid lbs ms size extra <<<"$ns"
		case $name in
		# raw over blkdebug over the file: blkdebug sees the read_aio/write_aio events raw raises
		c2n1) QARGS+=(-drive "if=none,id=$name,driver=raw,file.driver=blkdebug,file.config=$dir/c2n1.blkdebug,file.image.driver=file,file.image.filename=$dir/$name.img") ;;
		c2n2) QARGS+=(-drive "file=$dir/$name.img,if=none,id=$name,format=raw,throttling.iops-total=$C2_IOPS") ;;
		*) QARGS+=(-drive "file=$dir/$name.img,if=none,id=$name,format=raw") ;;
		esac
		QARGS+=(-device "nvme-ns,drive=$name,bus=$ctrl,nsid=$nsid,logical_block_size=$lbs,physical_block_size=$lbs$([ "$ms" = 0 ] || echo ",ms=$ms")${extra:+,$extra}")
		nsfacts+=("$name/$nsid/$lbs/$ms/$size")
	done
	QARGS+=(-object "memory-backend-file,id=vram,size=$VRAM_SIZE,mem-path=$dir/vram.img,share=on"
		-device "ivshmem-plain,memdev=vram,addr=${BDF_VRAM:8:2}.${BDF_VRAM:11:1}")
	if [ "$c" = D ]; then
		local thr
		# c4 behind a root port of an expander bridge on node 1 (bus 0x80; c4 on 0x81)
		QARGS+=(-device pxb-pcie,id=pxb1,bus_nr=0x80,numa_node=1,bus=pcie.0,addr=0x9
			-device pcie-root-port,id=rp1,bus=pxb1,chassis=1,addr=0x0
			-device "nvme,id=c4,serial=$SN_C4,bus=rp1"
			-device "nvme,id=c5,serial=$SN_C5,bus=pcie.0,addr=${BDF_C5:8:2}.${BDF_C5:11:1},multifunction=on")
		for ns in "${NAMESPACES_D[@]}"; do
			read -r name ctrl nsid lbs ms size <<<"$ns"
			thr=
			[ "$ctrl" = c4 ] && thr=",throttling.bps-read=$C4_READ_BPS"
			QARGS+=(-drive "file=$dir/$name.img,if=none,id=$name,format=raw$thr"
				-device "nvme-ns,drive=$name,bus=$ctrl,nsid=$nsid,logical_block_size=$lbs,physical_block_size=$lbs")
			nsfacts+=("$name/$nsid/$lbs/$ms/$size")
		done
		QARGS+=(-object "memory-backend-file,id=vrm2,size=$VRM2_SIZE,mem-path=$dir/vrm2.img,share=on"
			-device "ivshmem-plain,memdev=vrm2,bus=pcie.0,addr=${BDF_VRM2:8:2}.${BDF_VRM2:11:1},multifunction=on")
	fi
	if cfg_switch "$c"; then
		QARGS+=(-device pcie-root-port,id=rpu,bus=pcie.0,chassis=2,addr=0xb
			-device x3130-upstream,id=swu,bus=rpu
			-device xio3130-downstream,id=swd1,bus=swu,chassis=3,slot=1
			-device xio3130-downstream,id=swd2,bus=swu,chassis=3,slot=2
			-device "nvme,id=c6,serial=$SN_C6,bus=swd1"
			-object "memory-backend-file,id=vrm3,size=$VRM3_SIZE,mem-path=$dir/vrm3.img,share=on"
			-device "ivshmem-plain,memdev=vrm3,bus=swd2")
		for ns in "${NAMESPACES_U[@]}"; do
			read -r name ctrl nsid lbs ms size <<<"$ns"
			QARGS+=(-drive "file=$dir/$name.img,if=none,id=$name,format=raw"
				-device "nvme-ns,drive=$name,bus=$ctrl,nsid=$nsid,logical_block_size=$lbs,physical_block_size=$lbs")
			nsfacts+=("$name/$nsid/$lbs/$ms/$size")
		done
	fi
	# tsc=reliable: under TCG the clocksource watchdog, reading HPET on a loaded host, can call the
	# TSC unstable mid-case; the kernel then patches sched_clock's static key while other CPUs run
	# it, and TCG's cross-modifying code lets a CPU execute the int3 (Oops in sched_clock_cpu).
	local append="console=ttyS0 panic=-1 quiet tsc=reliable"
	[ "${CFG_IOMMU[$c]}" = 1 ] && append+=" intel_iommu=on"
	[ "$c" = D ] || [ "$c" = V ] && append+=" iommu=pt"
	append+=" tb_config=$c tb_cases=$cases tb_nonce=$nonce tb_kernel=$KV tb_iommu=${CFG_IOMMU[$c]}"
	if [ "$c" = D ]; then
		append+=" tb_iommu_pt=1 tb_numa_nodes=2 tb_c4_bdf=$BDF_C4 tb_c4_sn=$SN_C4 tb_c4_read_bps=$C4_READ_BPS"
		append+=" tb_c5_bdf=$BDF_C5 tb_c5_sn=$SN_C5 tb_vrm2_bdf=$BDF_VRM2 tb_vrm2_size=$VRM2_SIZE"
	fi
	cfg_switch "$c" && append+=" tb_c6_bdf=$BDF_C6 tb_c6_sn=$SN_C6 tb_vrm3_bdf=$BDF_VRM3 tb_vrm3_size=$VRM3_SIZE"
	append+=" tb_oot=${CFG_OOT[$c]} tb_c0_bdf=$BDF_C0 tb_c0_sn=$SN_C0 tb_c1_bdf=$BDF_C1 tb_c1_sn=$SN_C1"
	append+=" tb_vram_bdf=$BDF_VRAM tb_vram_size=$VRAM_SIZE tb_pmr_size=$PMR_SIZE"
	append+=" tb_ns=$(IFS=,; echo "${nsfacts[*]}") tb_case_timeout=$CASE_TIMEOUT tb_timeout_scale=${CFG_TSCALE[$c]}"
	[ -n "$scale_bdfs" ] && append+=" tb_scale_bdfs=$scale_bdfs"
	boot_subsys "$cases" && append+=" tb_c3_bdf=$BDF_C3 tb_c3_sn=$SN_C3"
	boot_sriov "$cases" && append+=" tb_c7_bdf=$BDF_C7 tb_c7_sn=$SN_C7"
	if boot_faulty "$cases"; then
		append+=" tb_c2_bdf=$BDF_C2 tb_c2_sn=$SN_C2 tb_c2_rerr=$C2_RERR tb_c2_werr=$C2_WERR tb_c2_iops=$C2_IOPS"
	fi
	[ -n "$APPEND" ] && append+=" $APPEND"
	QARGS+=(-append "$append")
}

judge_console() { # LOG CASES ALLOWFILE QEMU-RC TIMEOUT : TAP records "status<TAB>case<TAB>text"
	TB_CASES="$2" TB_BAD_RE="$DMESG_BAD" TB_QEMU_RC="$4" TB_TIMEOUT="$5" awk -F'\t' '
	FNR == NR { if (FNR > 1) { nallow[$1]++; allow[$1, nallow[$1]] = $2 }; next }
	function rec(st, c, t) { printf "%s\t%s\t%s\n", st, c, t }
	# what was blocked in the kernel when the case ran out of time
	function blocked_diag(c,   j) {
		for (j = 1; timedout[c] && j <= nblk[c]; j++) rec("diag", c, "# blocked: " blocked[c, j])
	}
	function allowed(c, line,   i) {
		for (i = 1; i <= nallow[c]; i++) if (line ~ allow[c, i]) return 1
		return 0
	}
	BEGIN {
		ncases = split(ENVIRON["TB_CASES"], cases, ","); bad = ENVIRON["TB_BAD_RE"]
		qrc = ENVIRON["TB_QEMU_RC"] + 0
		if (qrc == 124 || qrc == 137) why = "the guest was killed after the " ENVIRON["TB_TIMEOUT"] " s timeout"
		else if (qrc != 0) why = "qemu exited with status " qrc
		else why = "the guest powered off or rebooted"
	}
	{ sub(/\r$/, "") }
	oops == "" && /\] (Oops|BUG|Kernel panic|general protection fault)/ { oops = $0; sub(/^\[ *[0-9.]+\] /, "", oops) }
	/^==TB== START / { started = 1; next }
	/^==TB== CASE / { cur = $0; sub(/^==TB== CASE /, "", cur); seen[cur] = 1; incase = 1; indiag = 0; next }
	/^==TB== END / {
		incase = 0
		if (match($0, /rc=[0-9]+/)) rc[cur] = substr($0, RSTART + 3, RLENGTH - 3)
		ended[cur] = 1; next
	}
	/^==TB== TIMEOUT / { timedout[cur] = 1; next }
	/^==TB== BLOCKED / {
		b = $0; sub(/^==TB== BLOCKED /, "", b)
		if (nblk[cur] < 8) blocked[cur, ++nblk[cur]] = b
		next
	}
	/^==TB== UNKILLABLE / { unkillable[cur] = 1; incase = 0; next }
	/^==TB== DMESG / { dm = $0; sub(/^==TB== DMESG /, "", dm); indm = 1; next }
	/^==TB== DMESGEND/ { indm = 0; next }
	/^==TB== RESULT / { result = 1; next }
	incase {
		if ($0 ~ /^(not )?ok([ \t]|$)/) {
			ntap[cur]++
			if ($0 ~ /#[ \t]*[Ss][Kk][Ii][Pp]/) { rec("skip", cur, $0); indiag = 0 }
			else if ($0 ~ /^not ok/) { rec("fail", cur, $0); nfail[cur]++; indiag = 1; ndiag = 0 }
			else { rec("pass", cur, $0); indiag = 0 }
		} else if ($0 ~ /^1\.\.[0-9]+/) {
			plan[cur] = substr($0, 4) + 0; indiag = 0
		} else if (indiag && $0 ~ /^#/ && ndiag < 15) {
			rec("diag", cur, $0); ndiag++
		} else indiag = 0
		next
	}
	indm && $0 ~ bad {
		if (dm == "@boot") { nboot++; bootline[nboot] = $0 }
		else if (!allowed(dm, $0)) rec("fail", dm, "dmesg: " $0)
		next
	}
	END {
		if (oops != "") why = why " after a kernel crash: " oops
		for (i = 1; i <= ncases; i++) {
			c = cases[i]
			for (j = 1; j <= nboot; j++)
				if (!allowed(c, bootline[j])) rec("fail", c, "dmesg (boot): " bootline[j])
			if (!seen[c]) { rec("fail", c, (started ? "case never started: " : "guest never reached /init: ") why); unfinished++; continue }
			if (!ended[c] && unkillable[c]) {
				rec("fail", c, "case killed by its timeout in the guest, but it did not die: a task is blocked in the kernel (guest then ended: " why ")")
				unfinished++
			} else if (!ended[c]) {
				rec("fail", c, "case did not finish: " why)
				unfinished++
			}
			if (!ended[c]) { blocked_diag(c); continue }
			if (!ntap[c]) rec("fail", c, "case printed no TAP line")
			# a non-zero exit after "not ok" lines (tap_done) is not a failure of its own
			if (rc[c] == 137) { rec("fail", c, "case killed by its timeout in the guest"); blocked_diag(c) }
			else if (rc[c] != 0 && !nfail[c]) rec("fail", c, "case exited with status " rc[c])
			if ((c in plan) && plan[c] != ntap[c]) rec("fail", c, "planned " plan[c] " tests, ran " ntap[c])
		}
		if (!unfinished && !result) rec("fail", ENVIRON["TB_CASES"], "guest printed no result marker: " why)
		else if (!unfinished && qrc != 0) rec("fail", ENVIRON["TB_CASES"], why)
	}' "$3" <(tr -d '\r' <"$1")
}

judge_host() { # OUTPUT CASE RC : TAP records from a host-side script
	awk -v c="$2" -v rc="$3" '
	function rec(st, t) { printf "%s\t%s\t%s\n", st, c, t }
	/^(not )?ok([ \t]|$)/ {
		n++
		if ($0 ~ /#[ \t]*[Ss][Kk][Ii][Pp]/) { rec("skip", $0); d = 0 }
		else if ($0 ~ /^not ok/) { rec("fail", $0); nf++; d = 1; nd = 0 }
		else { rec("pass", $0); d = 0 }
		next
	}
	/^1\.\.[0-9]+/ { plan = substr($0, 4) + 0; has_plan = 1; d = 0; next }
	d && /^#/ && nd < 15 { rec("diag", $0); nd++; next }
	{ d = 0 }
	END {
		if (!n) rec("fail", "host script printed no TAP line")
		if (rc != 0 && !nf) rec("fail", "host script exited with status " rc)
		if (has_plan && plan != n) rec("fail", "planned " plan " tests, ran " n)
	}' "$1"
}

RESULTS=
boot_guest() { # CONFIG CASE[,CASE...] : one boot; appends TAP records to $RESULTS
	local c=$1 cases=$2 name dir nonce t0 rc=0 tmo=$BOOT_TIMEOUT k recs host_rc v ns nsname
	name=$c-$cases
	[[ $cases == *,* ]] && name=$c-group
	dir=$WORK/runs/$name
	rm -rf "$dir"
	mkdir -p "$dir"
	nonce=$(od -An -N2 -tx2 /dev/urandom | tr -d ' \n')
	make_backing_files "$dir" "$nonce" "$c" "$cases"
	printf 'case\tallowed dmesg ERE\n' >"$dir/dmesg-allow"
	for k in ${cases//,/ }; do
		tmo=$((tmo + $(case_timeout "$k") * ${CFG_TSCALE[$c]}))
		case_header "$k" dmesg-allow | sed "s/^/$k\t/" >>"$dir/dmesg-allow"
	done
	qemu_args "$c" "$dir" "$nonce" "$cases"
	printf '%q ' "${QARGS[@]}" >"$dir/qemu.cmd"
	echo >>"$dir/qemu.cmd"
	t0=$(now)
	local attempt retried="" hook=""
	for attempt in 1 2; do
		rc=0
		rm -f "$dir/qmp.sock"
		if boot_qmp "$cases"; then
			# the guest asks for QMP commands on its console ("# tb-qmp: {...}")
			python3 "$TB_DIR/tools/qmp_hook.py" "$dir/qmp.sock" "$dir/console.log" \
				>"$dir/qmp.log" 2>&1 &
			hook=$!
		fi
		if [ "$SHOW" = 1 ]; then
			set +e
			timeout -k 10 "$tmo" "${QARGS[@]}" </dev/null 2>&1 | tee "$dir/console.log"
			rc=${PIPESTATUS[0]}
			set -e
		else
			timeout -k 10 "$tmo" "${QARGS[@]}" </dev/null >"$dir/console.log" 2>&1 || rc=$?
		fi
		if [ -n "$hook" ]; then
			kill "$hook" 2>/dev/null || true
			wait "$hook" 2>/dev/null || true
			hook=
		fi
		# A kernel that dies before /init ran no upcie code. Seen under TCG with 2 vCPUs: an
		# int3 oops while the 7.x kernel patches its own text (cross-vCPU code modification).
		# Retry that once, on fresh backing files, and say so; a second death is a failure.
		if [ "$attempt" = 1 ] && ! grep -q '^==TB== START ' <(tr -d '\r' <"$dir/console.log"); then
			retried=" retried: kernel died before /init"
			cp "$dir/console.log" "$dir/console.first.log"
			warn "[$c] $cases: the kernel died before /init (log $dir/console.first.log); booting once more"
			make_backing_files "$dir" "$nonce" "$c" "$cases"
			continue
		fi
		break
	done
	local wall
	wall=$(secs "$t0" "$(now)")
	recs=$dir/results.tsv
	judge_console "$dir/console.log" "$cases" "$dir/dmesg-allow" "$rc" "$tmo" >"$recs"
	# host-side checks of the backing files, for cases that finished in the guest
	for k in ${cases//,/ }; do
		[ -f "$TB_DIR/cases/$k.host.sh" ] || continue
		if ! grep -q "^==TB== END $k " <(tr -d '\r' <"$dir/console.log"); then
			continue
		fi
		# awk reads to the end: an early exit would end tr with SIGPIPE (pipefail, set -e)
		tr -d '\r' <"$dir/console.log" | awk -v k="$k" '
			$0 == "==TB== CASE " k { on = 1; next } on && /^==TB== END / { on = 0 } on' >"$dir/$k.guest.out"
		(
			cd "$dir"
			export TB_CONFIG=$c TB_CASE=$k TB_NONCE=$nonce TB_RUN_DIR=$dir TB_KERNEL=$KV
			export TB_CONSOLE=$dir/console.log TB_GUEST_OUTPUT=$dir/$k.guest.out
			export TB_PAT=$WORK/build/bin/tbpat TB_LIB=$TB_DIR/lib TB_IOMMU=${CFG_IOMMU[$c]} TB_OOT=${CFG_OOT[$c]}
			cfg_namespaces "$c" "$cases"
			[ "$c" = D ] && CFG_NS+=(vrm2)
			cfg_switch "$c" && CFG_NS+=(vrm3)
			for ns in "${CFG_NS[@]}" "vram" "pmr"; do
				nsname=${ns%% *}
				v=$(img_var "$nsname")
				export "$v=$dir/$nsname.img"
			done
			exec timeout -k 5 120 bash "$TB_DIR/cases/$k.host.sh"
		) >"$dir/$k.host.out" 2>&1 || host_rc=$?
		judge_host "$dir/$k.host.out" "$k (host)" "${host_rc:-0}" >>"$recs"
		host_rc=
	done
	sed "s/^\([a-z]*\)\t/\1\t$c\t/" "$recs" >>"$RESULTS"
	local np nf ns_
	np=$(grep -c '^pass' "$recs" || true)
	nf=$(grep -c '^fail' "$recs" || true)
	ns_=$(grep -c '^skip' "$recs" || true)
	printf '[%s] %-28s %s  (%d passed, %d failed, %d skipped; %s s%s)\n' "$c" "${cases//,/ }" \
		"$([ "$nf" = 0 ] && echo ok || echo FAIL)" "$np" "$nf" "$ns_" "$wall" "${retried:-}"
	if [ "$nf" != 0 ]; then
		echo "    guest log: $dir/console.log (qemu command: $dir/qemu.cmd)"
		for k in ${cases//,/ }; do
			[ -f "$dir/$k.host.out" ] && echo "    host script output: $dir/$k.host.out"
		done
		echo "    --- last 40 lines of the guest console ---"
		tr -d '\r' <"$dir/console.log" | tail -n 40 | sed 's/^/    | /'
	elif [ "$KEEP" = 0 ]; then
		rm -f "$dir"/*.img
	fi
}

cmd_shell() { # [--config C] : an interactive guest on this terminal
	local c=A dir nonce
	while [ $# -gt 0 ]; do
		case $1 in
		--config) [ $# -ge 2 ] || die "--config needs a value"; c=$2; shift 2 ;;
		--config=*) c=${1#*=}; shift ;;
		*) die "shell: unknown argument '$1' (see --help)" ;;
		esac
	done
	[[ " ${ALL_CONFIGS[*]} " == *" $c "* ]] || die "unknown configuration '$c' (A, B, C, D, K, U or V)"
	need_tools "$QEMU"
	phase build cmd_build "$c"
	dir=$WORK/runs/shell-$c
	rm -rf "$dir"
	mkdir -p "$dir"
	nonce=$(od -An -N2 -tx2 /dev/urandom | tr -d ' \n')
	make_backing_files "$dir" "$nonce" "$c" shell
	qemu_args "$c" "$dir" "$nonce" shell
	lock_guests
	log "config $c ($KV); backing files in $dir; leave with 'poweroff -f' (or Ctrl-a x)"
	exec "${QARGS[@]}"
}

SHOW=0 KEEP=0
cmd_run() {
	local want_cfgs=() want_cases=() group=0 c k plan=() cfgcases t0
	while [ $# -gt 0 ]; do
		case $1 in
		--config) [ $# -ge 2 ] || die "--config needs a value"; want_cfgs+=("$2"); shift 2 ;;
		--config=*) want_cfgs+=("${1#*=}"); shift ;;
		--case) [ $# -ge 2 ] || die "--case needs a value"; want_cases+=("$2"); shift 2 ;;
		--case=*) want_cases+=("${1#*=}"); shift ;;
		--show) SHOW=1; shift ;;
		--keep) KEEP=1; shift ;;
		--group) group=1; shift ;;
		*) die "run: unknown argument '$1' (see --help)" ;;
		esac
	done
	for c in "${want_cfgs[@]}"; do
		[[ " ${ALL_CONFIGS[*]} " == *" $c "* ]] || die "unknown configuration '$c' (A, B, C, D, K, U or V)"
	done
	for k in "${want_cases[@]}"; do
		[ -f "$(case_file "$k")" ] || die "no such case: $(case_file "$k")"
	done
	[ "${#want_cfgs[@]}" -gt 0 ] || want_cfgs=("${CONFIGS[@]}")
	[ "${#want_cases[@]}" -gt 0 ] || mapfile -t want_cases < <(all_cases)
	[ "${#want_cases[@]}" -gt 0 ] || die "no cases in $TB_DIR/cases"
	need_tools "$QEMU" timeout od
	# the plan: (config, cases) boots
	for c in "${want_cfgs[@]}"; do
		cfgcases=
		for k in "${want_cases[@]}"; do
			if [[ " $(case_configs "$k") " == *" $c "* ]]; then
				if [ "$group" = 1 ]; then
					cfgcases+="${cfgcases:+,}$k"
				else
					plan+=("$c $k")
				fi
			fi
		done
		[ "$group" = 1 ] && [ -n "$cfgcases" ] && plan+=("$c $cfgcases")
	done
	[ "${#plan[@]}" -gt 0 ] || die "no case applies to configuration(s) ${want_cfgs[*]}"
	if [ "${NO_BUILD:-0}" != 1 ]; then
		local bc=()
		for c in "${want_cfgs[@]}"; do
			bc+=("$c")
		done
		phase build cmd_build "${bc[@]}"
	fi
	# The boots only read what build left in the cache: let other testbed.sh users (module
	# builds, kbuild-env) have it while the guests run.
	unlock "$CACHE"
	lock "$WORK"
	lock_guests
	rm -rf "$WORK/runs"
	mkdir -p "$WORK/runs"
	RESULTS=$WORK/runs/results.tsv
	: >"$RESULTS"
	t0=$(now)
	log "== run: ${#plan[@]} guest boot(s)"
	for k in "${plan[@]}"; do
		boot_guest "${k%% *}" "${k#* }"
	done
	PHASES+=("run $(secs "$t0" "$(now)")")
	summarize
}

summarize() {
	local np nf ns_
	np=$(grep -c '^pass' "$RESULTS" || true)
	nf=$(grep -c '^fail' "$RESULTS" || true)
	ns_=$(grep -c '^skip' "$RESULTS" || true)
	if [ "$nf" != 0 ]; then
		echo
		echo "failures:"
		awk -F'\t' '
			$1 == "fail" { printf "  [%s] %s: %s\n", $2, $3, $4; last = 1; next }
			$1 == "diag" && last { printf "  [%s] %s:     %s\n", $2, $3, $4; next }
			{ last = 0 }' "$RESULTS"
	fi
	echo
	log "results: $RESULTS, logs: $WORK/runs"
	print_phases
	echo "$np passed, $nf failed, $ns_ skipped"
	[ "$nf" = 0 ]
}

# ---------------------------------------------------------------------------

usage() {
	cat <<EOF
usage: $0 COMMAND [OPTIONS]

QEMU guest test bed for upcie (see tests/guest/README.md).

commands:
  fetch        resolve and download the guest kernels (Debian $K61_SUITES: 6.1;
               $K7_SUITES: newest ${K7_MIN_MAJOR}.x), unpack them into the cache
  build-oot    rebuild iommufd + the vfio stack for the ${K7_MIN_MAJOR}.x kernel (cached per version)
  build-fio    build fio from Debian's source package (cached; the fio cases need it)
  build-debug  build the debug kernel of configuration K from the ${K7_MIN_MAJOR}.x slot's linux-source
               (tests/guest/debug.config; cached per kernel and config; tens of minutes)
  build-iouring  build the kernel of configuration U: the ${K7_MIN_MAJOR}.x linux-source with the io_uring
               dma-buf registered-buffer series (UPCIE_TESTBED_IOURING_SERIES) applied by
               tests/guest/tools/iouring-port.py (tests/guest/iouring.config; cached, incremental)
  build        static test programs, upcie's kernel modules (dkms/) and the initramfs images
  kbuild-env k61|k7   print the module build environment of a guest kernel (fetched if missing)
  run [--config A|B|C|D|K|U|V]... [--case NAME]... [--show] [--keep] [--group]
               boot guests and run cases (default: every case on every one of A, B,
               C and D it declares; K, U and V only when named); ends with "N passed, N failed, N skipped"
                 --show   stream the guest consoles
                 --keep   keep the backing files of passing boots too
                 --group  one boot per configuration for all its cases (faster,
                          less isolated: cases share the guest and the files)
  all [run options]   fetch + build-oot + build-fio + build + run
  shell [--config A|B|C|D|K|U|V]   boot a guest with an interactive shell on this terminal
  help         this text

configurations:
  A  ${CFG_TEXT[A]}
  B  ${CFG_TEXT[B]}
  C  ${CFG_TEXT[C]}
  D  ${CFG_TEXT[D]}
  K  ${CFG_TEXT[K]}
  U  ${CFG_TEXT[U]}
  V  ${CFG_TEXT[V]}

environment:
  UPCIE_TESTBED_CACHE  downloads, kernels, out-of-tree modules ($CACHE)
  UPCIE_TESTBED_WORK   builds, backing files, logs ($WORK)
  UPCIE_TESTBED_IOURING_SERIES  the io_uring dma-buf series' patches for build-iouring
                       (default: ../shared/field/iouring-dmabuf-v3 beside the repository)
  UPCIE_TESTBED_K7_SUITES   suites searched for the 7.x kernel ("$K7_SUITES")
  UPCIE_TESTBED_OOT_CC      kernel (the kernel's own gcc, unpacked) or host (gcc-12)
  UPCIE_TESTBED_MIRROR      Debian mirror (default: from /etc/apt/sources.list.d/debian.sources)
  UPCIE_TESTBED_APPEND      extra tb_KEY=VALUE words for the guests' kernel command line
  UPCIE_TESTBED_CASE_TIMEOUT, UPCIE_TESTBED_BOOT_TIMEOUT   seconds ($CASE_TIMEOUT, +$BOOT_TIMEOUT per boot)
EOF
}

main() {
	local cmd=${1:-help}
	case $OOT_CC in kernel | host) ;; *) die "UPCIE_TESTBED_OOT_CC must be 'kernel' or 'host'" ;; esac
	[ $# -gt 0 ] && shift
	case $cmd in
	help | -h | --help) usage ;;
	fetch) phase fetch cmd_fetch; print_phases ;;
	build-oot) phase build-oot cmd_build_oot; print_phases ;;
	build-debug) phase build-debug cmd_build_debug; print_phases ;;
	build-iouring) phase build-iouring cmd_build_iouring; print_phases ;;
	kbuild-env) cmd_kbuild_env "$@" ;;
	build) phase build cmd_build "$@"; print_phases ;;
	run) cmd_run "$@" ;;
	shell) cmd_shell "$@" ;;
	build-fio) phase build-fio cmd_build_fio; print_phases ;;
	all)
		phase fetch cmd_fetch
		phase build-oot cmd_build_oot
		phase build-fio cmd_build_fio
		phase build cmd_build
		NO_BUILD=1 cmd_run "$@"
		;;
	*) usage >&2; die "unknown command '$cmd'" ;;
	esac
}

# sourced (tests/install/dkms-install.sh uses the helpers above): define, do not run
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
	main "$@"
fi
