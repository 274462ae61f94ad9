#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# perf: upcie-perf on the configuration's DMA path (uio in A, vfio type1 in B, iommufd in C) on
# c1: a matrix of queues x QD x block size x pattern x mix in one call, JSON out, one progress
# line per second on stderr. Checked: every combination ran and completed I/O without errors,
# its figures are consistent (IOPS x block size = MB/s, p50 <= p99 <= p99.9 <= max), and the
# progress lines came. Not a timed test: TCG figures say nothing about hardware.
#
# configs: A B C
# timeout: 240
# shellcheck source=../lib/tb.sh
. /tests/lib/tb.sh

echo 128 >/proc/sys/vm/nr_hugepages
tb_user_path
tb_bind "$TB_C1_BDF" "$drv" || tap_fail "bind c1 to $drv"
upcie-perf --bdf "$TB_C1_BDF" --path "$path" --ns 1 --queues 1,2 --qd 1,8 --bs 4k,64k \
	--pattern rand,seq --mix 100,50 --time 1 --size 16M --json >/tmp/perf.json 2>/tmp/perf.err
rc=$?
tap_is "$rc" 0 "upcie-perf ran 32 combinations without an error"
runs=$(grep -c '"mode": "cpu"' /tmp/perf.json)
tap_is "$runs" 32 "32 summaries in the JSON"
prog=$(grep -c 'IOPS' /tmp/perf.err)
if [ "$prog" -ge 32 ]; then
	tap_ok "progress on stderr ($prog lines)"
else
	tap_fail "progress on stderr" "$prog lines" "$(tail -n 5 /tmp/perf.err)"
fi
# consistency of each summary
bad=$(awk -F'[:,{}]+' '/"mode"/ {
	for (i = 1; i < NF; i++) { k = $i; gsub(/[ "]/, "", k); v[k] = $(i + 1); gsub(/[ "]/, "", v[k]) }
	iops = v["iops"] + 0; mbps = v["mbps"] + 0; bs = v["bs"] + 0
	if (v["ios"] + 0 <= 0 || v["errors"] + 0 != 0) { print "no I/O or errors: " $0; next }
	if (iops * bs / 1e6 < mbps * 0.99 || iops * bs / 1e6 > mbps * 1.01) print "MB/s != IOPS x bs: " $0
	if (!(v["p50"] + 0 <= v["p99"] + 0 && v["p99"] + 0 <= v["p999"] + 0 && v["p999"] + 0 <= v["max"] + 0 && v["min"] + 0 <= v["p50"] + 0)) print "quantiles out of order: " $0
}' /tmp/perf.json)
if [ -z "$bad" ]; then
	tap_ok "every summary: I/O done, no errors, MB/s = IOPS x bs, min <= p50 <= p99 <= p99.9 <= max"
else
	tap_fail "every summary consistent" "$bad"
fi
grep '"queues": 1, "qd": 1, "bs": 4096, "pattern": "rand", "read_pct": 100' /tmp/perf.json | sed 's/^/# /'
out=$(upcie-perf --bdf "$TB_C1_BDF" --path "$path" --qd 4 --bs 4k --time 1 2>/dev/null)
if printf '%s\n' "$out" | grep -q "IOPS.*MB/s.*latency us mean .* p50 .* p99 .* p99.9 .* max"; then
	tap_ok "text summary: IOPS, MB/s, mean/p50/p99/p99.9/max"
else
	tap_fail "text summary" "$out"
fi
out=$(upcie-perf --bdf "$TB_C1_BDF" --path "$path" --bs 1000 --time 1 2>&1)
rc=$?
if [ "$rc" != 0 ] && printf '%s\n' "$out" | grep -q "whole"; then
	tap_ok "a block size that is no whole number of LBAs is refused"
else
	tap_fail "a block size that is no whole number of LBAs is refused" "exit $rc: $out"
fi
tap_done
