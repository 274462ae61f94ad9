#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# boot: the guest is what the test bed promises: kernel, PCI functions, IOMMU
# groups, modules, namespaces and the backing-file pattern. Writes a known
# pattern to two namespaces for boot.host.sh to find in the images.
#
# configs: A B C
# timeout: 120
# shellcheck source=../lib/tb.sh
. /tests/lib/tb.sh

tap_is "$(uname -r)" "$TB_KERNEL" "kernel $TB_KERNEL booted (config $TB_CONFIG)"

# --- PCI functions --------------------------------------------------------
nvme=
ivshmem=
for d in /sys/bus/pci/devices/*; do
	id="$(cat "$d/vendor"):$(cat "$d/device"):$(cat "$d/class")"
	case $id in
	0x1b36:0x0010:0x010802) nvme="$nvme ${d##*/}" ;;
	0x1af4:0x1110:*) ivshmem="$ivshmem ${d##*/}" ;;
	esac
done
tap_is "$(echo $nvme)" "$TB_C0_BDF $TB_C1_BDF" "two NVMe functions 1b36:0010 class 010802 at $TB_C0_BDF and $TB_C1_BDF"
tap_is "$(echo $ivshmem)" "$TB_VRAM_BDF" "one ivshmem function 1af4:1110 at $TB_VRAM_BDF"

# ivshmem BAR2 is the emulated device memory
# shellcheck disable=SC2046
set -- $(sed -n 3p "/sys/bus/pci/devices/$TB_VRAM_BDF/resource")
bar2_size=$(($2 - $1 + 1))
tap_is "$bar2_size" "$(($(echo "$TB_VRAM_SIZE" | sed 's/M$//') * 1048576))" "ivshmem BAR2 is $TB_VRAM_SIZE (flags $3)"
tap_info vram_bar2 "$1"

# --- IOMMU ----------------------------------------------------------------
groups=$(ls /sys/kernel/iommu_groups 2>/dev/null | wc -l)
if [ "$TB_IOMMU" = 1 ]; then
	if grep -q 'DMAR: IOMMU enabled' /run/tb/boot.dmesg; then
		tap_ok "kernel log: DMAR: IOMMU enabled"
	else
		tap_fail "kernel log: DMAR: IOMMU enabled" "$(grep -i -e dmar -e iommu /run/tb/boot.dmesg | head -n 20)"
	fi
	seen=
	ok=1
	for bdf in "$TB_C0_BDF" "$TB_C1_BDF" "$TB_VRAM_BDF"; do
		g=$(basename "$(readlink "/sys/bus/pci/devices/$bdf/iommu_group" 2>/dev/null)" 2>/dev/null)
		case " $seen " in *" $g "*) ok=0 ;; esac
		[ -n "$g" ] || ok=0
		seen="$seen $g"
	done
	if [ "$ok" = 1 ]; then
		tap_ok "iommu groups: $groups; NVMe and ivshmem functions in their own groups ($(echo $seen))"
	else
		tap_fail "NVMe and ivshmem functions each in their own iommu group" "groups:$seen"
	fi
	tap_is "$(cat /sys/kernel/iommu_groups/*/type 2>/dev/null | sort -u | head -n 1)" DMA \
		"default domains translate (type DMA)"
else
	tap_is "$groups" 0 "no iommu groups without an IOMMU"
	if [ -e "/sys/bus/pci/devices/$TB_C0_BDF/iommu_group" ]; then
		tap_fail "NVMe function has no iommu group"
	else
		tap_ok "NVMe function has no iommu group"
	fi
fi

# --- modules ----------------------------------------------------------------
for m in uio_pci_generic vfio_pci vfio_iommu_type1 vgem; do
	if tb_modprobe "$m" && [ -d "/sys/module/$m" ]; then
		tap_ok "module $m loads"
	else
		tap_fail "module $m loads"
	fi
done
if [ -c /dev/udmabuf ]; then
	tap_ok "/dev/udmabuf present"
else
	tap_skip "/dev/udmabuf present" "no udmabuf in $(uname -r)"
fi

if [ "$TB_OOT" = 1 ]; then
	if tb_modprobe iommufd && [ -c /dev/iommu ]; then
		tap_ok "iommufd loads, /dev/iommu present"
	else
		tap_fail "iommufd loads, /dev/iommu present"
	fi
	for m in iommufd vfio vfio_pci_core vfio_pci vfio_iommu_type1; do
		case $(cat "/sys/module/$m/taint" 2>/dev/null) in
		*O*) tap_ok "module $m is the out-of-tree rebuild" ;;
		*) tap_fail "module $m is the out-of-tree rebuild" "taint: '$(cat "/sys/module/$m/taint" 2>/dev/null)'" ;;
		esac
	done
	if out=$(tb_iommufd_probe 2>&1); then
		tap_ok "IOMMU_IOAS_ALLOC/IOVA_RANGES/DESTROY on /dev/iommu"
		tap_diag "$out"
	else
		tap_fail "IOMMU_IOAS_ALLOC/IOVA_RANGES/DESTROY on /dev/iommu" "$out"
	fi
else
	if [ -e /dev/iommu ]; then
		tap_fail "no /dev/iommu (Debian kernels lack iommufd)"
	else
		tap_ok "no /dev/iommu (Debian kernels lack iommufd)"
	fi
fi

# vfio-pci takes the ivshmem function where there is an IOMMU
if [ "$TB_IOMMU" = 1 ]; then
	if tb_bind "$TB_VRAM_BDF" vfio-pci; then
		g=$(basename "$(readlink "/sys/bus/pci/devices/$TB_VRAM_BDF/iommu_group")")
		tap_check "vfio-pci bound to ivshmem, /dev/vfio/$g present" test -c "/dev/vfio/$g"
		if [ "$TB_OOT" = 1 ]; then
			cdev=$(ls "/sys/bus/pci/devices/$TB_VRAM_BDF/vfio-dev" 2>/dev/null | head -n 1)
			tap_check "vfio cdev /dev/vfio/devices/${cdev:-?} present" test -c "/dev/vfio/devices/$cdev"
		fi
	else
		tap_fail "vfio-pci bound to ivshmem" "driver: '$(tb_driver "$TB_VRAM_BDF")'"
	fi
	tb_unbind "$TB_VRAM_BDF"
else
	tap_skip "vfio-pci binds ivshmem" "no IOMMU in config $TB_CONFIG"
fi

# --- namespaces through the kernel nvme driver ------------------------------
tb_modprobe nvme || true
for ns in c0n1 c1n1 c1n3 c1n2; do
	want=$(tb_ns "$ns" lbs)
	ms=$(tb_ns "$ns" ms)
	if dev=$(tb_blockdev "$ns"); then
		got=$(cat "/sys/block/${dev#/dev/}/queue/logical_block_size")
		tap_is "$got" "$want" "$ns is $dev with $want-byte blocks$([ "$ms" = 0 ] || echo " (+$ms bytes metadata)")"
	else
		tap_fail "$ns ($(tb_ctrl_sn "$ns") nsid $(tb_ns "$ns" nsid)) has a block device" \
			"$(ls /sys/block)" "$(dmesg | grep -i nvme | tail -n 10)"
	fi
done

# --- the backing-file pattern reads back ------------------------------------
readback() { # NAME LBA COUNT
	dev=$(tb_blockdev "$1") || { tap_fail "read $1: no block device"; return; }
	lbs=$(tb_ns "$1" lbs)
	rm -f rb.bin
	if dd if="$dev" of=rb.bin bs="$lbs" skip="$2" count="$3" iflag=direct 2>/dev/null &&
		out=$(tbpat check rb.bin "$(tb_tag "$1")" $(($2 * lbs)) $(($3 * lbs)) 0 2>&1); then
		tap_ok "dd reads the pattern of $1 at LBA $2 (+$3)"
	else
		tap_fail "dd reads the pattern of $1 at LBA $2 (+$3)" "$out" "$(hexdump -C rb.bin 2>/dev/null | head -n 4)"
	fi
}
readback c0n1 0 1
readback c0n1 777 3
readback c1n1 5 2
readback c1n3 $(($(tb_ns c1n3 size | sed 's/M$//') * 2048 - 1)) 1

# --- writes for the host-side check (boot.host.sh) ---------------------------
writepat() { # NAME LBA COUNT TAG
	dev=$(tb_blockdev "$1") || { tap_fail "write $1: no block device"; return; }
	lbs=$(tb_ns "$1" lbs)
	off=$(($2 * lbs))
	len=$(($3 * lbs))
	if tbpat gen "$4" "$off" "$len" | dd of="$dev" bs="$lbs" seek="$2" count="$3" iflag=fullblock oflag=direct conv=fsync 2>/dev/null &&
		dd if="$dev" of=wb.bin bs="$lbs" skip="$2" count="$3" iflag=direct 2>/dev/null &&
		out=$(tbpat check wb.bin "$4" "$off" "$len" 0 2>&1); then
		tap_ok "wrote and read back pattern '$4' on $1 at LBA $2 (+$3)"
		tap_info "write_$1" "$off+$len+$4"
	else
		tap_fail "wrote and read back pattern '$4' on $1 at LBA $2 (+$3)" "$out"
	fi
}
writepat c0n1 2048 16 "GW01$TB_NONCE"
writepat c1n1 100 2 "GW02$TB_NONCE"
sync

tap_done
