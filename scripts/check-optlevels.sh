#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Header hygiene at every optimisation level: the C programs meson builds (unit tests, examples,
# benchmarks, tools, probes; the fio engine too when -Dfio_src= is given) are compiled as meson
# compiles them, warning flags included, with gcc and clang at -O0, -O1, -O2, -O3 and -Os. They
# instantiate the headers' functions, which a header compiled into an empty file never does, and
# some warnings (gcc's maybe-uninitialized above all) come from the optimiser: each file goes to
# an object, not just through -fsyntax-only (to /dev/null: nothing is kept, and no debug info is
# generated). Compiles run two at a time (UPCIE_JOBS); UPCIE_OPT_LEVELS picks the levels
# (default "0 1 2 3 s"; scripts/test.sh leaves out 2, which its gcc and clang unit builds compile
# with the same flags). One TAP line per compiler and level; failing files are listed with their
# first errors.
#
#   scripts/check-optlevels.sh [MESON_ARG...]   extra arguments go to meson setup
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
jobs=${UPCIE_JOBS:-2}

if ! meson setup "$tmp/build" -Dcuda=disabled -Dhip=disabled -Dfuzz=disabled -Dtests=true "$@" \
	>"$tmp/setup.log" 2>&1; then
	sed 's/^/# /' "$tmp/setup.log" | tail -20
	echo "not ok 1 - meson setup failed"
	exit 1
fi

# compile_commands.json to one file per translation unit: its directory, source and arguments
# (NUL-separated), less the optimisation, debug-info, dependency-file and output options.
python3 - "$tmp/build/compile_commands.json" "$tmp/tu" <<'PY' || exit 1
import json, os, shlex, sys
cmds, out = sys.argv[1], sys.argv[2]
os.makedirs(out)
n = 0
for e in json.load(open(cmds)):
    if not e["file"].endswith(".c"):
        continue
    a = shlex.split(e["command"])[1:]
    keep, skip = [], False
    for x in a:
        if skip:
            skip = False
            continue
        if x in ("-MQ", "-MF", "-o", "-c"):
            skip = True
            continue
        if x.startswith(("-O", "-fdiagnostics-color")) or x in ("-g", "-MD"):
            continue
        keep.append(x)
    with open(os.path.join(out, "%03d" % n), "w") as f:
        f.write("\0".join([e["directory"], e["file"]] + keep) + "\0")
    n += 1
PY
ntu=$(ls "$tmp/tu" | wc -l)
if [ "$ntu" -lt 1 ]; then
	echo "not ok 1 - no C translation unit in compile_commands.json"
	exit 1
fi

read -r -a levels <<<"${UPCIE_OPT_LEVELS:-0 1 2 3 s}"
compilers=(gcc clang)
# One job per compiler, level and translation unit; its result is a file named after all three.
for cc in "${compilers[@]}"; do
	for o in "${levels[@]}"; do
		for t in "$tmp"/tu/*; do
			echo "$cc $o $(basename "$t")"
		done
	done
done >"$tmp/jobs"
mkdir "$tmp/res"
# Compile translation unit $3 with compiler $1 at -O$2; leave its messages in res/ on failure.
job() {
	local cc=$1 o=$2 t=$3 a r=$tmp/res/$1-$2-$3
	mapfile -d '' -t a <"$tmp/tu/$t"
	echo "${a[1]}" >"$r.src"
	(cd "${a[0]}" && "$cc" "${a[@]:2}" -O"$o" -c "${a[1]}" -o /dev/null) >"$r.err" 2>&1 &&
		rm "$r.err"
}
export -f job
export tmp
xargs -P "$jobs" -L 1 bash -c 'job "$@"' job <"$tmp/jobs"

n=0
fail=0
for cc in "${compilers[@]}"; do
	for o in "${levels[@]}"; do
		n=$((n + 1))
		bad=$(ls "$tmp/res/" | sed -n "s/^$cc-$o-\(.*\)\.err$/\1/p")
		if [ -z "$bad" ]; then
			echo "ok $n - $cc -O$o: $ntu files compile with the project's warnings as errors"
		else
			echo "not ok $n - $cc -O$o: $(echo "$bad" | wc -l) of $ntu files fail"
			for t in $bad; do
				echo "# $(realpath --relative-to="$root" "$(cat "$tmp/res/$cc-$o-$t.src")")"
				grep -E 'error|warning' "$tmp/res/$cc-$o-$t.err" | head -4 | sed 's/^/#   /'
			done
			fail=$((fail + 1))
		fi
	done
done
echo "1..$n"
[ "$fail" -eq 0 ]
