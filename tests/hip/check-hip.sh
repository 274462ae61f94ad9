#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# HIP build and host checks (no AMD GPU needed, none used):
#  - every HIP source in the tree (tools/*.hip, tests/hip/*.hip) compiled by hipcc for gfx90a
#    and gfx1101 with -nogpulib (ROCm 5.2, Debian 12's, ships no GFX11 device library), and for
#    gfx90a with the device library too (a SKIP line naming it where that library is missing);
#    -Wall -Wextra -Werror
#  - every HIP header (*_hip.h) alone, included twice, in a HIP translation unit for both targets
#  - the parts a plain C program uses (gpuq/bridge_hip.h, gpuq/gqp_hip.h, gpuq/cqmirror_hip.h,
#    base/arch_hip.h) alone as C11 and C++17 with gcc and clang, as scripts/check-headers.sh
#    does for host headers
#  - public names of the *_hip.h headers prefixed upcie_/UPCIE_
#  - tests/hip/test_bridge_model.c (bridge + relay + the device queue code in CPU threads, against
#    the unit tests' controller model), tests/hip/test_deadline_model.c (timed waits follow the
#    clock rate they are given; a fake clock), tests/hip/test_cqmirror_model.c (the completion
#    mirror's protocol and copying, wavefronts stepped by the test, against the controller
#    model) (gcc, ASan+UBSan) and tests/hip/test_hip_host.hip (the HIP provider on a machine
#    without an AMD GPU), run, their checks reported here; the mirror model built with each
#    protocol rule removed must fail that rule's check
# The disassembly check is tests/hip/check-disasm.sh. TAP output; one SKIP line without hipcc.
set -uo pipefail
cd "$(dirname "$0")/../.."
hipcc=${HIPCC:-$(command -v hipcc || true)}
[ -z "$hipcc" ] && [ -x /opt/rocm/bin/hipcc ] && hipcc=/opt/rocm/bin/hipcc
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=0
fail=0
ok() {
	n=$((n + 1))
	echo "ok $n - $1"
}
notok() {
	n=$((n + 1))
	fail=$((fail + 1))
	echo "not ok $n - $1"
	[ -n "${2:-}" ] && sed 's/^/# /' "$2" | grep -v 'argument unused\|input unused' | head -25
}
# run DESC LOG CMD...: one line for a command
run() {
	local desc=$1 log=$2
	shift 2
	if "$@" >"$log" 2>&1; then ok "$desc"; else notok "$desc" "$log"; fi
}
# sub DESC-PREFIX LOG CMD...: a TAP-producing test program, its lines renumbered
sub() {
	local pre=$1 log=$2 rc line
	shift 2
	"$@" >"$log" 2>&1
	rc=$?
	local seen=0
	while IFS= read -r line; do
		case $line in
		"ok "*) seen=1; ok "$pre: ${line#ok * - }" ;;
		"not ok "*) seen=1; notok "$pre: ${line#not ok * - }" ;;
		esac
	done <"$log"
	if [ "$rc" -ne 0 ] || [ "$seen" = 0 ]; then notok "$pre: exit status $rc" "$log"; fi
}

hipflags=(-std=c++17 -O2 -Wall -Wextra -Werror -Wshadow -Iinclude -Itools)

if [ -z "$hipcc" ]; then
	echo "ok 1 # SKIP hipcc not found (apt-get install hipcc libamdhip64-dev)"
	n=1
else
	echo "# $("$hipcc" --version 2>/dev/null | grep -m1 -i 'clang version'), HIP $(sed -n 's/^#define HIP_VERSION_\(MAJOR\|MINOR\) //p' /usr/include/hip/hip_version.h 2>/dev/null | paste -sd.)"
	mapfile -t srcs < <(git ls-files --cached --others --exclude-standard -- '*.hip' | sort)
	for f in "${srcs[@]}"; do
		for a in gfx90a gfx1101; do
			run "hipcc $a -nogpulib: $f" "$tmp/log" "$hipcc" "${hipflags[@]}" --offload-arch=$a -nogpulib -c "$f" -o "$tmp/o.o"
		done
		# without the ROCm device library (package rocm-device-libs) this build cannot be
		# made: a SKIP naming it, never a pass; the -nogpulib builds above still ran
		if "$hipcc" "${hipflags[@]}" --offload-arch=gfx90a -c "$f" -o "$tmp/o.o" >"$tmp/log" 2>&1; then
			ok "hipcc gfx90a with the device library: $f"
		elif grep -q 'cannot find ROCm device library' "$tmp/log"; then
			n=$((n + 1))
			echo "ok $n - hipcc gfx90a with the device library: $f # SKIP no ROCm device library for gfx90a (apt-get install rocm-device-libs)"
		else
			notok "hipcc gfx90a with the device library: $f" "$tmp/log"
		fi
	done
	mapfile -t hh < <(find include -name '*_hip.h' | sort)
	for h in "${hh[@]}"; do
		printf '#include <%s>\n#include <%s>\nint upcie_hygiene_tu_;\n' "${h#include/}" "${h#include/}" >"$tmp/h.hip"
		for a in gfx90a gfx1101; do
			run "${h#include/} alone (hipcc $a)" "$tmp/log" "$hipcc" "${hipflags[@]}" -Wundef --offload-arch=$a -nogpulib -c "$tmp/h.hip" -o "$tmp/o.o"
		done
	done
	sub "test_hip_host" "$tmp/thh.log" sh -c "'$hipcc' ${hipflags[*]} --offload-arch=gfx90a -nogpulib tests/hip/test_hip_host.hip -o '$tmp/thh' -lpthread >'$tmp/thh.build' 2>&1 || { cat '$tmp/thh.build'; exit 1; }; '$tmp/thh'"
fi

for h in upcie/gpuq/bridge_hip.h upcie/gpuq/gqp_hip.h upcie/gpuq/cqmirror_hip.h upcie/base/arch_hip.h; do
	printf '#include <%s>\n#include <%s>\nint upcie_hygiene_tu_;\n' "$h" "$h" >"$tmp/t.c"
	for c in "gcc -std=c11 -x c" "g++ -std=c++17 -x c++" "clang -std=c11 -x c" "clang++ -std=c++17 -x c++"; do
		# shellcheck disable=SC2086
		run "$h alone as plain C/C++ ($c)" "$tmp/log" $c -Wall -Wextra -Werror -Wshadow -Wundef -Iinclude -c "$tmp/t.c" -o "$tmp/t.o"
	done
done

# names: symbols of the plain-C parts, macros/tags/typedefs of every *_hip.h
printf '#include <upcie/gpuq/bridge_hip.h>\n#include <upcie/gpuq/gqp_hip.h>\n#include <upcie/gpuq/cqmirror_hip.h>\n#include <upcie/base/arch_hip.h>\n' >"$tmp/all.c"
gcc -std=c11 -Iinclude -fkeep-inline-functions -c "$tmp/all.c" -o "$tmp/all.o"
bad=$(nm "$tmp/all.o" | awk '$2 ~ /^[TtWwDdBbVvRr]$/ {print $3}' | grep -Ev '^(upcie_|__)|\.' | sort -u | tr '\n' ' ')
if [ -z "$bad" ]; then ok "names: functions and variables of the plain-C parts prefixed"; else
	echo "$bad" >"$tmp/log"; notok "names: functions and variables prefixed" "$tmp/log"; fi
mapfile -t hh < <(find include -name '*_hip.h' | sort)
bad=$(cat "${hh[@]}" | awk '/^#[[:space:]]*ifndef/ {g=$2; next}
	/^#[[:space:]]*define/ {m=$2; sub(/\(.*/, "", m); if (m != g) print m} {g=""}' |
	grep -Ev '^(UPCIE_|upcie_|_GNU_SOURCE$|__HIP_PLATFORM_AMD__$)' | sort -u | tr '\n' ' ')
bad+=$(cat "${hh[@]}" | grep -oE '^(typedef )?(struct|union|enum) [A-Za-z_][A-Za-z0-9_]* \{' |
	awk '{print $(NF-1)}' | grep -v '^upcie_' | sort -u | tr '\n' ' ')
if [ -z "$bad" ]; then ok "names: macros and tags of the *_hip.h headers prefixed"; else
	echo "$bad" >"$tmp/log"; notok "names: macros and tags prefixed" "$tmp/log"; fi

for t in test_bridge_model test_deadline_model test_cqmirror_model; do
	if gcc -std=c11 -O1 -g -Wall -Wextra -Werror -Wshadow -fsanitize=address,undefined \
		-Iinclude "tests/hip/$t.c" -o "$tmp/$t" -lpthread >"$tmp/$t.build" 2>&1; then
		ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
			UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
			sub "$t" "$tmp/$t.log" "$tmp/$t"
	else
		notok "$t builds" "$tmp/$t.build"
	fi
done
# The mirror model's checks can fail: each protocol rule removed, its check must fail.
for ctl in NO_DRAIN:"every entry written before the stop is mirrored" \
	RETRY_BUMPS:"the retried stop leaves the generation even"; do
	m=${ctl%%:*} rule=${ctl#*:}
	if gcc -std=c11 -O1 -g -Wall -Wextra -Werror -Wshadow "-DUPCIE_NVME_CQMIRROR_HIP_TEST_$m" \
		-Iinclude tests/hip/test_cqmirror_model.c -o "$tmp/tcm_ctl" -lpthread >"$tmp/ctl.build" 2>&1; then
		UPCIE_LOG=off "$tmp/tcm_ctl" >"$tmp/ctl.log" 2>&1
		rc=$?
		if [ "$rc" -ne 0 ] && grep -q "^not ok .*$rule" "$tmp/ctl.log"; then
			ok "control: test_cqmirror_model with UPCIE_NVME_CQMIRROR_HIP_TEST_$m fails '$rule'"
		else
			grep '^not ok' "$tmp/ctl.log" >"$tmp/log"
			notok "control: test_cqmirror_model with UPCIE_NVME_CQMIRROR_HIP_TEST_$m fails '$rule' (exit $rc)" "$tmp/log"
		fi
	else
		notok "control: test_cqmirror_model builds with UPCIE_NVME_CQMIRROR_HIP_TEST_$m" "$tmp/ctl.build"
	fi
done
echo "1..$n"
[ "$fail" -eq 0 ]
