#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The test command: installs what it needs from Debian's archive, then runs every tier that this
# machine can run and ends with one line "N passed, N failed, N skipped".
#
#   scripts/test.sh            everything: hygiene, format, unit (gcc, clang, ASan+UBSan), the
#                              bounded model soak, fuzzing (30 s per harness), installed-headers
#                              consumer, device-code compile checks, guest tests
#   scripts/test.sh --no-guest everything but the QEMU guest tier
#
# Environment: UPCIE_NO_APT=1 skips the package step; UPCIE_FUZZ_SECONDS sets the time per
# fuzzer (default 30); UPCIE_TESTBED_CACHE, UPCIE_TESTBED_WORK are passed to the guest test bed
# (tests/guest/README.md).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
guest=1
for a in "$@"; do
	case $a in
	--no-guest) guest=0 ;;
	-h | --help)
		sed -n '3,13p' "$0" | sed 's/^# \{0,1\}//'
		exit 0
		;;
	*)
		echo "test.sh: unknown argument $a" >&2
		exit 2
		;;
	esac
done

logdir=$root/build-logs
mkdir -p "$logdir"
pass=0
fail=0
skip=0
t_start=$(date +%s)

note() { printf '\n=== %s\n' "$*"; }

# Run a TAP-producing command; count its lines. A non-zero exit without a "not ok" line, or no
# TAP line at all, counts as one failure (a crash must never pass silently).
tap() {
	local label=$1
	shift
	local log="$logdir/$(echo "$label" | tr ' /' '__').log" rc p f s
	"$@" >"$log" 2>&1
	rc=$?
	local summary
	summary=$(grep -E '^[0-9]+ passed, [0-9]+ failed(, [0-9]+ skipped)?$' "$log" | tail -1)
	if [ -n "$summary" ]; then
		# A runner that aggregates its own TAP (the guest test bed) reports its totals.
		p=$(echo "$summary" | sed -E 's/^([0-9]+) passed.*/\1/')
		f=$(echo "$summary" | sed -E 's/^[0-9]+ passed, ([0-9]+) failed.*/\1/')
		s=$(echo "$summary" | sed -nE 's/.*, ([0-9]+) skipped$/\1/p')
		s=${s:-0}
	else
		p=$(grep -Ec '^ok [0-9]+' "$log" | tr -d ' ')
		s=$(grep -Ec '^ok [0-9]+.*# (SKIP|skip)' "$log" | tr -d ' ')
		f=$(grep -Ec '^not ok [0-9]+' "$log" | tr -d ' ')
		p=$((p - s))
	fi
	if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
		f=1
		echo "not ok - $label exited with status $rc without a failing check" >>"$log"
	fi
	if [ $((p + f + s)) -eq 0 ]; then
		f=1
		echo "not ok - $label produced no test result" >>"$log"
	fi
	pass=$((pass + p))
	fail=$((fail + f))
	skip=$((skip + s))
	printf '%-46s %5d passed %3d failed %3d skipped\n' "$label" "$p" "$f" "$s"
	if [ "$f" -ne 0 ]; then
		grep -E '^not ok|^#|^  \[[A-Z]\] ' "$log" | head -40 | sed 's/^/    /'
		tail -5 "$log" | sed 's/^/    | /'
	fi
}

# A single check as one TAP line.
one() {
	local desc=$1
	shift
	if "$@"; then echo "ok 1 - $desc"; else echo "not ok 1 - $desc"; fi
}

if [ "${UPCIE_NO_APT:-0}" != 1 ]; then
	note "packages"
	scripts/deps.sh || {
		echo "test.sh: installing packages failed"
		echo "0 passed, 1 failed"
		exit 1
	}
fi

note "hygiene"
tap "headers compile alone (C11/C++17)" scripts/check-headers.sh
tap "clang-format" scripts/check-format.sh
tap "public names prefixed" scripts/check-names.sh
tap "man pages describe every long option (with its negative control)" scripts/check-man.sh
tap "doc C excerpts compile (gcc, clang)" scripts/check-doc-snippets.sh
tap "UAPI definitions vs newer kernel headers" scripts/check-uapi.sh
tap "CUDA sources compile (nvcc sm_90)" scripts/check-cuda.sh
tap "CQ mirror PTX matches its source" tests/gpu/gen-cqmirror-ptx.sh --check
tap "GPU completion ordering points in the PTX (with its negative control)" tests/gpu/check-order-ptx.sh
tap "P2P placement check: BAR window, System RAM (fake sysfs and iomem)" tests/gpu/check-p2p.sh
tap "HIP sources, headers, bridge host tests" tests/hip/check-hip.sh
tap "HIP device code disassembly (RDNA fences)" tests/hip/check-disasm.sh
tap "aarch64 queue-pair barriers (disassembly)" scripts/check-arm64.sh
tap "public functions documented (with its negative control)" scripts/check-doc-coverage.sh
# The API reference builds, and Doxygen finds nothing wrong in the headers' comments.
api_ref() {
	local b=$root/build-docs
	rm -rf "$b"
	if meson setup "$b" -Ddocs=true -Dtests=false -Dcuda=disabled -Dhip=disabled -Dfuzz=disabled \
		>"$logdir/setup-build-docs.log" 2>&1 && ninja -C "$b" docs/api/html >"$logdir/build-docs.log" 2>&1 &&
		[ -f "$b/docs/api/html/index.html" ]; then
		echo "ok 1 - API reference built: $(ls "$b"/docs/api/html/*_8h.html | wc -l) header pages"
	else
		echo "not ok 1 - API reference (meson -Ddocs=true) did not build"
		tail -5 "$logdir/setup-build-docs.log" "$logdir/build-docs.log" | sed 's/^/# /'
	fi
	if [ -s "$b/docs/api/doxygen-warnings.log" ]; then
		echo "not ok 2 - Doxygen warnings on the headers' comments"
		head -10 "$b/docs/api/doxygen-warnings.log" | sed 's/^/# /'
	else
		echo "ok 2 - no Doxygen warning"
	fi
}
tap "API reference (Doxygen)" api_ref

note "fio (built from Debian's source, cached with the test bed)"
# The fio ioengine compiles against a configured fio tree; the unit builds below build it.
fio_dir=${UPCIE_TESTBED_CACHE:-/var/cache/upcie-testbed}/fio
tap "fio from Debian's source package" sh -c "tools/fio/build-fio.sh --dir '$fio_dir' >/dev/null && echo 'ok 1 - fio built'"
fio_src=$(tools/fio/build-fio.sh --dir "$fio_dir" --print 2>/dev/null | sed 's/^FIO_SRC=//')
fio_opt=()
[ -n "$fio_src" ] && fio_opt=(-Dfio_src="$fio_src")

note "optimisation levels"
# What users build (unit tests, examples, benchmarks, tools, the fio engine), compiled as meson
# does with gcc and clang at -O0, -O1, -O3 and -Os: the optimiser finds warnings the headers'
# own check cannot. -O2 is the unit builds' level (build-gcc, build-clang below).
UPCIE_OPT_LEVELS="0 1 3 s" tap "warnings at every optimisation level (gcc, clang)" \
	scripts/check-optlevels.sh "${fio_opt[@]}"

note "unit tests"
# As root, give the unit tests real hugepages (and a hugetlbfs mount) so the pagemap and hugepage
# checks run instead of skipping; the previous pool size is restored afterwards.
hp_saved=
hp_mnt=
if [ "$(id -u)" = 0 ] && [ -w /proc/sys/vm/nr_hugepages ]; then
	hp_saved=$(cat /proc/sys/vm/nr_hugepages)
	echo $((hp_saved + 16)) >/proc/sys/vm/nr_hugepages 2>/dev/null || true
	if ! grep -q ' hugetlbfs ' /proc/mounts; then
		hp_mnt=$(mktemp -d /tmp/upcie-hugetlbfs.XXXXXX)
		mount -t hugetlbfs -o pagesize=2M nodev "$hp_mnt" 2>/dev/null || { rmdir "$hp_mnt"; hp_mnt=; }
	fi
fi
restore_hugepages() {
	[ -n "$hp_mnt" ] && umount "$hp_mnt" 2>/dev/null && rmdir "$hp_mnt"
	[ -n "$hp_saved" ] && echo "$hp_saved" >/proc/sys/vm/nr_hugepages 2>/dev/null
	hp_mnt=
	hp_saved=
}
trap restore_hugepages EXIT
build_unit() { # dir, compiler, extra meson args...
	local dir=$1 c=$2
	shift 2
	local cxx=g++
	[ "$c" = clang ] && cxx=clang++
	rm -rf "$dir"
	CC=$c CXX=$cxx meson setup "$dir" "${fio_opt[@]}" "$@" >"$logdir/setup-$(basename "$dir").log" 2>&1 &&
		ninja -C "$dir" >"$logdir/build-$(basename "$dir").log" 2>&1
}
run_units() { # dir label
	local dir=$1 label=$2 t
	for t in "$dir"/tests/unit/test_*; do
		[ -x "$t" ] && [ -f "$t" ] || continue
		tap "$label $(basename "$t")" "$t"
	done
}
run_tools() { # dir label
	local dir=$1 label=$2
	tap "$label test_tools_cli" "$dir/tests/tools/test_tools_cli" "$dir/tools/upcie-perf" \
		"$dir/tools/upcie-served" "$dir/tools/upcie-setup"
	tap "$label test_tools_opt" "$dir/tests/tools/test_tools_opt"
	tap "$label test_tools_doctor" "$dir/tests/tools/test_tools_doctor"
}
# The sanitizer build leaves out the CUDA and HIP targets: nvcc and hipcc compile the same device
# code in build-gcc and build-clang, and a host sanitizer does not change it.
for cfg in "gcc build-gcc" "clang build-clang" \
	"gcc build-asan -Db_sanitize=address,undefined -Db_lundef=false -Dcuda=disabled -Dhip=disabled"; do
	set -- $cfg
	c=$1 dir=$root/$2
	shift 2
	if build_unit "$dir" "$c" "$@"; then
		echo "ok 1 - build $(basename "$dir")" >"$logdir/ok-$(basename "$dir")"
		tap "build $(basename "$dir")" cat "$logdir/ok-$(basename "$dir")"
		ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
			run_units "$dir" "$(basename "$dir")"
		# the tools as users run them (bad input, documented options), on a fake machine
		# (the gcc and clang builds)
		[ "$(basename "$dir")" = build-asan ] || run_tools "$dir" "$(basename "$dir")"
		# the soak of the driver against the faulty controller model, bounded (the recorded
		# runs of minutes are in docs/results/nvme-faults.md)
		[ "$c" = clang ] || ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
			UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
			tap "$(basename "$dir") nvme_soak (bounded)" "$dir/bench/nvme_soak" --ops 8000 --seconds 120
	else
		# the failing commands with their first errors, as "# " lines that the summary shows
		tap "build $(basename "$dir")" sh -c "grep -h -A8 -E '^(FAILED|ERROR)|meson.build:[0-9]+:[0-9]+: ERROR' \
			'$logdir/setup-$(basename "$dir").log' '$logdir/build-$(basename "$dir").log' |
			head -n 36 | sed 's/^/# /'; echo 'not ok 1 - build $(basename "$dir") failed'; exit 1"
	fi
done

restore_hugepages

# scripts/plot-perf: its plots from the repository's data, the committed plots against their raw
# data (plot-perf check, with negative controls), its bad input
tap "plot-perf (tests/tools/test_plot_perf.sh)" tests/tools/test_plot_perf.sh

# libFuzzer harnesses (built in build-clang): each runs for a bounded time from its checked-in
# seeds, new inputs going to a scratch corpus; one TAP line per harness with its execution count.
# A crash or broken invariant leaves its input in build-logs/ (fuzz-<name>-crash-*).
fuzz_secs=${UPCIE_FUZZ_SECONDS:-30}
run_fuzz() { # harness
	local h=$1 name scratch rc execs
	name=$(basename "$h")
	scratch=$(mktemp -d /tmp/upcie-fuzz.XXXXXX)
	"$h" -max_total_time="$fuzz_secs" -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 \
		-artifact_prefix="$logdir/fuzz-$name-" "$scratch" "tests/fuzz/corpus/$name" \
		>"$logdir/fuzz-$name.out" 2>&1
	rc=$?
	rm -rf "$scratch"
	execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$logdir/fuzz-$name.out")
	if [ "$rc" -eq 0 ] && [ -n "$execs" ]; then
		echo "ok 1 - $name: $execs executions in $fuzz_secs s, nothing found"
	else
		echo "not ok 1 - $name: exit status $rc after ${execs:-?} executions"
		grep -E 'invariant broken|ERROR:|SUMMARY|runtime error' "$logdir/fuzz-$name.out" | head -5 |
			sed 's/^/# /'
	fi
}
note "fuzzing (libFuzzer, $fuzz_secs s per harness)"
fuzzers=()
for h in "$root"/build-clang/tests/fuzz/fuzz_*; do
	[ -f "$h" ] && [ -x "$h" ] && fuzzers+=("$h")
done
if [ ${#fuzzers[@]} -gt 0 ]; then
	for h in "${fuzzers[@]}"; do
		tap "fuzz $(basename "$h")" run_fuzz "$h"
	done
else
	tap "fuzz harnesses built" sh -c 'echo "not ok 1 - no libFuzzer harness in build-clang (clang with libclang-rt-14-dev)"; exit 1'
fi

note "kernel modules"
# The modules build against the guest kernels' headers: fetch them first (cached; the guest tier
# fetches the same set, so a warm cache makes this a check).
tap "guest kernels fetched (testbed.sh fetch)" sh -c \
	"tests/guest/testbed.sh fetch >'$logdir/testbed-fetch.log' 2>&1 && echo 'ok 1 - guest kernels in the test-bed cache' ||
	{ tail -5 '$logdir/testbed-fetch.log' | sed 's/^/# /'; echo 'not ok 1 - testbed.sh fetch failed'; exit 1; }"
tap "kernel modules: build 6.1 + 7.x, .debs, dkms install" scripts/build-dkms.sh

note "installed headers"
tap "consumer via pkg-config" scripts/check-consumer.sh "$root/build-gcc"
tap "consumer as a meson subproject" scripts/check-subproject.sh
tap "Debian packages: build, lintian, apt install" tests/install/tools-install.sh

if [ "$guest" = 1 ]; then
	note "guest tests (QEMU, TCG)"
	tap "guest" tests/guest/testbed.sh all
fi

t_end=$(date +%s)
printf '\nlogs: %s   time: %ss\n' "$logdir" $((t_end - t_start))
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
