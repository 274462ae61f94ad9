#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# fio: fio (3.33, built from Debian's source) with upcie's external ioengine, judged by fio's
# own verification: crc32c and md5, verify after the write phase (do_verify) and during it
# (verify_backlog), sequential, random and mixed read/write, on a 512 B namespace behind a
# controller with MDTS 512 KiB (requests split into several commands) and 4 KiB and 512 B
# namespaces behind one without a limit (one 4 MiB command: chained PRP lists), one LBA up to
# several MiB per request, PRPs and SGLs, several jobs (queues) on one controller, flushes and
# trims. The DMA path is the configuration's: uio (A), vfio type1 (B), vfio cdev + iommufd (C).
# Every write-and-verify job must read back as many bytes as it wrote (fio's terse output), so a
# job that silently skipped verification fails. Negative control: a block overwritten behind
# fio's back must make a verify-only pass fail. Metadata, PI and zones: zonemode=zbd on the
# zoned c1n4 (fio's zone hooks), with plain Writes and with Zone Append (upcie_zone_append=1:
# an LBA the engine does not expect must fail the job, naming both LBAs), pi_act/pi_chk on the
# PI type 1 c1n5 (a block rewritten without valid PI must fail the pi_chk read) with the
# application tag (apptag, pi_chk=APPTAG: a read expecting another tag must fail with the
# controller's application tag check), md_per_io_size with upcie_md_verify on c1n2 (changed
# metadata must fail it). The engine's refusals are checked too (upcie_gpu_copy=0 with
# verification among them: this engine has no CUDA, upcie_gpu=1 itself is refused).
#
# configs: A B C
# timeout: 600
# shellcheck source=../lib/tb.sh
. /tests/lib/tb.sh

ENGINE=/usr/lib/upcie/upcie_fio.so
if ! command -v fio >/dev/null 2>&1 || [ ! -f "$ENGINE" ]; then
	tap_skip "fio with the upcie engine" "fio not built (tests/guest/testbed.sh build-fio)"
	tap_done
	exit 0
fi
echo 256 >/proc/sys/vm/nr_hugepages
tb_modprobe nvme
tb_user_path
# dotted addresses: fio splits file names on ':'
C0=$(echo "$TB_C0_BDF" | tr ':' '.')
C1=$(echo "$TB_C1_BDF" | tr ':' '.')
tap_diag "fio $(fio --version), path $path, c0 $C0, c1 $C1"

# run_fio DESC CHECK FIO-ARGS... ; CHECK: verify (read back >= written > 0) or rc (exit 0 only)
run_fio() {
	_desc=$1 _chk=$2
	shift 2
	_out=$(fio --thread=1 --ioengine=external:$ENGINE --upcie_path=$path --minimal \
		--group_reporting=1 "$@" 2>&1)
	_rc=$?
	_line=$(printf '%s\n' "$_out" | grep '^3;' | tail -n 1)
	# terse v3: 5 error, 6 read KiB, 47 write KiB
	_err=$(printf '%s' "$_line" | cut -d';' -f5)
	_rd=$(printf '%s' "$_line" | cut -d';' -f6)
	_wr=$(printf '%s' "$_line" | cut -d';' -f47)
	if [ "$_rc" != 0 ] || [ "$_err" != 0 ] || printf '%s\n' "$_out" | grep -q 'verify: \|bad magic\|verify failed'; then
		tap_fail "$_desc" "fio exit $_rc, error field '$_err'" "$(printf '%s\n' "$_out" | grep -v '^3;' | tail -n 15)"
	elif [ "$_chk" = verify ] && { [ "${_wr:-0}" -le 0 ] || [ "${_rd:-0}" -lt "${_wr:-0}" ]; }; then
		tap_fail "$_desc" "read back ${_rd} KiB of ${_wr} KiB written: verification did not cover the writes"
	else
		tap_ok "$_desc (wrote ${_wr} KiB, read ${_rd} KiB)"
	fi
}

# fio_fails DESC ERE FIO-ARGS... : fio must exit non-zero with output matching ERE (a refusal, or
# a negative control's failure)
fio_fails() {
	_desc=$1 _re=$2
	shift 2
	_out=$(fio --ioengine=external:"$ENGINE" --upcie_path="$path" "$@" 2>&1)
	_rc=$?
	if [ "$_rc" != 0 ] && printf '%s\n' "$_out" | grep -q "$_re"; then
		tap_ok "$_desc (exit $_rc)"
	else
		tap_fail "$_desc" "exit $_rc" "$(printf '%s\n' "$_out" | tail -n 10)"
	fi
}

# the engine binds c0 itself (from the kernel driver: nothing is mounted, so the guard lets go)
tb_bind "$TB_C0_BDF" nvme
run_fio "c0n1 512 B: one-LBA sequential writes, flush every 8, crc32c, do_verify, upcie_bind=1" verify \
	--upcie_bind=1 --name=lba --filename="$C0/1" --rw=write --bs=512 --size=1M --iodepth=16 \
	--fsync=8 --verify=crc32c --do_verify=1
tap_is "$(tb_driver "$TB_C0_BDF")" "$drv" "the engine bound c0 to $drv"
# upcie_bind_any_class=1 passes through to the bind (an NVMe function binds as before)
tb_bind "$TB_C0_BDF" nvme
run_fio "c0n1: upcie_bind=1 upcie_bind_any_class=1 binds the NVMe function, reads" rc \
	--upcie_bind=1 --upcie_bind_any_class=1 --name=anyc --filename="$C0/1" --rw=read --bs=4k \
	--size=64k
tap_is "$(tb_driver "$TB_C0_BDF")" "$drv" "with upcie_bind_any_class=1 the engine bound c0 to $drv"
tb_bind "$TB_C1_BDF" "$drv"

run_fio "c0n1: random 512 B..3 MiB (MDTS 512 KiB: split), md5, verify_backlog" verify \
	--name=split --filename="$C0/1" --rw=randwrite --bsrange=512-3M --size=12M --offset=2M \
	--iodepth=4 --verify=md5 --verify_backlog=8
run_fio "c0n1: random read/write mix 4 KiB QD32, crc32c, verify_backlog" verify \
	--name=mix --filename="$C0/1" --rw=randrw --rwmixread=50 --bs=4k --size=4M --offset=16M \
	--iodepth=32 --verify=crc32c --verify_backlog=64
run_fio "c1n1 4 KiB: sequential 4 MiB commands (chained PRP lists), crc32c, do_verify" verify \
	--name=big --filename="$C1/1" --rw=write --bs=4M --size=16M --iodepth=2 --verify=crc32c \
	--do_verify=1
run_fio "c1n1: random 4 KiB..2 MiB with SGLs, md5, verify_backlog" verify \
	--upcie_sgl=1 --name=sgl --filename="$C1/1" --rw=randwrite --bsrange=4k-2M --blockalign=4k \
	--size=8M --offset=16M --iodepth=8 --verify=md5 --verify_backlog=16
run_fio "c1n1: 64 KiB mix split into 8 KiB commands (upcie_max_xfer), crc32c" verify \
	--upcie_max_xfer=8k --name=mx --filename="$C1/1" --rw=randrw --bs=64k --size=4M \
	--offset=24M --iodepth=8 --verify=crc32c --verify_backlog=16
run_fio "c1: three queues at once (two jobs on c1n3 512 B, one on c1n1), crc32c" verify \
	--name=q --filename="$C1/3" --numjobs=2 --rw=randwrite --bsrange=512-64k --size=2M \
	--offset_increment=4M --iodepth=8 --verify=crc32c --do_verify=1 \
	--name=q3 --filename="$C1/1" --numjobs=1 --rw=write --bs=128k --size=4M --offset=28M \
	--iodepth=4 --verify=crc32c --do_verify=1
# the engine says which job drives which queue pair: two clones of one job, two queue pairs
out=$(fio --thread=1 --ioengine=external:$ENGINE --upcie_path=$path --name=map --filename="$C1/3" \
	--numjobs=2 --rw=read --bs=4k --size=64k --iodepth=2 2>&1)
qids=$(printf '%s\n' "$out" | sed -n "s/^upcie: job map (thread [0-9]*): $TB_C1_BDF qid \([0-9]*\), [0-9]* entries, .* path$/\1/p" | sort -u)
if [ "$(printf '%s\n' "$qids" | grep -c .)" = 2 ]; then
	tap_ok "numjobs=2: each job names its queue pair (qids $(echo $qids))"
else
	tap_fail "numjobs=2: each job names its queue pair" "$(printf '%s\n' "$out" | grep '^upcie' | head -n 5)"
fi
run_fio "c0n1: random trims (Dataset Management)" rc \
	--name=trim --filename="$C0/1" --rw=randtrim --bs=64k --size=2M --offset=28M --iodepth=8

# negative control: verification through the engine catches a block changed behind fio's back
W="--name=nc --filename=$C1/1 --rw=write --bsrange=4k-1M --size=8M --offset=8M --iodepth=4 --verify=crc32c"
# shellcheck disable=SC2086
run_fio "negative control: write a verifiable region" rc $W --do_verify=0
# shellcheck disable=SC2086
run_fio "negative control: an untouched region verifies (verify_only)" rc $W --verify_only=1
run_fio "negative control: overwrite one block of it" rc \
	--name=corrupt --filename="$C1/1" --rw=write --bs=4k --size=4k --offset=12M \
	--buffer_pattern=0x55
# shellcheck disable=SC2086
fio_fails "negative control: the changed block fails fio's verification" \
	'verify: bad\|verify failed\|bad magic' --thread=1 $W --verify_only=1

# zoned c1n4 (1 MiB zones): fio's zonemode=zbd through the engine's zone hooks (Report Zones,
# Zone Reset, the open-zone limit), writes at the write pointers, verified; the second pass
# finds the zones full, so it only runs when the engine reset them
Z="--name=zbd --filename=$C1/4 --zonemode=zbd --direct=1 --rw=write --bsrange=4k-256k --size=4M --iodepth=4 --verify=crc32c --do_verify=1"
# shellcheck disable=SC2086
run_fio "c1n4 zoned: zonemode=zbd sequential writes over 4 zones, crc32c, do_verify" verify $Z
# shellcheck disable=SC2086
run_fio "c1n4 zoned: the same zones again (full: the engine resets their write pointers)" verify $Z
run_fio "c1n4 zoned: zonemode=zbd random writes (fio picks zones and write pointers), md5" verify \
	--name=zbdr --filename="$C1/4" --zonemode=zbd --direct=1 --rw=randwrite --bs=16k \
	--offset=4M --size=3M --iodepth=8 --verify=md5 --do_verify=1
fio_fails "c1n4 zoned: a writing job without zonemode=zbd is refused, naming zonemode=zbd" \
	'zonemode=zbd' --thread=1 --name=zw --filename="$C1/4" \
	--rw=write --bs=4k --size=64k

# Zone Append (upcie_zone_append=1): the same zones written with Zone Append (opcode 7Dh, the
# zone's first LBA); each completion's LBA must be fio's offset, and fio's verification reads
# the data back there
ZA="--upcie_zone_append=1 --name=zapp --filename=$C1/4 --zonemode=zbd --direct=1 --rw=write --bsrange=4k-256k --size=4M --iodepth=4 --verify=crc32c"
# shellcheck disable=SC2086
run_fio "c1n4 zoned: upcie_zone_append=1 writes over 4 zones (Zone Append), crc32c, do_verify" verify \
	$ZA --do_verify=1
# negative control: the engine told to expect every append one block further
# (UPCIE_FIO_TEST_APPEND_SKEW, honoured for tests) must fail the job, naming both LBAs
export UPCIE_FIO_TEST_APPEND_SKEW=1
# shellcheck disable=SC2086
out=$(fio --thread=1 --ioengine=external:$ENGINE --upcie_path=$path $ZA --do_verify=0 2>&1)
rc=$?
unset UPCIE_FIO_TEST_APPEND_SKEW
lbas=$(printf '%s\n' "$out" | sed -n 's/.*Zone Append at offset .*: the controller wrote it at LBA \([0-9]*\), fio expected LBA \([0-9]*\).*/\1 \2/p' | head -n 1)
# shellcheck disable=SC2086
set -- $lbas
if [ "$rc" != 0 ] && [ $# = 2 ] && [ "$2" = $(($1 + 1)) ]; then
	tap_ok "Zone Append negative control: an LBA one block off fails the job, naming LBA $1 and the expected $2 (exit $rc)"
else
	tap_fail "Zone Append negative control: an LBA one block off fails the job, naming both LBAs" \
		"exit $rc, LBAs '$lbas'" "$(printf '%s\n' "$out" | tail -n 10)"
fi
fio_fails "upcie_zone_append=1 on c1n1 (not zoned) is refused, naming upcie_zone_append" \
	'upcie_zone_append=1: .* namespace 1 is not zoned' --thread=1 --upcie_zone_append=1 \
	--name=zan --filename="$C1/1" --rw=write --bs=4k --size=64k
# c1 has no Zone Append Size Limit of its own (ZASL 0, MDTS 0); one command of the job's queue
# is the limit here
fio_fails "upcie_zone_append=1 with 128 KiB writes and upcie_max_xfer=64k is refused, naming the 64 KiB limit" \
	'upcie_zone_append=1: one command .* at most 65536 bytes' --thread=1 --upcie_zone_append=1 \
	--upcie_max_xfer=64k --name=zab --filename="$C1/4" --zonemode=zbd --direct=1 --rw=write \
	--bs=128k --size=1M

# c1n5, PI type 1 in 8 bytes of separate metadata: the controller inserts the PI (pi_act=1) and
# checks guard and reference tag on every read (pi_chk); fio's crc32c verifies the data
run_fio "c1n5 PI type 1: pi_act=1 pi_chk=GUARD,REFTAG writes, crc32c, do_verify" verify \
	--pi_act=1 --pi_chk=GUARD,REFTAG --name=pi --filename="$C1/5" --rw=randwrite \
	--bsrange=4k-256k --blockalign=4k --size=4M --iodepth=8 --verify=crc32c --do_verify=1
# negative control: a block rewritten behind fio's back with metadata that is no valid PI
# (pi_act=0: the engine's own metadata pattern lands where the PI was) fails the pi_chk read
P="--name=pinc --filename=$C1/5 --rw=write --bs=64k --size=1M --offset=4M --iodepth=4 --verify=crc32c"
# shellcheck disable=SC2086
run_fio "PI negative control: write a region with pi_act=1" rc --pi_act=1 $P --do_verify=0
# shellcheck disable=SC2086
run_fio "PI negative control: it reads back with pi_chk=GUARD,REFTAG (verify_only)" rc \
	--pi_act=1 --pi_chk=GUARD,REFTAG $P --verify_only=1
run_fio "PI negative control: rewrite one block with pi_act=0 (metadata, no PI)" rc \
	--pi_act=0 --md_per_io_size=8 --name=pibad --filename="$C1/5" --rw=write --bs=4k \
	--size=4k --offset=4608k
run_fio "PI negative control: without pi_chk the controller reads the block (no check)" rc \
	--pi_act=1 --name=pirel --filename="$C1/5" --rw=read --bs=4k --size=4k --offset=4608k
# shellcheck disable=SC2086
fio_fails "PI negative control: the pi_chk read of the changed block fails with the controller's PI status" \
	'end-to-end guard check error\|end-to-end reference tag check error' --thread=1 --pi_act=1 \
	--pi_chk=GUARD,REFTAG $P --verify_only=1
# the application tag: pi_act=1 makes the controller insert apptag with every block written,
# pi_chk=APPTAG makes it compare the tag of every block read (in the bits of apptag_mask)
A="--name=pat --filename=$C1/5 --rw=write --bs=64k --size=1M --offset=6M --iodepth=4 --verify=crc32c"
# shellcheck disable=SC2086
run_fio "c1n5 PI type 1: apptag=0x1234 pi_act=1 pi_chk=GUARD,REFTAG,APPTAG writes, crc32c, do_verify" verify \
	--pi_act=1 --apptag=0x1234 --pi_chk=GUARD,REFTAG,APPTAG $A --do_verify=1
# negative control: the region read expecting another tag fails with the controller's status
# shellcheck disable=SC2086
fio_fails "apptag negative control: read expecting apptag=0x4321 (pi_chk=APPTAG) fails with the application tag check" \
	'end-to-end application tag check error' --thread=1 --pi_act=1 --apptag=0x4321 \
	--pi_chk=APPTAG $A --verify_only=1
# shellcheck disable=SC2086
run_fio "apptag control: expecting 0x12ff under apptag_mask=0xff00 (only 0x12 compared) reads" rc \
	--pi_act=1 --apptag=0x12ff --apptag_mask=0xff00 --pi_chk=APPTAG $A --verify_only=1
fio_fails "apptag on c1n1 (no PI) is refused, naming apptag" \
	'apptag=0x1234, apptag_mask=0xffff: .* no protection information' --thread=1 \
	--apptag=0x1234 --name=pan --filename="$C1/1" --rw=read --bs=4k --size=64k
fio_fails "apptag with pi_act=0 is refused, naming pi_act" \
	'apptag=0x1234, apptag_mask=0xffff with pi_act=0' --thread=1 --pi_act=0 --apptag=0x1234 \
	--md_per_io_size=8 --name=pa0 --filename="$C1/5" --rw=read --bs=4k --size=64k
fio_fails "pi_chk=APPTAG with pi_act=0 is refused, naming pi_act=0" \
	'pi_chk=APPTAG with pi_act=0' --thread=1 --pi_act=0 --pi_chk=APPTAG --md_per_io_size=8 \
	--name=pa1 --filename="$C1/5" --rw=read --bs=4k --size=64k
fio_fails "apptag above 16 bits is refused" \
	'apptag=0x10000, .* 16 bits' --thread=1 --pi_act=1 --apptag=0x10000 \
	--name=pa2 --filename="$C1/5" --rw=read --bs=4k --size=64k
fio_fails "pi_chk on c1n1 (no PI) is refused, naming pi_chk" \
	'pi_chk=GUARD.*no protection' --thread=1 --pi_chk=GUARD \
	--name=pin --filename="$C1/1" --rw=read --bs=4k --size=64k

# c1n2, 16 bytes of separate metadata a block: md_per_io_size gives each I/O its metadata
# buffer; the engine writes a pattern of the LBA there and upcie_md_verify checks it on reads
run_fio "c1n2 metadata: md_per_io_size=1k, 4..64 KiB, crc32c + upcie_md_verify, do_verify" verify \
	--md_per_io_size=1k --upcie_md_verify=1 --name=md --filename="$C1/2" --rw=randwrite \
	--bsrange=4k-64k --blockalign=4k --size=4M --iodepth=8 --verify=crc32c --do_verify=1
M="--md_per_io_size=256 --upcie_md_verify=1 --name=mdnc --filename=$C1/2 --rw=write --bs=16k --size=512k --offset=4M --verify=crc32c"
# shellcheck disable=SC2086
run_fio "metadata negative control: write a region" rc $M --do_verify=0
# shellcheck disable=SC2086
run_fio "metadata negative control: its metadata verifies (verify_only)" rc $M --verify_only=1
run_fio "metadata negative control: rewrite one block's metadata (upcie_md_seed=1)" rc \
	--md_per_io_size=16 --upcie_md_seed=1 --name=mdbad --filename="$C1/2" --rw=write \
	--bs=4k --size=4k --offset=4160k
# shellcheck disable=SC2086
fio_fails "metadata negative control: the changed metadata fails upcie_md_verify at LBA 1040" \
	'metadata of LBA 1040 .*md_verify' --thread=1 $M --verify_only=1
fio_fails "c1n2: md_per_io_size below the request's metadata is refused, naming the bytes needed" \
	'md_per_io_size=64: .* needs 256 bytes' --thread=1 --md_per_io_size=64 \
	--name=mds --filename="$C1/2" --rw=read --bs=64k --size=64k

# refusals, each with its reason
fio_fails "fork mode (thread=0) is refused, naming thread=1" \
	'needs thread=1' --thread=0 --name=f --filename="$C0/1" \
	--rw=read --bs=4k --size=64k
fio_fails "c1n2 (separate metadata) without md_per_io_size is refused, naming md_per_io_size" \
	'metadata per block in a separate buffer: set md_per_io_size' --thread=1 --name=md --filename="$C1/2" \
	--rw=read --bs=4k --size=64k
fio_fails "upcie_bind_any_class=1 without upcie_bind=1 is refused, naming upcie_bind" \
	'upcie_bind_any_class=1 only matters with upcie_bind=1' --thread=1 --upcie_bind_any_class=1 \
	--name=ac --filename="$C0/1" --rw=read --bs=4k --size=64k
fio_fails "upcie_bind=1 on the ivshmem function (not NVMe) is refused, naming upcie_bind_any_class" \
	'upcie_bind_any_class=1 to bind it anyway' --thread=1 --upcie_bind=1 --name=nonvme \
	--filename="$(echo "$TB_VRAM_BDF" | tr ':' '.')/1" --rw=read --bs=4k --size=64k
# upcie_gpu: this engine is the build without CUDA; upcie_gpu_copy=0 with verification is refused
# before anything else about the GPU (naming upcie_gpu_copy), upcie_gpu=1 otherwise for want of
# CUDA, as before upcie_gpu_copy existed
fio_fails "upcie_gpu=1 upcie_gpu_copy=0 with verify=crc32c is refused, naming upcie_gpu_copy" \
	'upcie_gpu_copy=0 with verification' --thread=1 --upcie_gpu=1 --upcie_gpu_copy=0 \
	--verify=crc32c --name=gc0 --filename="$C0/1" --rw=read --bs=4k --size=64k
fio_fails "upcie_gpu=1 upcie_gpu_copy=0 without verification: refused by the engine without CUDA" \
	'upcie_gpu=1: this engine was built without CUDA' --thread=1 --upcie_gpu=1 \
	--upcie_gpu_copy=0 --name=gnc --filename="$C0/1" --rw=read --bs=4k --size=64k
fio_fails "a file name that is no PCI address is refused with an example" \
	"0000.01.00.0/1" --thread=1 --name=bad --filename=nvme0 \
	--rw=read --bs=4k --size=64k
tap_done
