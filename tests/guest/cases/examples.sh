#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# examples: the example programs run as a user runs them, on the path of the configuration (A
# uio, B vfio type1, C vfio cdev + iommufd), and judged by their exit status and what they print.
# examples/nvme_async takes c0 from the kernel's nvme driver and drives four queue pairs from
# four threads at QD 16 (save, write, read back, restore on its own slice of c0n1 each);
# examples/peer_bar_dma reads 1 MiB of c1n1 into the ivshmem BAR ("VRAM") peer to peer and
# compares it through the BAR's CPU mapping, after refusing, on the vfio paths, a peer it was not
# allowed to bind. examples.host.sh checks the images: c0n1 restored byte for byte, c1n1
# untouched, the read's bytes in vram.img at the slice's offset, the rest of vram.img untouched.
#
# configs: A B C
# timeout: 200
# shellcheck source=../lib/tb.sh
. /tests/lib/tb.sh

echo 64 >/proc/sys/vm/nr_hugepages
tb_modprobe nvme uio_pci_generic
path=uio
if [ "$TB_IOMMU" = 1 ]; then
	[ "$TB_OOT" = 1 ] && tb_modprobe iommufd
	tb_modprobe vfio_iommu_type1 vfio-pci
	path=type1
	[ "$TB_OOT" = 1 ] && path=iommufd
fi

# run DESC EXPECT_RC CMD...: the program's output as diagnostics; ok when its exit status is
# EXPECT_RC. The output stays in out.txt for the checks after it.
run() {
	_d=$1 _want=$2
	shift 2
	"$@" >out.txt 2>&1
	_rc=$?
	sed 's/^/# /' out.txt
	if [ "$_rc" = "$_want" ]; then
		tap_ok "$_d"
	else
		tap_fail "$_d" "exit status $_rc, expected $_want: $*"
	fi
}

# --- nvme_async on c0, taken from the kernel's nvme driver ---
tb_bind "$TB_C0_BDF" nvme || tap_diag "binding $TB_C0_BDF to nvme failed"
tb_blockdev c0n1 >/dev/null || tap_diag "the kernel did not bring c0n1 up"
run "nvme_async: 4 queues x QD 16 on c0 ($path) verified and restored" 0 \
	nvme_async --path "$path" --queues 4 --qd 16 --bytes 262144 "$TB_C0_BDF"
n=$(grep -c 'read-back verified, original data restored' out.txt)
tap_is "$n" 4 "nvme_async: each of the 4 threads verified and restored its slice"
deep=$(sed -n 's/.* up to \([0-9]*\) in flight.*/\1/p' out.txt | awk '$1 > 1' | wc -l)
tap_is "$deep" 4 "nvme_async: every queue had more than one request in flight"
qids=$(sed -n 's/^  queue \([0-9]*\) (thread.*/\1/p' out.txt | sort -u | wc -l)
tap_is "$qids" 4 "nvme_async: four distinct I/O queues"
# the slices: the last 4 x 256 KiB of c0n1, for the host script
size=$(tb_ns c0n1 size)
case $size in *M) size=$((${size%M} * 1048576)) ;; esac
tap_info async_c0n1 "$((size - 1048576))+1048576"

# --- peer_bar_dma: c1n1 LBAs 1000.. (4 KiB blocks) into vram [32 MiB, +1 MiB) ---
voff=33554432
len=1048576
lba=1000
if [ "$path" != uio ]; then
	run "peer_bar_dma refuses a peer not bound to vfio-pci without --bind-peer" 1 \
		peer_bar_dma --path "$path" --nsid 1 --lba $lba --bytes $len --bar 2 \
		--bar-offset $voff "$TB_C1_BDF" "$TB_VRAM_BDF"
	grep -q -- '--bind-peer does that' out.txt || tap_diag "no word on --bind-peer"
fi
run "peer_bar_dma: 1 MiB of c1n1 read into the ivshmem BAR ($path), matches a host read" 0 \
	peer_bar_dma --path "$path" --nsid 1 --lba $lba --bytes $len --bar 2 --bar-offset $voff \
	--bind-peer "$TB_C1_BDF" "$TB_VRAM_BDF"
grep -q 'the CPU view of the BAR matches a read into host memory' out.txt &&
	tap_info p2p_vram "$voff+$len+$((lba * 4096))"
tap_done
