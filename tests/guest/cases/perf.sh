#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# perf: upcie-perf on the configuration's DMA path (uio in A, vfio type1 in B, iommufd in C) on
# c1 (and c0 beside it): a matrix of queues x QD x block size x pattern x mix in one call, JSON
# out (schema 2), one progress line per second on stderr naming its run. Checked: every
# combination ran and completed I/O without errors; its figures are consistent (IOPS x block
# size = MB/s, MiB/s = MB/s x 10^6 / 2^20, min <= p50 <= p99 <= p99.9 <= max; reads and writes
# apart add up to the total, the histogram's bins to the count, the per-queue lines to the total);
# the JSON carries its metadata; warm-up is not measured; --cpus pins the queue pairs' threads
# and never starts more threads than CPUs; several controllers and namespaces in one run; a
# combination that cannot run is a failed run in the output, named with its reason, and the
# others still run. Not a timed test: TCG figures say nothing about hardware.
#
# configs: A B C
# timeout: 300
# shellcheck source=../lib/tb.sh
. /tests/lib/tb.sh

echo 128 >/proc/sys/vm/nr_hugepages
tb_user_path
tb_bind "$TB_C1_BDF" "$drv" || tap_fail "bind c1 to $drv"

# The value of "key" in the text after the first occurrence of "after" (or in the whole line).
jget() { # LINE KEY [AFTER]
	printf '%s\n' "$1" | awk -v k="\"$2\": " -v a="$3" '{
		s = $0
		if (a != "") { i = index(s, a); if (!i) exit; s = substr(s, i + length(a)) }
		i = index(s, k); if (!i) exit
		s = substr(s, i + length(k)); sub(/[,}].*/, "", s); gsub(/"/, "", s); print s }'
}

upcie-perf --bdf "$TB_C1_BDF" --path "$path" --ns 1 --queues 1,2 --qd 1,8 --bs 4k,64k \
	--pattern rand,seq --mix 100,50 --time 1 --size 16M --json >/tmp/perf.json 2>/tmp/perf.err
rc=$?
tap_is "$rc" 0 "upcie-perf ran 32 combinations without an error"
runs=$(grep -c '"ok": true, "mode": "cpu"' /tmp/perf.json)
tap_is "$runs" 32 "32 summaries in the JSON"
head=$(head -n 1 /tmp/perf.json)
if printf '%s\n' "$head" | grep -q '^{"schema": 2, "tool": "upcie-perf", "version": ".*", "start": "20[0-9-]*T[0-9:]*Z", "host": ".*", "kernel": "'"$(uname -r)"'", "machine": ".*", "cpus_online": [0-9]*, "command": \["upcie-perf", "--bdf", "'"$TB_C1_BDF"'"' &&
	tail -n 1 /tmp/perf.json | grep -q '^], "failed": 0, "exit": 0}$'; then
	tap_ok "JSON head: schema 2, version, start time, host, kernel, command; tail: 0 failed, exit 0"
else
	tap_fail "JSON head and tail" "$head" "$(tail -n 1 /tmp/perf.json)"
fi
prog=$(grep -c '^\[run [0-9]*/32 queues=[12] qd=[18] bs=[0-9]* \(rand\|seq\) read=[0-9]*%\] \[ *[0-9]*s\] .*IOPS' /tmp/perf.err)
if [ "$prog" -ge 32 ]; then
	tap_ok "progress on stderr names its run ($prog lines)"
else
	tap_fail "progress on stderr names its run" "$prog lines" "$(tail -n 5 /tmp/perf.err)"
fi
bad=""
while IFS= read -r l; do
	case $l in *'"mode": "cpu"'*) ;; *) continue ;; esac
	ios=$(jget "$l" ios) errs=$(jget "$l" errors) iops=$(jget "$l" iops) bs=$(jget "$l" bs)
	mbps=$(jget "$l" mbps) mibps=$(jget "$l" mibps) mix=$(jget "$l" read_pct)
	q=$(jget "$l" queues)
	rios=$(jget "$l" ios '"read": {') wios=$(jget "$l" ios '"write": {')
	tail=${l##*\"lat_ns\": }
	p50=$(jget "$tail" p50) p99=$(jget "$tail" p99) p999=$(jget "$tail" p999)
	mn=$(jget "$tail" min) mx=$(jget "$tail" max)
	rbins=$(printf '%s\n' "$l" | sed 's/.*"read": {\(.*\)}, "write": {.*/\1/; s/.*"bins": {\([^}]*\)}.*/\1/' |
		tr ',' '\n' | awk -F': ' '{ s += $2 } END { print s + 0 }')
	nq=$(printf '%s\n' "$l" | sed 's/.*"per_queue": \[\(.*\)\], "lat_ns".*/\1/' | grep -o '"qid"' | wc -l)
	qsum=$(printf '%s\n' "$l" | sed 's/.*"per_queue": \[\(.*\)\], "lat_ns".*/\1/' | grep -o '"ios": [0-9]*' |
		awk '{ s += $2 } END { print s + 0 }')
	why=$(awk -v ios="$ios" -v errs="$errs" -v iops="$iops" -v bs="$bs" -v mbps="$mbps" \
		-v mibps="$mibps" -v mix="$mix" -v rios="$rios" -v wios="$wios" -v p50="$p50" \
		-v p99="$p99" -v p999="$p999" -v mn="$mn" -v mx="$mx" -v rbins="$rbins" -v nq="$nq" \
		-v q="$q" -v qsum="$qsum" 'BEGIN {
		if (ios <= 0 || errs != 0) { print "no I/O or errors"; exit }
		if (iops * bs / 1e6 < mbps * 0.99 || iops * bs / 1e6 > mbps * 1.01) print "MB/s != IOPS x bs"
		if (mibps < mbps * 1e6 / 1048576 * 0.999 || mibps > mbps * 1e6 / 1048576 * 1.001) print "MiB/s != MB/s x 10^6 / 2^20"
		if (!(mn <= p50 && p50 <= p99 && p99 <= p999 && p999 <= mx)) print "quantiles out of order"
		if (rios + wios != ios) print "read " rios " + write " wios " != " ios
		if (mix == 100 && wios != 0) print "writes in a read-only run"
		if (mix == 50 && (rios == 0 || wios == 0)) print "a 50 % mix without reads or writes"
		if (rbins != rios) print "read bins add up to " rbins ", not " rios
		if (nq != q || qsum != ios) print "per_queue: " nq " lines adding up to " qsum
	}')
	[ -n "$why" ] && bad="$bad
$why: $l"
done </tmp/perf.json
if [ -z "$bad" ]; then
	tap_ok "every summary: I/O done, no errors, MB/s = IOPS x bs, MiB/s, min <= p50 <= p99 <= p99.9 <= max, read + write = total, bins = count, per-queue lines add up"
else
	tap_fail "every summary consistent" "$bad"
fi
grep '"queues": 1, "qd": 1, "bs": 4096, "pattern": "rand", "read_pct": 100' /tmp/perf.json | cut -c 1-400 | sed 's/^/# /'
# the whole document for the record (docs/results/upcie-perf.md: sed -n 's/^#json //p')
sed 's/^/#json /' /tmp/perf.json

# text: totals, read and write apart, per-queue lines, chosen percentiles
out=$(upcie-perf --bdf "$TB_C1_BDF" --path "$path" --queues 2 --qd 4 --mix 50 --bs 4k --time 1 \
	--percentiles 50,90,99.9 2>/dev/null)
printf '%s\n' "$out" | sed 's/^/# /'
if printf '%s\n' "$out" | grep -q "IOPS, .* MB/s (.* MiB/s), latency us mean .* p50 .* p90 .* p99.9 .* max .*, cpu .* us/IO (.* CPUs busy)" &&
	printf '%s\n' "$out" | grep -q "^  read:  .* IOPS, latency us mean .* p50 " &&
	printf '%s\n' "$out" | grep -q "^  write: .* IOPS, latency us mean .* p50 " &&
	[ "$(printf '%s\n' "$out" | grep -c "^  queue [01] $TB_C1_BDF/1 qid [0-9]* thread [01] cpu [0-9]*: ")" = 2 ]; then
	tap_ok "text summary: IOPS, MB/s, MiB/s, the asked percentiles, CPU per I/O, read and write lines, one line per queue pair"
else
	tap_fail "text summary" "$out"
fi

# warm-up: measured for --time, not --ramp + --time; its progress lines say warm-up
out=$(upcie-perf --bdf "$TB_C1_BDF" --path "$path" --qd 4 --time 1 --ramp 2 --json 2>/tmp/ramp.err)
l=$(printf '%s\n' "$out" | grep '"mode"')
secs=$(jget "$l" secs) ramp=$(jget "$l" ramp_s)
wu=$(grep -c 'warm-up\] ' /tmp/ramp.err)
if awk -v s="$secs" 'BEGIN { exit !(s >= 0.95 && s < 1.5) }' && [ "$ramp" = 2.000 ] && [ "$wu" -ge 2 ]; then
	tap_ok "--ramp 2 --time 1: measured $secs s after a 2 s warm-up ($wu warm-up progress lines)"
else
	tap_fail "--ramp 2 --time 1" "secs $secs ramp $ramp, $wu warm-up lines" "$(cat /tmp/ramp.err)"
fi

# threads: --cpus 0 puts both queue pairs on one thread pinned to CPU 0; by default never
# more threads than CPUs (this guest has 2): 4 queue pairs, 2 threads
l=$(upcie-perf --bdf "$TB_C1_BDF" --path "$path" --queues 2 --cpus 0 --time 1 --json 2>/dev/null | grep '"mode"')
cpus=$(printf '%s\n' "$l" | grep -o '"thread": 0, "cpu": 0' | wc -l)
if [ "$(jget "$l" threads)" = 1 ] && [ "$cpus" = 2 ]; then
	tap_ok "--cpus 0 --queues 2: one thread on CPU 0 drives both queue pairs"
else
	tap_fail "--cpus 0 --queues 2" "$l"
fi
ncpu=$(grep -c '^processor' /proc/cpuinfo)
l=$(upcie-perf --bdf "$TB_C1_BDF" --path "$path" --queues 4 --time 1 --json 2>/dev/null | grep '"mode"')
th=$(jget "$l" threads)
if [ "$th" = "$ncpu" ] && [ "$(printf '%s\n' "$l" | grep -o '"qid"' | wc -l)" = 4 ]; then
	tap_ok "--queues 4 on $ncpu CPUs: $th threads, 4 queue pairs"
else
	tap_fail "--queues 4 on $ncpu CPUs: as many threads as CPUs" "$l"
fi

# several namespaces and controllers in one run
tb_bind "$TB_C0_BDF" "$drv" || tap_fail "bind c0 to $drv"
l=$(upcie-perf --bdf "$TB_C1_BDF" --bdf "$TB_C0_BDF" --path "$path" --ns 1 --qd 2 --time 1 --json 2>/dev/null | grep '"mode"')
t0=$(printf '%s\n' "$l" | grep -o "\"target\": \"$TB_C0_BDF/1\", \"qid\": [0-9]*, [^}]*\"ios\": [1-9]" | wc -l)
t1=$(printf '%s\n' "$l" | grep -o "\"target\": \"$TB_C1_BDF/1\", \"qid\": [0-9]*, [^}]*\"ios\": [1-9]" | wc -l)
if [ "$(jget "$l" targets)" = 2 ] && [ "$t0" = 1 ] && [ "$t1" = 1 ] && [ "$(jget "$l" errors)" = 0 ]; then
	tap_ok "--bdf c1 --bdf c0: one run, I/O on both controllers"
else
	tap_fail "--bdf c1 --bdf c0" "$l"
fi
l=$(upcie-perf --bdf "$TB_C1_BDF" --path "$path" --ns 1,3 --qd 2 --time 1 --json 2>/dev/null | grep '"mode"')
n1=$(printf '%s\n' "$l" | grep -o "\"target\": \"$TB_C1_BDF/1\", \"qid\": [0-9]*, [^}]*\"ios\": [1-9]" | wc -l)
n3=$(printf '%s\n' "$l" | grep -o "\"target\": \"$TB_C1_BDF/3\", \"qid\": [0-9]*, [^}]*\"ios\": [1-9]" | wc -l)
if [ "$n1" = 1 ] && [ "$n3" = 1 ]; then
	tap_ok "--ns 1,3: one run, I/O on both namespaces (4 KiB and 512 B blocks)"
else
	tap_fail "--ns 1,3" "$l"
fi

# a combination that cannot run: reported as a failed run, the others still run, exit 1
out=$(upcie-perf --bdf "$TB_C1_BDF" --path "$path" --bs 1000,4k --time 1 --json 2>/tmp/fail.err)
rc=$?
if [ "$rc" = 1 ] &&
	printf '%s\n' "$out" | grep -q '"run": 1, "ok": false, .*"bs": 1000, .*"errno": 22, "error": ".*not whole 4096-byte blocks' &&
	printf '%s\n' "$out" | grep -q '"run": 2, "ok": true, .*"bs": 4096' &&
	printf '%s\n' "$out" | grep -q '"failed": 1, "exit": 1}' &&
	grep -q "run 1/2 queues=1 qd=1 bs=1000 rand read=100% failed: .*not whole" /tmp/fail.err; then
	tap_ok "--bs 1000,4k: run 1 failed and named with its reason (JSON and stderr), run 2 ran, exit 1"
else
	tap_fail "a failed run is reported" "exit $rc" "$out" "$(cat /tmp/fail.err)"
fi
out=$(upcie-perf --bdf "$TB_C1_BDF" --path "$path" --bs 1000 --time 1 2>&1)
rc=$?
if [ "$rc" = 1 ] && printf '%s\n' "$out" | grep -q "FAILED: .*not whole"; then
	tap_ok "text: a block size that is no whole number of LBAs is a FAILED run"
else
	tap_fail "text: a block size that is no whole number of LBAs is refused" "exit $rc: $out"
fi
tap_done
