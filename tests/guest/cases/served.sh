#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# served: upcie-served owns c0 (uio in A, vfio type1 in B, vfio cdev + iommufd in C) and serves
# its queue pairs to client processes (progs/t_served.c) over /run/upcie/c0.sock. The clients
# are isolated (the server builds every command from what they ask, inside what it granted:
# root LBA 0..28671 and 29696..31743 read-write, all of c0n1 read-only; uid 1000 28672..29695)
# unless a step says trusted:
#   - 2, 4 and 8 clients at once, each writing and verifying its own LBA range of c0n1;
#   - clients killed with kill -9 at random points for TB_SERVED_KILL seconds (default 15;
#     UPCIE_TESTBED_APPEND="tb_served_kill=N" for longer)
#     while two others verify their data throughout, then a sentinel that fills the freed
#     hugepages and checks nothing writes them;
#   - a client as uid 1000 (no privileges): first what it must not do (a trusted queue, Writes
#     past and far outside its grant, a region it does not have, data past its region, an opcode
#     off the allow-list: each refused), then verified I/O in its grant;
#   - the server killed with kill -9 under two clients, restarted: the clients see it go,
#     reconnect and finish verified;
#   - on C, device memory (a vfio BAR dma-buf of the ivshmem function) as the data of a
#     served queue, imported by the server with IOMMU_IOAS_MAP_FILE;
#   - cost: QD1 mean latency and QD32 IOPS (and the client's CPU time per I/O) of an isolated
#     client, a trusted one (doorbells relayed; then rung through the whole device, with
#     --trusted-whole-device) against the same loop in the process owning the controller;
#   - the server's own account at SIGTERM: every queue deleted with the controller's
#     confirmation, none kept.
# served.host.sh checks c0n1's image: each surviving client's range holds its pattern, the
# area no client was given is untouched.
#
# configs: A B C
# timeout: 600
# shellcheck source=../lib/tb.sh
. /tests/lib/tb.sh

S=/run/upcie/c0.sock
KILL_SECS=${TB_SERVED_KILL:-15}
echo 256 >/proc/sys/vm/nr_hugepages
tb_user_path
tb_bind "$TB_C0_BDF" "$drv" || tap_fail "c0 bound to $drv"
mkdir -p /run/upcie

srv_pid=
srv_start() { # extra options
	/bin/upcie-served "$TB_C0_BDF" --socket "$S" --path "$path" --mode 0666 \
		--grant 0:1:0+28672 --grant 0:1:29696+2048 --grant 0:1:ro \
		--grant 1000:1:28672+1024 "$@" >>/tmp/served.log 2>&1 &
	srv_pid=$!
	tb_wait 20 test -S "$S" && sleep 1
}
srv_stop() {
	kill -TERM "$srv_pid" 2>/dev/null
	wait "$srv_pid"
}
rnd() { # N -> 0..N-1
	echo $(($(od -An -N2 -tu2 /dev/urandom) % $1))
}

if ! srv_start; then
	tap_fail "upcie-served up on $S" "$(cat /tmp/served.log)"
	tap_done
	exit 1
fi
tap_ok "upcie-served up on $S ($path)"

# 1. several clients at once, ranges of 2048 blocks (1 MiB) from LBA 0
for n in 2 4 8; do
	pids=
	k=0
	while [ $k -lt $n ]; do
		/bin/t_served io --socket "$S" --tag "sc$k" --lba $((k * 2048)) --blocks 2048 \
			--seconds 4 --qd 8 >/tmp/sc$k.log 2>&1 &
		pids="$pids $!"
		k=$((k + 1))
	done
	bad=0
	for p in $pids; do
		wait "$p" || bad=$((bad + 1))
	done
	tap_is "$bad" 0 "$n clients at once, each verified its own range"
	[ "$bad" = 0 ] || cat /tmp/sc*.log | sed 's/^/# /'
done

# 2. kill -9 loop: survivors ss0/ss1 at 16384/18432, victims at 20480 + 2048 * i
/bin/t_served io --socket "$S" --tag ss0 --lba 16384 --blocks 2048 --seconds "$KILL_SECS" \
	--qd 8 >/tmp/ss0.log 2>&1 &
s0=$!
/bin/t_served io --socket "$S" --tag ss1 --lba 18432 --blocks 2048 --seconds "$KILL_SECS" \
	--qd 8 >/tmp/ss1.log 2>&1 &
s1=$!
v0= v1= v2= v3=
victim() { # I
	/bin/t_served io --socket "$S" --tag "sv$1" --lba $((20480 + 2048 * $1)) --blocks 2048 \
		--seconds 3600 --qd 16 >/dev/null 2>&1 &
	eval "v$1=\$!"
}
for i in 0 1 2 3; do victim $i; done
kills=0
end=$(($(date +%s) + KILL_SECS))
while [ "$(date +%s)" -lt "$end" ]; do
	sleep "0.$((1 + $(rnd 8)))"
	i=$(rnd 4)
	eval "p=\$v$i"
	kill -KILL "$p" 2>/dev/null && kills=$((kills + 1))
	wait "$p" 2>/dev/null
	victim "$i"
done
for i in 0 1 2 3; do
	eval "p=\$v$i"
	kill -KILL "$p" 2>/dev/null
	wait "$p" 2>/dev/null
done
# memory the victims gave back: taken by a sentinel, watched for DMA
sentinel=$(/bin/t_served sentinel --mb 64 --seconds 3 2>&1)
rc=$?
printf '%s\n' "$sentinel" | grep -v '^# tb:' | sed 's/^/# /'
tap_is "$rc" 0 "hugepages the killed clients gave back see no DMA ($(printf '%s\n' "$sentinel" | sed -n 's/^# tb: served_sentinel=//p'))"
bad=0
wait "$s0" || bad=$((bad + 1))
wait "$s1" || bad=$((bad + 1))
tap_is "$bad" 0 "$kills clients killed with kill -9 in ${KILL_SECS} s; the 2 others verified their data throughout"
[ "$bad" = 0 ] || cat /tmp/ss0.log /tmp/ss1.log | sed 's/^/# /'
grep -h '^# tb:' /tmp/ss0.log /tmp/ss1.log
tap_info served_kills "$kills"

# 3. an unprivileged client: what it must not do (the image past LBA 31744 is checked by the
#    host: a Write that got through would show there), then its own range
out=$(/bin/t_served attack --socket "$S" --lba 28672 --blocks 1024 --as 1000 2>&1)
tap_is "$?" 0 "an isolated client as uid 1000: every reach outside its grant refused"
printf '%s\n' "$out" | sed 's/^/# /'
out=$(/bin/t_served io --socket "$S" --tag su0 --lba 28672 --blocks 1024 --seconds 2 --qd 4 \
	--as 1000 2>&1)
tap_is "$?" 0 "a client as uid 1000 verified its range"
printf '%s\n' "$out" | sed 's/^/# /'

# the server's account of the kill -9 loop (a clean stop prints it), then a fresh server
srv_stop
stats=$(grep 'stats' /tmp/served.log | tail -1)
printf '%s\n' "$stats" | sed 's/^/# /'
made=$(printf '%s\n' "$stats" | sed -n 's/.* qp_made=\([0-9]*\).*/\1/p')
gone=$(printf '%s\n' "$stats" | sed -n 's/.* qp_gone=\([0-9]*\).*/\1/p')
case "$stats" in
*" kept=0 "*) tap_is "$gone" "$made" "kill -9 loop: every queue pair of the killed clients was deleted with the controller's confirmation ($gone), none kept" ;;
*) tap_fail "kill -9 loop: no queue memory kept" "$stats" ;;
esac
srv_start || tap_fail "upcie-served started again"

# 4. the server killed under two clients, restarted
/bin/t_served io --socket "$S" --tag sr0 --lba 29696 --blocks 1024 --seconds 8 --qd 8 \
	--reconnect >/tmp/sr0.log 2>&1 &
r0=$!
/bin/t_served io --socket "$S" --tag sr1 --lba 30720 --blocks 1024 --seconds 8 --qd 8 \
	--reconnect >/tmp/sr1.log 2>&1 &
r1=$!
sleep 2
kill -KILL "$srv_pid"
wait "$srv_pid" 2>/dev/null
srv_start || tap_fail "upcie-served restarted"
bad=0
wait "$r0" || bad=$((bad + 1))
wait "$r1" || bad=$((bad + 1))
tap_is "$bad" 0 "server killed with kill -9 and restarted: both clients reconnected and verified"
cat /tmp/sr0.log /tmp/sr1.log | sed 's/^/# /'

# 5. device memory as a served queue's data: a vfio BAR dma-buf of the ivshmem function (the
#    stand-in for GPU memory), imported by the server with IOMMU_IOAS_MAP_FILE (C only: vfio
#    BAR dma-bufs need Linux >= 6.19, and only iommufd imports them)
if [ "$path" = iommufd ]; then
	tb_bind "$TB_VRAM_BDF" vfio-pci || tap_fail "ivshmem bound to vfio-pci"
	out=$(/bin/t_served dmabuf --socket "$S" --vram "$TB_VRAM_BDF" --lba 32768 --blocks 2048 2>&1)
	tap_is "$?" 0 "NVMe reads into device memory (a vfio BAR dma-buf) through a served queue"
	printf '%s\n' "$out" | grep -v '^# tb:' | sed 's/^/# /'
	printf '%s\n' "$out" | grep '^# tb:'
	tb_unbind "$TB_VRAM_BDF"
else
	tap_skip "device memory through a served queue" "vfio BAR dma-bufs need the iommufd path and Linux >= 6.19 (C)"
fi

# 6. cost: an isolated client, a trusted one (relayed doorbells, then the whole device), the
#    owning process (below). Each run on a server of its own, whose poller account (how often
#    and how long it slept) is printed with the figures.
srv_stop
perf_served() { # name, perf options
	local name=$1
	shift
	srv_start || tap_fail "upcie-served started for $name"
	out=$(/bin/t_served perf --socket "$S" "$@" --ops 20000 2>&1)
	tap_is "$?" 0 "$name"
	printf '%s\n' "$out" | grep '^# tb:'
	srv_stop
	grep 'stats' /tmp/served.log | tail -1 |
		sed -n 's/.* \(relayed=[0-9]*\).* \(iso_ok=[0-9]*\).* \(naps=.*\)/# tb: served_poller \1 \2 \3/p'
	tb_wait 10 sh -c "! test -S $S"
}
for qd in 1 32; do
	perf_served "isolated client perf QD$qd" --qd $qd
	perf_served "trusted client perf QD$qd (relayed doorbells)" --trusted --qd $qd
done
tb_wait 10 sh -c "! test -S $S"
srv_start --trusted-whole-device || tap_fail "upcie-served restarted with --trusted-whole-device"
for qd in 1 32; do
	out=$(/bin/t_served perf --socket "$S" --direct --qd $qd --ops 20000 2>&1)
	tap_is "$?" 0 "trusted client perf QD$qd (doorbells through the whole device)"
	printf '%s\n' "$out" | grep '^# tb:'
	printf '%s\n' "$out" | grep -q "not granted" && tap_fail "the whole device handed to root"
done
out=$(/bin/t_served perf --socket "$S" --direct --as 1000 --lba 28672 --blocks 1024 --qd 1 \
	--ops 500 2>&1)
rc=$?
case "$out" in
*"not granted"*) granted=no ;;
*) granted=yes ;;
esac
tap_is "$rc/$granted" "0/no" "uid 1000 is refused the whole device and goes on isolated"

# 7. the server's account
srv_stop
stats=$(grep 'stats' /tmp/served.log | tail -1)
printf '%s\n' "$stats" | sed 's/^/# /'
case "$stats" in
*" kept=0 "*) tap_ok "server: no queue memory kept" ;;
*) tap_fail "server: no queue memory kept" "$stats" ;;
esac
made=$(printf '%s\n' "$stats" | sed -n 's/.* qp_made=\([0-9]*\).*/\1/p')
gone=$(printf '%s\n' "$stats" | sed -n 's/.* qp_gone=\([0-9]*\).*/\1/p')
tap_is "$gone" "$made" "server: every queue pair it made was deleted with the controller's confirmation"

for qd in 1 32; do
	out=$(/bin/t_served perf --bdf "$TB_C0_BDF" --path "$path" --qd $qd --ops 20000 2>&1)
	tap_is "$?" 0 "owner perf QD$qd"
	printf '%s\n' "$out" | grep '^# tb:'
done
grep -v 'stats' /tmp/served.log | sed 's/^/# /' | head -20
tap_done
