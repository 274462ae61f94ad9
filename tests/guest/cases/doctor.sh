#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# doctor: `upcie-setup doctor` on each configuration must say what the configuration is: no
# IOMMU and groups "none" in A; a translating intel-iommu and groups in B and C; vfio type1 ready
# once vfio-pci is loaded; /dev/iommu and MAP_FILE only in C (7.x with the rebuilt iommufd);
# udmabuf on 7.x; hugepages a warning at 0 and ok once reserved; every NVMe function with its
# driver; upcie's modules not loaded, then loaded (with their ABI identity where the modules
# carry one); no GPU. Facts the guest cannot give (no /boot/config) must read unknown. --json
# carries the same lines. The verdicts per path: with no hugepages nothing can run (exit 3, the
# host paths say hugepages decided it); once hugepages are reserved and c1 is on the
# configuration's driver, that path (A uio, B vfio type1, C vfio cdev + iommufd) is ready and
# the exit status is no longer 3; uio is "no" under a translating IOMMU.
#
# configs: A B C
# timeout: 120
# shellcheck source=../lib/tb.sh
. /tests/lib/tb.sh

doc() { upcie-setup doctor 2>&1; }
# want VERDICT CHECK SUBJECT-REGEX DETAIL-REGEX DESC
want() {
	if printf '%s\n' "$out" | grep -E "^$1 +$2 +$3" | grep -Eq "$4"; then
		tap_ok "$5"
	else
		tap_fail "$5" "want: $1 $2 $3 .. $4" "$(printf '%s\n' "$out" | grep -E " $2 " | head -n 6)"
	fi
}

echo 0 >/proc/sys/vm/nr_hugepages
tb_modprobe nvme
tb_blockdev c0n1 >/dev/null
out=$(doc)
printf '%s\n' "$out" | sed 's/^/# /'
if [ "$TB_IOMMU" = 1 ]; then
	want ok iommu "" "present \(dmar" "IOMMU present (intel-iommu)"
	want ok iommu-group "$TB_C0_BDF" "translating \(DMA" "c0's group translates"
else
	want info iommu "" "none: devices see physical addresses" "no IOMMU, said so"
	want info iommu-group "$TB_C0_BDF" "none: uio path only" "c0 has no group"
fi
want warn hugepages "" "none reserved" "no hugepages: a warning"
want info driver "$TB_C0_BDF" "bound to nvme, not in use" "c0: nvme, not in use"
want ok memlock "" "" "memlock: root"
want info gpu "" "no NVIDIA or AMD GPU" "no GPU in the guest"
want info module "dmabuf_import" "not loaded" "dmabuf_import not loaded"
# the release as a literal (Debian's 7.x releases carry a '+')
want info kernel "" "Linux $(printf '%s' "$TB_KERNEL" | sed 's/[.+]/\\&/g')" "the running kernel"
case $TB_KERNEL in
6.1.*)
	want info kernel "iommufd-map-file" "6.1 < 6.13" "6.1: no MAP_FILE"
	want info kernel "vfio-bar-dmabuf" "6.1 < 6.19" "6.1: no BAR dma-buf"
	;;
*)
	want unknown kernel "vfio-bar-dmabuf" "config-.* is unreadable" "7.x without /boot/config: BAR dma-buf unknown"
	want ok kernel "udmabuf" "/dev/udmabuf" "7.x: udmabuf built in"
	;;
esac

# verdicts per path: nothing can run without hugepages
case $TB_CONFIG in
A) p=uio ;;
B) p=vfio-type1 ;;
*) p=vfio-iommufd ;;
esac
upcie-setup doctor >/dev/null 2>&1
tap_is "$?" 3 "no hugepages: exit 3 (nothing can run here)"
if printf '%s\n' "$out" | grep -Eq "^path: $p +no +hugepages: none reserved.* -> upcie-setup hugepages reserve"; then
	tap_ok "path $p: no, decided by the hugepages, with the fix"
else
	tap_fail "path $p: no because of the hugepages" "$(printf '%s\n' "$out" | grep '^path:')"
fi

echo 32 >/proc/sys/vm/nr_hugepages
tb_modprobe uio_pci_generic dmabuf_import iommu_map_pa
[ "$TB_IOMMU" = 1 ] && tb_modprobe vfio-pci
[ "$TB_OOT" = 1 ] && tb_modprobe iommufd
drv=$([ "$TB_IOMMU" = 1 ] && echo vfio-pci || echo uio_pci_generic)
tb_bind "$TB_C1_BDF" "$drv"
out=$(doc)
printf '%s\n' "$out" | grep -E "hugepages|module|vfio|driver|map-file" | sed 's/^/# /'
want ok hugepages "" "32 reserved in all" "hugepages reserved: ok"
# vfio device cdevs: only the 7.x kernel with the rebuilt vfio has them (6.1 has
# /sys/class/vfio-dev, but no cdev)
if [ "$TB_OOT" = 1 ]; then
	want ok vfio "cdev" "vfio device cdevs" "C: vfio device cdevs"
else
	want info vfio "cdev" "no vfio device cdevs" "no vfio device cdevs on $TB_KERNEL"
fi
if [ "$TB_IOMMU" = 1 ]; then
	want ok vfio "type1" "/dev/vfio/vfio" "vfio type1 ready"
	want ok driver "$TB_C1_BDF" "vfio-pci: ready" "c1 with vfio-pci: ready"
else
	want ok driver "$TB_C1_BDF" "uio_pci_generic: ready" "c1 with uio_pci_generic: ready"
fi
if [ "$TB_OOT" = 1 ]; then
	want ok vfio "iommufd" "/dev/iommu present" "C: /dev/iommu"
	want ok kernel "iommufd-map-file" ">= 6.13 and /dev/iommu" "C: MAP_FILE available"
else
	want info vfio "iommufd" "no /dev/iommu" "no iommufd on stock Debian"
fi
for m in dmabuf_import iommu_map_pa; do
	if [ ! -d "/sys/module/$m" ]; then
		want info module "$m" "not loaded" "$m did not load here: said so"
	elif [ -r "/sys/module/$m/parameters/abi" ]; then
		want ok module "$m" "loaded, ABI" "$m loaded with its ABI identity"
	else
		want fail module "$m" "without upcie's identity" "$m loaded without an identity: said so"
	fi
done
upcie-setup doctor >/dev/null 2>&1
rc=$?
paths=$(printf '%s\n' "$out" | grep '^path:')
printf '%s\n' "$paths" | sed 's/^/# /'
if printf '%s\n' "$paths" | grep -Eq "^path: $p +ready " && [ "$rc" != 3 ]; then
	tap_ok "hugepages and c1 on $drv: path $p ready, exit $rc"
else
	tap_fail "path $p ready once hugepages and c1 are there" "exit $rc" "$paths"
fi
if [ "$TB_IOMMU" = 1 ]; then
	if printf '%s\n' "$paths" | grep -Eq "^path: uio +no "; then
		tap_ok "translating IOMMU: path uio no"
	else
		tap_fail "translating IOMMU: path uio no" "$paths"
	fi
fi
json=$(upcie-setup doctor --json 2>&1)
nt=$(printf '%s\n' "$out" | grep -Ec '^(ok|info|warn|fail|unknown) ')
nj=$(printf '%s\n' "$json" | grep -c '"check": ')
tap_is "$nj" "$nt" "--json carries as many lines as the text ($nt)"
if printf '%s\n' "$json" | grep -q '"summary": {"ok": ' &&
	printf '%s\n' "$json" | grep -q "\"path\": \"$p\", \"subject\": \"\", \"state\": \"ready\"" &&
	printf '%s\n' "$json" | grep -q '"exit": [01]'; then
	tap_ok "--json has the summary, path $p ready, the exit status"
else
	tap_fail "--json has the summary" "$(printf '%s\n' "$json" | tail -n 3)"
fi
tap_done
