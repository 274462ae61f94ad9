#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The code excerpts of the docs compile (TAP). Every fenced block whose info string is
# `c compile` (three backticks, then "c compile") in docs/*.md and README.md is extracted to its
# own translation unit, with a #line directive so a diagnostic names the document and its line,
# and compiled to an object with gcc and clang: -std=c11 -Wall -Wextra -Werror -O2 -Iinclude.
# A block is a complete fragment a user would write (includes, then functions); plain `c`
# blocks are not compiled. A negative control first feeds the extractor a document with one
# good and one broken block and an unterminated one, and must see exactly those verdicts.
#
#   scripts/check-doc-snippets.sh [FILE.md...]
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=0
fail=0
# tap PASS|FAIL DESC: a numbered TAP line
tap() {
	n=$((n + 1))
	if [ "$1" = PASS ]; then
		echo "ok $n - $2"
	else
		fail=$((fail + 1))
		echo "not ok $n - $2"
	fi
}

# extract DOC OUTDIR: one OUTDIR/<k>.c per `c compile` block; prints "k line" per closed block
# and "unterminated line" for a block the document never closes.
extract() {
	awk -v doc="$1" -v out="$2" '
		function flush() { close(f) }
		!inb && /^```c compile[ \t]*$/ {
			inb = 1; k++; start = NR; f = out "/" k ".c"
			printf "#line %d \"%s\"\n", NR + 1, doc > f
			next
		}
		inb && /^```[ \t]*$/ { inb = 0; flush(); print k, start; next }
		inb { print > f }
		END { if (inb) print "unterminated", start }
	' "$1"
}

# compile_one CC FILE: 0 when it compiles cleanly; the diagnostics go to FILE.log.
compile_one() {
	"$1" -std=c11 -Wall -Wextra -Werror -O2 -Iinclude -c -o "$2.$1.o" "$2" >"$2.$1.log" 2>&1
}

# check DOC: one "PASS desc" or "FAIL desc" line per block and compiler, diagnostics as "#" lines.
check() {
	local doc=$1 dir k line cc
	dir=$tmp/$(printf '%s' "$doc" | tr '/.' '__')
	mkdir -p "$dir"
	while read -r k line; do
		if [ "$k" = unterminated ]; then
			echo "FAIL $doc:$line: \`c compile\` block never closed"
			continue
		fi
		for cc in gcc clang; do
			if compile_one "$cc" "$dir/$k.c"; then
				echo "PASS $doc:$line: block $k compiles ($cc)"
			else
				echo "FAIL $doc:$line: block $k does not compile ($cc)"
				sed 's/^/#   /' "$dir/$k.c.$cc.log" | head -20
			fi
		done
	done < <(extract "$doc" "$dir")
}

# report LINES: numbered TAP from check()'s output
report() {
	local l
	while IFS= read -r l; do
		case $l in
		"PASS "*) tap PASS "${l#PASS }" ;;
		"FAIL "*) tap FAIL "${l#FAIL }" ;;
		?*) echo "$l" ;;
		esac
	done <<<"$1"
}

for cc in gcc clang; do
	command -v "$cc" >/dev/null || {
		echo "not ok 1 - $cc not found (scripts/deps.sh installs it)"
		echo "1..1"
		exit 1
	}
done

# negative control: a good block, a broken one (a call with the wrong argument type, the kind
# of error an excerpt drifting from the headers makes), an unterminated one
ctl=$tmp/control.md
cat >"$ctl" <<'EOF'
# control
```c compile
#include <upcie/base/log.h>

void good(void)
{
	upcie_log_set_level(UPCIE_LOG_INFO);
}
```

```c
this plain block is not compiled
```

```c compile
#include <upcie/base/log.h>

void broken(void)
{
	upcie_log_set_level("info");
}
```

```c compile
int unterminated(void);
EOF
ctl_out=$(check "$ctl")
ctl_ok=$(printf '%s\n' "$ctl_out" | grep -c '^PASS ')
ctl_bad=$(printf '%s\n' "$ctl_out" | grep -c 'does not compile')
ctl_unt=$(printf '%s\n' "$ctl_out" | grep -c 'never closed')
if [ "$ctl_ok" = 2 ] && [ "$ctl_bad" = 2 ] && [ "$ctl_unt" = 1 ]; then
	tap PASS "negative control: a broken block and an unterminated one are caught, a good one passes, a plain one is skipped"
else
	tap FAIL "negative control: expected 2 passes, 2 compile failures, 1 unterminated; got $ctl_ok, $ctl_bad, $ctl_unt"
	printf '%s\n' "$ctl_out" | sed 's/^/#   /'
fi

if [ $# -gt 0 ]; then
	docs=("$@")
else
	docs=(README.md docs/*.md)
fi
blocks=0
for doc in "${docs[@]}"; do
	[ -f "$doc" ] || continue
	out=$(check "$doc")
	blocks=$((blocks + $(printf '%s\n' "$out" | grep -c '^\(PASS\|FAIL\) ')))
	report "$out"
done
[ "$blocks" -gt 0 ] || tap FAIL "no \`c compile\` block in ${docs[*]}"
echo "1..$n"
[ "$fail" -eq 0 ]
