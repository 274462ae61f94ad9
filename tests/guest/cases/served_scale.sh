#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# served_scale: eight controllers (c0 and s1..s7 of "# devices: scale"), one upcie-served
# process serving all of them (one socket each in /run/upcie), and one client process with one
# thread driving 4 queue pairs on each of 1, 2, 4 and 8 of them (queue j on LBA j * 2048, 1 MiB):
# every 4 KiB write is read back
# and checked. Figures: IOPS and the guest's CPU time per I/O as controllers are added (how the
# cost grows); then the last run fills each queue's range with its controller's pattern, which
# served_scale.host.sh checks in the images. Also 8 client processes at once, one per
# controller, verifying their ranges. Every client is isolated (the server builds the commands;
# root is granted namespace 1 of each controller).
#
# configs: A B C
# devices: scale
# timeout: 600
# shellcheck source=../lib/tb.sh
. /tests/lib/tb.sh

SECS=${TB_SERVED_SCALE_SECS:-5}
echo 512 >/proc/sys/vm/nr_hugepages
tb_user_path
bdfs="$TB_C0_BDF,$TB_SCALE_BDFS"
n=0
for b in $(echo "$bdfs" | tr ',' ' '); do
	tb_bind "$b" "$drv" || tap_fail "$b bound to $drv"
	n=$((n + 1))
done
tap_is "$n" 8 "eight controllers on this boot"
mkdir -p /run/upcie
/bin/upcie-served "$bdfs" --dir /run/upcie --path "$path" --grant 0:1 >/tmp/served.log 2>&1 &
srv=$!
ok=1
for b in $(echo "$bdfs" | tr ',' ' '); do
	tb_wait 30 test -S "/run/upcie/$b.sock" || ok=0
done
if [ "$ok" != 1 ]; then
	tap_fail "one upcie-served serving all eight" "$(cat /tmp/served.log)"
	tap_done
	exit 1
fi
tap_ok "one upcie-served process serving all eight controllers"
sleep 1

for c in 1 2 4 8; do
	fill=
	[ "$c" = 8 ] && fill=--fill
	out=$(/bin/t_served scale --bdfs "$bdfs" --dir /run/upcie --ctrls $c --queues 4 --qd 8 \
		--seconds "$SECS" $fill 2>&1)
	tap_is "$?" 0 "one client thread, $c controller(s) x 4 queue pairs, every read verified"
	printf '%s\n' "$out"
done

# eight client processes at once, one per controller, on LBA 8192..16383 (after the scale
# client's 4 MiB)
pids=
k=0
for b in $(echo "$bdfs" | tr ',' ' '); do
	/bin/t_served io --socket "/run/upcie/$b.sock" --tag "sp$k" --lba 8192 --blocks 8192 \
		--seconds 3 --qd 8 >/tmp/sp$k.log 2>&1 &
	pids="$pids $!"
	k=$((k + 1))
done
bad=0
for p in $pids; do wait "$p" || bad=$((bad + 1)); done
tap_is "$bad" 0 "8 client processes at once, one per controller, each verified its range"
[ "$bad" = 0 ] || cat /tmp/sp*.log | sed 's/^/# /'
kill -TERM "$srv"
wait "$srv"
grep stats /tmp/served.log | sed 's/^/# /'
tap_is "$(grep -c ' kept=0 ' /tmp/served.log)" 8 "server: no queue memory kept on any of the eight"
tap_done
