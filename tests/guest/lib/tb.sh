# SPDX-License-Identifier: BSD-3-Clause
#
# Helpers for test bed cases (POSIX sh: busybox sh in the guest, bash on the
# host). Source it first:
#   guest case:   . /tests/lib/tb.sh
#   host script:  . "$TB_LIB/tb.sh"
#
# TAP output
#   tap_ok DESC                    ok N - DESC
#   tap_fail DESC [DIAG...]        not ok N - DESC, each DIAG as a "# " line
#   tap_skip DESC REASON           ok N - DESC # SKIP REASON
#   tap_check DESC CMD [ARG...]    ok if CMD succeeds, else not ok with its output
#   tap_is GOT WANT DESC           ok if the strings are equal
#   tap_diag TEXT                  "# TEXT" (ignored by the runner, shown on failure)
#   tap_info KEY VALUE             "# tb: KEY=VALUE" for the case's host script
#   tap_done                       prints the plan "1..N"; status 1 if any test failed
#
# Test bed facts (guest; from the kernel command line, see README.md)
#   TB_CONFIG (A|B|C|D) TB_KERNEL TB_IOMMU (0|1) TB_OOT (0|1) TB_NONCE
#   TB_C0_BDF TB_C0_SN TB_C1_BDF TB_C1_SN TB_VRAM_BDF TB_VRAM_SIZE TB_PMR_SIZE
#   D only: TB_IOMMU_PT (1) TB_NUMA_NODES (2) TB_C4_BDF TB_C4_SN TB_C4_READ_BPS TB_C5_BDF
#           TB_C5_SN TB_VRM2_BDF TB_VRM2_SIZE
#   TB_C2_BDF TB_C2_SN TB_C2_RERR TB_C2_WERR TB_C2_IOPS (faulty controller: boots of cases
#     with "# devices: faulty" only)
#   TB_C3_BDF TB_C3_SN (controller of an NVM subsystem: boots of cases with "# devices: subsys")
#   TB_C7_BDF TB_C7_SN (an SR-IOV PF with two VFs: boots of cases with "# devices: sriov")
#   TB_NS = name/nsid/lba-size/metadata-size/image-size,...
#   tb_tag NAME          pattern tag of a backing file: c0n1, c1n1, ..., vram, pmr (D: c4n1,
#                        c5n1, vrm2)
#   tb_ns NAME FIELD     nsid | lbs | ms | size of namespace NAME
#   tb_ctrl_bdf NAME     PCI address of the controller of namespace NAME (or c0, c1, c2, c3)
#   tb_blockdev NAME     /dev/nvmeXnY of namespace NAME (kernel nvme driver bound)
#   tb_modprobe MOD...   load modules and the softdeps kmod would load (vfio ->
#                        vfio_iommu_type1); print a diagnostic on failure
#   tb_bind BDF DRIVER   bind a PCI function to DRIVER (driver_override)
#   tb_unbind BDF        unbind a PCI function from its driver
#   tb_driver BDF        name of the driver bound to BDF ('' if none)
#   tb_user_path         set path (uio, type1, iommufd) and drv (uio_pci_generic, vfio-pci)
#                        for this configuration (A, B, others) and load the driver
#   tb_wait SECS CMD...  retry CMD every 0.2 s until it succeeds or SECS pass
#
# Host scripts (TB_* variables set by testbed.sh, see README.md)
#   tb_img NAME          backing file of c0n1, c1n1 ... c1n5, vram or pmr (D: also c4n1, c5n1,
#                        vrm2)
#   tb_tag NAME          as in the guest
#   tb_guest_info KEY    VALUE of the guest's "tap_info KEY VALUE" line

TB_TAP_N=0
TB_TAP_FAILED=0

tap_ok() {
	TB_TAP_N=$((TB_TAP_N + 1))
	echo "ok $TB_TAP_N - $1"
}

tap_fail() {
	TB_TAP_N=$((TB_TAP_N + 1))
	TB_TAP_FAILED=$((TB_TAP_FAILED + 1))
	echo "not ok $TB_TAP_N - $1"
	shift
	for _tb_l in "$@"; do
		printf '%s\n' "$_tb_l" | sed 's/^/# /'
	done
}

tap_skip() {
	TB_TAP_N=$((TB_TAP_N + 1))
	echo "ok $TB_TAP_N - $1 # SKIP ${2:-}"
}

tap_check() {
	_tb_desc=$1
	shift
	if _tb_out=$("$@" 2>&1); then
		tap_ok "$_tb_desc"
	else
		tap_fail "$_tb_desc" "command failed: $*" "$_tb_out"
	fi
}

tap_is() {
	if [ "$1" = "$2" ]; then
		tap_ok "$3"
	else
		tap_fail "$3" "got '$1', want '$2'"
	fi
}

tap_diag() {
	printf '%s\n' "$*" | sed 's/^/# /'
}

tap_info() {
	echo "# tb: $1=$2"
}

tap_done() {
	echo "1..$TB_TAP_N"
	[ "$TB_TAP_FAILED" -eq 0 ]
}

# ---------------------------------------------------------------------------

tb_pat_check() { # DESC FILE TAG OFFSET LEN [AT] (host): FILE [AT, +LEN) holds the pattern of [OFFSET, +LEN)
	if _tb_out=$("$TB_PAT" check "$2" "$3" "$4" "$5" ${6:+"$6"} 2>&1); then
		tap_ok "$1"
	else
		tap_fail "$1" "$_tb_out"
	fi
}

tb_tag() { # NAME -> 8-byte pattern tag
	case $1 in
	pmr) echo "pmr_${TB_NONCE}" ;;
	*) echo "$1${TB_NONCE}" ;;
	esac
}

tb_img() { # NAME (host)
	# shellcheck disable=SC2018,SC2019
	_tb_v=TB_IMG_$(echo "$1" | tr 'a-z' 'A-Z')
	eval "echo \"\${$_tb_v:-}\""
}

tb_guest_info() { # KEY (host) -> value printed by the guest's tap_info
	sed -n "s/^# tb: $1=//p" "$TB_GUEST_OUTPUT" | head -n 1
}

tb_ns() { # NAME FIELD
	_tb_i=
	case $2 in
	nsid) _tb_i=2 ;;
	lbs) _tb_i=3 ;;
	ms) _tb_i=4 ;;
	size) _tb_i=5 ;;
	*) return 1 ;;
	esac
	echo "$TB_NS" | tr ',' '\n' | awk -F/ -v n="$1" -v i="$_tb_i" '$1 == n { print $i; found = 1 } END { exit !found }'
}

tb_ctrl_bdf() { # NAME (c0n1 or c0) -> PCI address
	case $1 in
	c0*) echo "$TB_C0_BDF" ;;
	c1*) echo "$TB_C1_BDF" ;;
	c4*) [ -n "${TB_C4_BDF:-}" ] && echo "$TB_C4_BDF" ;;
	c5*) [ -n "${TB_C5_BDF:-}" ] && echo "$TB_C5_BDF" ;;
	c2*) echo "${TB_C2_BDF:?no faulty controller on this boot}" ;;
	c3*) echo "${TB_C3_BDF:?no subsystem controller on this boot}" ;;
	c7*) echo "${TB_C7_BDF:?no SR-IOV controller on this boot}" ;;
	vram) echo "$TB_VRAM_BDF" ;;
	vrm2) [ -n "${TB_VRM2_BDF:-}" ] && echo "$TB_VRM2_BDF" ;;
	*) return 1 ;;
	esac
}

tb_ctrl_sn() {
	case $1 in
	c0*) echo "$TB_C0_SN" ;;
	c1*) echo "$TB_C1_SN" ;;
	c4*) [ -n "${TB_C4_SN:-}" ] && echo "$TB_C4_SN" ;;
	c5*) [ -n "${TB_C5_SN:-}" ] && echo "$TB_C5_SN" ;;
	c6*) [ -n "${TB_C6_SN:-}" ] && echo "$TB_C6_SN" ;;
	c2*) echo "${TB_C2_SN:?no faulty controller on this boot}" ;;
	c3*) echo "${TB_C3_SN:?no subsystem controller on this boot}" ;;
	c7*) echo "${TB_C7_SN:?no SR-IOV controller on this boot}" ;;
	*) return 1 ;;
	esac
}

tb_wait() { # SECS CMD...
	_tb_n=$(($1 * 5))
	shift
	while ! "$@" >/dev/null 2>&1; do
		_tb_n=$((_tb_n - 1))
		[ "$_tb_n" -gt 0 ] || return 1
		sleep 0.2
	done
}

_tb_find_blockdev() { # SERIAL NSID
	for _tb_b in /sys/block/nvme*n*; do
		case ${_tb_b##*/} in *c*) continue ;; esac # hidden multipath paths
		[ -r "$_tb_b/device/serial" ] || continue
		[ "$(tr -d ' \n' <"$_tb_b/device/serial")" = "$1" ] || continue
		[ "$(cat "$_tb_b/nsid" 2>/dev/null)" = "$2" ] || continue
		echo "/dev/${_tb_b##*/}"
		return 0
	done
	return 1
}

tb_blockdev() { # NAME -> /dev/nvmeXnY, waits up to 20 s for the driver
	_tb_sn=$(tb_ctrl_sn "$1") || return 1
	_tb_nsid=$(tb_ns "$1" nsid) || return 1
	tb_wait 20 _tb_find_blockdev "$_tb_sn" "$_tb_nsid" || return 1
	_tb_find_blockdev "$_tb_sn" "$_tb_nsid"
}

_tb_softdeps() { # MODULE -> its pre: and post: soft dependencies
	awk -v m="$1" '$1 == "softdep" && $2 == m {
		for (i = 3; i <= NF; i++) if ($i != "pre:" && $i != "post:") print $i }' \
		"/lib/modules/$(uname -r)/modules.softdep" 2>/dev/null
}

tb_modprobe() { # MODULE... : modprobe, plus the softdeps kmod would load (busybox ignores them)
	for _tb_m in "$@"; do
		if ! _tb_out=$(modprobe "$_tb_m" 2>&1); then
			tap_diag "modprobe $_tb_m failed: $_tb_out"
			return 1
		fi
	done
	for _tb_m in /sys/module/*; do
		for _tb_s in $(_tb_softdeps "${_tb_m##*/}"); do
			[ -d "/sys/module/$_tb_s" ] || modprobe "$_tb_s" >/dev/null 2>&1 || true
		done
	done
}

tb_user_path() { # sets path and drv: this configuration's user-space path (A uio, B vfio type1,
	# otherwise vfio cdev + iommufd) and the kernel driver a function needs for it, loaded
	case $TB_CONFIG in
	A) path=uio drv=uio_pci_generic ;;
	B) path=type1 drv=vfio-pci ;;
	*) path=iommufd drv=vfio-pci ;;
	esac
	tb_modprobe uio_pci_generic
	[ "$drv" = vfio-pci ] && tb_modprobe vfio-pci
	return 0
}

tb_driver() { # BDF
	if [ -e "/sys/bus/pci/devices/$1/driver" ]; then
		basename "$(readlink "/sys/bus/pci/devices/$1/driver")"
	fi
}

tb_unbind() { # BDF
	if [ -e "/sys/bus/pci/devices/$1/driver" ]; then
		echo "$1" >"/sys/bus/pci/devices/$1/driver/unbind"
	fi
}

tb_bind() { # BDF DRIVER
	tb_unbind "$1" || return 1
	echo "$2" >"/sys/bus/pci/devices/$1/driver_override" || return 1
	echo "$1" >/sys/bus/pci/drivers_probe 2>/dev/null
	[ "$(tb_driver "$1")" = "$2" ]
}
