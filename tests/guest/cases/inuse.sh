#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# inuse: never take a device the system is using. With a filesystem of c0n1 mounted through the
# kernel nvme driver, `upcie-setup bind` and `unbind`, and upcie_nvme_dev_open() with bind (here
# through upcie-perf --bind), refuse with a message that names the mount; the controller stays
# with the kernel and the filesystem keeps working; `upcie-setup doctor` reports the same. The
# same for active swap on c1n3. Negative control: after umount the very same bind goes through.
# Overrides: --force takes the swap device, UPCIE_ALLOW_IN_USE=1 the mounted one (last: the
# kernel loses a mounted disk, which it survives).
#
# configs: A B C
# timeout: 180
# dmesg-allow: EXT4-fs|Buffer I/O error|I/O error, dev|blk_update_request|Write-error on swap|Read-error on swap
# shellcheck source=../lib/tb.sh
. /tests/lib/tb.sh

case $TB_CONFIG in
A) drv=uio_pci_generic path=uio ;;
*) drv=vfio-pci path=type1 ;;
esac
tb_modprobe nvme ext4 uio_pci_generic || { tap_fail "modules load"; tap_done; exit 1; }
[ "$drv" = vfio-pci ] && tb_modprobe vfio-pci
echo 64 >/proc/sys/vm/nr_hugepages
if ! dev=$(tb_blockdev c0n1) || ! swapdev=$(tb_blockdev c1n3); then
	tap_fail "the kernel driver brought up c0n1 and c1n3"
	tap_done
	exit 1
fi
name=${dev#/dev/}
mkdir -p /mnt/c0
tap_check "mke2fs on $dev" mke2fs -q "$dev"
tap_check "mount $dev on /mnt/c0" mount -t ext4 "$dev" /mnt/c0
echo "payload $TB_NONCE" >/mnt/c0/f && sync

# expect_refusal DESC WANT-TEXT CMD... : exit 1, the text in the message, driver unchanged
expect_refusal() {
	_d=$1 _w=$2
	shift 2
	_out=$("$@" 2>&1)
	_rc=$?
	if [ "$_rc" != 0 ] && printf '%s\n' "$_out" | grep -q "$_w" &&
		printf '%s\n' "$_out" | grep -q 'UPCIE_ALLOW_IN_USE=1'; then
		tap_ok "$_d"
	else
		tap_fail "$_d" "exit $_rc, want a refusal naming '$_w'" "$_out"
	fi
}
expect_refusal "upcie-setup bind refuses c0 while $name is mounted" "$name is mounted on /mnt/c0" \
	upcie-setup bind "$TB_C0_BDF" "$drv"
expect_refusal "upcie-setup unbind refuses it too" "$name is mounted on /mnt/c0" \
	upcie-setup unbind "$TB_C0_BDF"
expect_refusal "upcie_nvme_dev_open() with bind refuses it (upcie-perf --bind)" \
	"$name is mounted on /mnt/c0" upcie-perf --bdf "$TB_C0_BDF" --path "$path" --bind --time 1
tap_is "$(tb_driver "$TB_C0_BDF")" nvme "c0 is still with the kernel nvme driver"
tap_is "$(cat /mnt/c0/f 2>&1)" "payload $TB_NONCE" "the filesystem still works"
out=$(upcie-setup doctor 2>&1)
if printf '%s\n' "$out" | grep "driver" | grep "$TB_C0_BDF" | grep -q "in use: $name is mounted on /mnt/c0"; then
	tap_ok "doctor names the mount on c0"
else
	tap_fail "doctor names the mount on c0" "$(printf '%s\n' "$out" | grep driver)"
fi

# swap on c1n3
sname=${swapdev#/dev/}
tap_check "mkswap + swapon $swapdev" sh -c "mkswap $swapdev >/dev/null && swapon $swapdev"
expect_refusal "upcie-setup bind refuses c1 while $sname is swap" "$sname is active swap" \
	upcie-setup bind "$TB_C1_BDF" "$drv"
tap_is "$(tb_driver "$TB_C1_BDF")" nvme "c1 is still with the kernel nvme driver"
tap_check "upcie-setup bind --force takes c1 anyway" upcie-setup bind "$TB_C1_BDF" "$drv" --force
tap_is "$(tb_driver "$TB_C1_BDF")" "$drv" "c1 is with $drv"

# negative control: the same bind, nothing mounted
tap_check "umount /mnt/c0" umount /mnt/c0
tap_check "after umount, upcie-setup bind takes c0" upcie-setup bind "$TB_C0_BDF" "$drv"
tap_check "and gives it back to nvme" upcie-setup bind "$TB_C0_BDF" nvme
if dev=$(tb_blockdev c0n1) && mount -t ext4 "$dev" /mnt/c0 && [ "$(cat /mnt/c0/f)" = "payload $TB_NONCE" ]; then
	tap_ok "remounted $dev after the round trip, data intact"
else
	tap_fail "remounted c0n1 after the round trip, data intact"
fi
name=${dev#/dev/}
out=$(UPCIE_ALLOW_IN_USE=1 upcie-setup bind "$TB_C0_BDF" "$drv" 2>&1)
rc=$?
tap_is "$rc" 0 "UPCIE_ALLOW_IN_USE=1 overrides the refusal"
tap_is "$(tb_driver "$TB_C0_BDF")" "$drv" "c0 is with $drv"
tap_done
