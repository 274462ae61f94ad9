#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# demo: the README's main job on the built-in default device. Shows what upcie sees of the
# emulated NVMe controllers, takes each from the kernel (uio_pci_generic without an IOMMU,
# vfio-pci with one) and brings it to a known state; examples/nvme_hello.c does the work.
#
# configs: A B C
# timeout: 120
# shellcheck source=../lib/tb.sh
. /tests/lib/tb.sh

tb_modprobe nvme uio_pci_generic
[ "$TB_IOMMU" = 1 ] && tb_modprobe vfio-pci
# Start where a user starts: the kernel's nvme driver owns both controllers.
for bdf in "$TB_C0_BDF" "$TB_C1_BDF"; do
	tap_check "upcie-setup bind $bdf nvme" /bin/upcie-setup bind "$bdf" nvme
done
tb_wait 20 test -b "$(tb_blockdev c1n1)"
echo "--- upcie-setup list ---"
/bin/upcie-setup list
tap_is "$?" 0 "upcie-setup list exits 0"
out=$(/bin/nvme_hello 2>&1)
rc=$?
printf '%s\n' "$out"
tap_is "$rc" 0 "nvme_hello exits 0"
n=$(printf '%s\n' "$out" | grep -c 'disabled: CSTS')
tap_is "$n" 2 "both controllers taken from the kernel and disabled"
n=$(printf '%s\n' "$out" | grep -c 'CC   0x[0-9a-f]* (EN 1, SHN 1)')
if [ "$TB_IOMMU" = 1 ]; then
	# vfio-pci resets the function when the device is opened: CC reads 0 by then.
	tap_is "$n" 0 "vfio-pci's reset on open cleared what the kernel driver left"
else
	tap_is "$n" 2 "both were left enabled with a normal shutdown by the kernel driver"
fi
tap_done
