#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Every public name the headers define must carry the upcie_/UPCIE_ prefix: functions and
# variables (from the symbols of a translation unit that keeps every inline function), and
# macros, struct/union/enum tags, enumerators and typedefs (from the header text). TAP output.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mapfile -t headers < <(find include -name '*.h' ! -name '*_cuda.h' ! -name '*_hip.h' | sort)
for h in "${headers[@]}"; do echo "#include <${h#include/}>"; done >"$tmp/all.c"
n=0
fail=0
report() {
	n=$((n + 1))
	if [ -z "$2" ]; then
		echo "ok $n - $1"
	else
		echo "not ok $n - $1: $2"
		fail=$((fail + 1))
	fi
}
gcc -std=c11 -Iinclude -fkeep-inline-functions -c "$tmp/all.c" -o "$tmp/all.o"
bad=$(nm "$tmp/all.o" | awk '$2 ~ /^[TtWwDdBbVvRr]$/ {print $3}' | grep -Ev '^(upcie_|__)|\.' | sort -u | tr '\n' ' ' || true)
report "functions and variables" "$bad"
# A fallback for a system constant (#ifndef X / #define X) keeps the system's name.
bad=$(cat "${headers[@]}" | awk '/^#[[:space:]]*ifndef/ {g=$2; next}
	/^#[[:space:]]*define/ {n=$2; sub(/\(.*/, "", n); if (n != g) print n} {g=""}' |
	grep -Ev '^(UPCIE_|upcie_|_GNU_SOURCE$)' | sort -u | tr '\n' ' ' || true)
report "macros" "$bad"
bad=$(cat "${headers[@]}" | grep -oE '^(typedef )?(struct|union|enum) [A-Za-z_][A-Za-z0-9_]* \{' |
	awk '{print $(NF-1)}' | grep -v '^upcie_' | sort -u | tr '\n' ' ' || true)
report "struct, union and enum tags" "$bad"
bad=$(cat "${headers[@]}" | grep -E '^typedef .*;$' |
	sed -E 's/^typedef [^(]*\(\*([A-Za-z_][A-Za-z0-9_]*)\).*/\1/; s/^typedef .*[ *]([A-Za-z_][A-Za-z0-9_]*);$/\1/' |
	grep -v '^upcie_' | sort -u | tr '\n' ' ' || true)
report "typedefs" "$bad"
bad=$(cat "${headers[@]}" | awk '/^(typedef )?enum [a-z_]* ?\{/ {e=1; next} e && /^\}/ {e=0} e' |
	grep -oE '^[[:space:]]+[A-Za-z_][A-Za-z0-9_]*' | tr -d '[:space:]' | tr '\n' ' ' | tr ' ' '\n' |
	grep -v '^UPCIE_' | grep -v '^$' | sort -u | tr '\n' ' ' || true)
report "enumerators" "$bad"
# preserve_most functions (UPCIE_COLD_CALL, base/compiler.h) return void: clang before 17 restores
# RAX on their return. The control: a non-void one in a scratch copy is caught.
cold_bad() {
	grep -hE '^UPCIE_COLD_CALL' "$@" | grep -vE '\bstatic void$' |
		sed -E 's/.*static //' | tr '\n' ' ' || true
}
bad=$(cold_bad "${headers[@]}")
ncold=$(cat "${headers[@]}" | grep -cE '^UPCIE_COLD_CALL' || true)
[ "$ncold" -gt 0 ] || bad="no UPCIE_COLD_CALL function found (pattern stale?)"
report "UPCIE_COLD_CALL functions return void ($ncold)" "$bad"
printf 'UPCIE_COLD_CALL __attribute__((noinline)) static int\n' >"$tmp/cold.h"
ctl=$(cold_bad "$tmp/cold.h")
report "control: a non-void UPCIE_COLD_CALL function is caught" "$([ -n "$ctl" ] || echo missed)"
echo "1..$n"
[ "$fail" -eq 0 ]
