#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# scripts/plot-perf as a user runs it (TAP): each kind of plot drawn from data in the
# repository, the SVG the same bytes when drawn twice (reproducible), and bad input refused with
# exit 2 and a message naming what is wrong. Then the committed plots (docs/results/plots): each
# linked from docs/results, and `plot-perf check` finds each one showing what its raw data give;
# negative controls: a raw value changed (sweep, ratio), a drawing changed, no provenance.
# Without python3-matplotlib: skipped (a TAP plan of 0).
root=$(cd "$(dirname "$0")/../.." && pwd)
pp=$root/scripts/plot-perf
raw=$root/docs/results/raw
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
	echo "1..0 # SKIP: python3-matplotlib is not installed (scripts/deps.sh installs it)"
	exit 0
fi
n=0 fail=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
nok() { n=$((n + 1)); fail=$((fail + 1)); echo "not ok $n - $1"; shift; for l in "$@"; do printf '%s\n' "$l" | sed 's/^/# /'; done; }
# CMD... ; expects exit $want and $msg in the output
want_fail() { # WANT MSG CMD...
	w=$1 m=$2
	shift 2
	out=$("$@" 2>&1)
	rc=$?
	if [ "$rc" = "$w" ] && printf '%s\n' "$out" | grep -qF -- "$m"; then
		ok "$(echo "$*" | sed "s#$root/##g"): exit $w, says \"$m\""
	else
		nok "$(echo "$*" | sed "s#$root/##g"): exit $w, says \"$m\"" "exit $rc: $out"
	fi
}
sweep=$raw/h200-2026-12-01-final/perf1.json
sweep2=$raw/h200-2026-12-03-perf/sweep.json
cdf=$(ls "$raw"/upcie-perf-guest-*/perf-A.json 2>/dev/null | head -n 1)
boots=$(ls "$raw"/fio-guest-2026-12-02/boot*-results.tsv)

"$pp" sweep "$sweep" -o "$tmp/a.svg" >/dev/null 2>&1 && "$pp" sweep "$sweep" -o "$tmp/b.svg" >/dev/null 2>&1
if head -c 5 "$tmp/a.svg" | grep -q '<?xml' && cmp -s "$tmp/a.svg" "$tmp/b.svg"; then
	ok "sweep of an upcie-perf JSON (schema 1) to SVG, the same bytes twice"
else
	nok "sweep to a reproducible SVG"
fi
if "$pp" sweep "$sweep2" -o "$tmp/s2.png" >/dev/null 2>&1 && head -c 4 "$tmp/s2.png" | grep -q PNG; then
	ok "sweep of an upcie-perf JSON (schema 2) to PNG"
else
	nok "sweep of schema 2 JSON"
fi
# shellcheck disable=SC2086
if "$pp" ratio $boots -o "$tmp/r.png" >/dev/null 2>&1 && head -c 4 "$tmp/r.png" | grep -q PNG; then
	ok "ratio of three fio_cmp results.tsv to PNG"
else
	nok "ratio to PNG"
fi
if [ -n "$cdf" ]; then
	if "$pp" cdf "$cdf" --run 1 --run 2 -o "$tmp/c.svg" >/dev/null 2>&1 && grep -q '<svg' "$tmp/c.svg"; then
		ok "cdf of two runs of an upcie-perf JSON (schema 2)"
	else
		nok "cdf of schema 2 JSON"
	fi
else
	nok "cdf: no docs/results/raw/upcie-perf-guest-*/perf-A.json in the repository"
fi
# fio's own JSON: json+ output (clat_ns bins) of a psync random read/write job, fio 3.33
fioj=$root/tests/tools/data/fio-3.33-psync-randrw.json
if "$pp" cdf "$fioj" -o "$tmp/f.svg" >/dev/null 2>&1 && grep -q 'randread read' "$tmp/f.svg" &&
	grep -q 'randread write' "$tmp/f.svg"; then
	ok "cdf of fio json+ output: reads and writes of the job"
else
	nok "cdf of fio json+ output"
fi
python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
for k in ("read", "write"):
    d["jobs"][0][k]["clat_ns"].pop("bins", None)
json.dump(d, open(sys.argv[2], "w"))' "$fioj" "$tmp/fio-nobins.json"
if "$pp" cdf "$tmp/fio-nobins.json" -o "$tmp/f2.svg" >/dev/null 2>&1 && grep -q '(percentiles)' "$tmp/f2.svg"; then
	ok "cdf of fio json output without bins: drawn from its percentiles, and says so"
else
	nok "cdf of fio json from percentiles"
fi
# the committed plots: every one linked from a page of docs/results, every link to one valid
plots=$root/docs/results/plots
links=$(grep -ho '](plots/[^)]*)' "$root"/docs/results/*.md | sed 's/^](plots\///; s/)$//' | sort -u)
missing="" unlinked=""
for l in $links; do [ -f "$plots/$l" ] || missing="$missing $l"; done
for f in "$plots"/*.svg "$plots"/*.png; do
	[ -f "$f" ] || continue
	printf '%s\n' "$links" | grep -qxF "$(basename "$f")" || unlinked="$unlinked $(basename "$f")"
done
if [ -n "$links" ] && [ -z "$missing$unlinked" ]; then
	ok "docs/results links $(printf '%s\n' "$links" | wc -l) plots, each one in docs/results/plots, each committed plot linked"
else
	nok "docs/results plot links" "links to missing plots:$missing" "plots no page links:$unlinked"
fi
# one check of them all (a TAP line each), exit 0 only when every one matched
all=$("$pp" check "$plots"/*.svg 2>&1)
rc=$?
for f in "$plots"/*.svg; do
	line=$(printf '%s\n' "$all" | grep -F "check $f: ")
	if printf '%s\n' "$line" | grep -q ': ok: data match'; then
		ok "check $(basename "$f"): $(printf '%s\n' "$line" | sed 's/.*: ok: //')"
	else
		nok "check $(basename "$f"): the committed plot shows what its raw data give" "$line"
	fi
done
if [ "$rc" = 0 ]; then ok "check of every committed plot: exit 0"; else nok "check of every committed plot: exit 0" "exit $rc: $all"; fi
# negative control: one IOPS value of the sweep's raw data changed, under another --root: the
# unchanged copy passes there (the control of the control), the changed one fails
sw=docs/results/raw/h200-2026-12-03-perf/sweep.json
mkdir -p "$tmp/root/$(dirname "$sw")"
cp "$root/$sw" "$tmp/root/$sw"
want_fail 0 ": ok: data match" "$pp" check --root "$tmp/root" "$plots/h200-null-iops-sweep.svg"
python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
d["runs"][0]["iops"] = d["runs"][0]["iops"] + 1
json.dump(d, open(sys.argv[1], "w"))' "$tmp/root/$sw"
want_fail 1 "FAILED: the data differ" "$pp" check --root "$tmp/root" "$plots/h200-null-iops-sweep.svg"
# ... and one QD1 p50 of a fio_cmp boot (a ratio plot's raw line)
boot=docs/results/raw/fio-guest-2026-12-02/boot1-results.tsv
for f in docs/results/raw/fio-guest-2026-12-01 docs/results/raw/fio-guest-2026-12-02; do
	mkdir -p "$tmp/root/$f" && cp "$root/$f"/boot*-results.tsv "$tmp/root/$f/"
done
sed -i '0,/upcie QD1 ([^)]*): [0-9]* IOPS, clat p50 /s//&1/' "$tmp/root/$boot"
if cmp -s "$root/$boot" "$tmp/root/$boot"; then
	nok "negative control: a fio_cmp line of $boot changed" "the sed changed nothing"
else
	want_fail 1 "FAILED: the data differ" "$pp" check --root "$tmp/root" "$plots/fio-guest-ratios.svg"
fi
# a plot drawn by another matplotlib: the data alone compared, said so, no failure
sed 's/Matplotlib v[0-9.]*,/Matplotlib v0.0.1,/' "$plots/h200-null-iops-sweep.svg" >"$tmp/other-mpl.svg"
want_fail 0 "bytes not compared (drawn by matplotlib 0.0.1" "$pp" check "$tmp/other-mpl.svg"
# the drawing changed, the data not (same matplotlib): the bytes catch it
sed '0,/style="fill: #ffffff"/s//style="fill: #fffffe"/' "$plots/h200-null-iops-sweep.svg" >"$tmp/redrawn.svg"
want_fail 1 "draws other bytes now" "$pp" check "$tmp/redrawn.svg"
# an SVG without plot-perf's provenance
grep -v '<dc:source>\|<dc:identifier>' "$plots/h200-null-iops-sweep.svg" >"$tmp/noprov.svg"
want_fail 1 "FAILED: no provenance" "$pp" check "$tmp/noprov.svg"
want_fail 2 "check reads SVG files" "$pp" check "$root/README.md"
want_fail 2 "--root /nonexistent-29: not a directory" "$pp" check --root /nonexistent-29 "$plots/h200-null-iops-sweep.svg"

want_fail 2 "a command is needed" "$pp"
want_fail 2 "invalid choice: 'bogus'" "$pp" bogus x -o "$tmp/x.svg"
want_fail 2 "the following arguments are required: -o/--output" "$pp" sweep "$sweep"
want_fail 2 "the name must end in .png or .svg" "$pp" sweep "$sweep" -o "$tmp/x.jpg"
want_fail 2 "/nonexistent.json: No such file or directory" "$pp" sweep /nonexistent.json -o "$tmp/x.svg"
want_fail 2 "not JSON" "$pp" sweep "$root/README.md" -o "$tmp/x.svg"
echo '{"schema": 9, "runs": []}' >"$tmp/s9.json"
want_fail 2 "upcie-perf JSON schema 9" "$pp" sweep "$tmp/s9.json" -o "$tmp/x.svg"
echo '{"foo": 1}' >"$tmp/foo.json"
want_fail 2 "neither upcie-perf JSON" "$pp" cdf "$tmp/foo.json" -o "$tmp/x.svg"
want_fail 2 "has no histogram bins" "$pp" cdf "$sweep" -o "$tmp/x.svg"
echo '{"schema": 2, "runs": [{"run": 1, "ok": false, "queues": 1, "qd": 1}]}' >"$tmp/f.json"
want_fail 1 "no successful run to draw" "$pp" sweep "$tmp/f.json" -o "$tmp/x.svg"
want_fail 1 "no fio_cmp result lines" "$pp" ratio "$root/README.md" -o "$tmp/x.svg"
want_fail 2 "--label given 3 times" "$pp" ratio "$sweep" --label a --label b --label c -o "$tmp/x.svg"
want_fail 2 "invalid choice: 'iops'" "$pp" sweep "$sweep" --x iops -o "$tmp/x.svg"
want_fail 2 "invalid int value: 'x'" "$pp" cdf "$sweep" --run x -o "$tmp/x.svg"
want_fail 2 "$tmp/nodir/x.svg: No such file or directory" "$pp" sweep "$sweep" -o "$tmp/nodir/x.svg"
echo "1..$n"
[ "$fail" = 0 ]
