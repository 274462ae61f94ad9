#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# demo: the README's main job on the built-in default device. Starts where a user starts (the
# kernel's nvme driver owns both emulated controllers), shows what upcie-setup sees, runs a short
# benchmark (4 KiB random reads on c0 through the kernel, then through upcie's driver after it
# takes the controller: progs/t_nvme_perf.c), then examples/nvme_driver.c on both controllers:
# take, bring up, Identify, write/read verify, restore, shut down. nvme_driver's --path auto
# picks uio without an IOMMU (A), vfio type1 with one (B), the vfio cdev with iommufd where the
# kernel has them (C), and says so.
#
# configs: A B C
# timeout: 180
# shellcheck source=../lib/tb.sh
. /tests/lib/tb.sh

echo 64 >/proc/sys/vm/nr_hugepages
tb_modprobe nvme uio_pci_generic
[ "$TB_IOMMU" = 1 ] && tb_modprobe vfio_iommu_type1 vfio-pci
[ "$TB_OOT" = 1 ] && tb_modprobe iommufd
case $TB_CONFIG in
A) want_path=uio ;;
B) want_path=vfio-type1 ;;
*) want_path=vfio-iommufd ;;
esac
for bdf in "$TB_C0_BDF" "$TB_C1_BDF"; do
	tap_check "upcie-setup bind $bdf nvme" /bin/upcie-setup bind "$bdf" nvme
done
tb_wait 20 test -b "$(tb_blockdev c1n1)"
echo "--- upcie-setup list ---"
/bin/upcie-setup list
tap_is "$?" 0 "upcie-setup list exits 0"

echo "--- 4 KiB random reads: kernel nvme driver, then upcie, same controller, same boot ---"
dev=$(tb_blockdev c0n1)
out=$(/bin/t_nvme_perf --dev "$dev" --bdf "$TB_C0_BDF" --qd1 1000 --qd32 5000 2>&1)
rc=$?
printf '%s\n' "$out" | grep -v '^# tb:'
tap_is "$rc" 0 "short benchmark: both sides ran, every read verified"
# an expected condition (no MSI-X under uio) is not an error: a successful run prints none
if [ "$rc" = 0 ] && printf '%s\n' "$out" | grep -qE '^(# upcie error|upcie: error:)'; then
	tap_fail "short benchmark: no error line on success"
else
	tap_ok "short benchmark: no error line on success"
fi

for bdf in "$TB_C0_BDF" "$TB_C1_BDF"; do
	echo "--- nvme_driver $bdf ---"
	out=$(/bin/nvme_driver "$bdf" 2>&1)
	rc=$?
	printf '%s\n' "$out"
	tap_is "$rc" 0 "nvme_driver $bdf: identify, write/read verify, restore, shutdown"
	if [ "$rc" = 0 ] && printf '%s\n' "$out" | grep -qE '^(# upcie error|upcie: error:)'; then
		tap_fail "nvme_driver $bdf: no error line on success"
	else
		tap_ok "nvme_driver $bdf: no error line on success"
	fi
	if printf '%s\n' "$out" | grep -q 'read it back: verified'; then
		tap_ok "nvme_driver $bdf verified its data"
	else
		tap_fail "nvme_driver $bdf verified its data"
	fi
	if printf '%s\n' "$out" | grep -q "on the $want_path path (auto: "; then
		tap_ok "nvme_driver $bdf: --path auto chose $want_path and said why"
	else
		tap_fail "nvme_driver $bdf: --path auto chose $want_path and said why"
	fi
done
tap_done
