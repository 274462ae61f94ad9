#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# API reference coverage: every public function of the headers (include/upcie/**.h, host and
# device code) has a comment right above it, which the reference (docs/Doxyfile.in) shows as its
# documentation. Public means a `static inline` function named upcie_*; a name ending in `_` is
# internal (the headers' convention) and exempt. Functions that a macro generates are documented
# at the macro's use and are not seen here (their definitions are indented inside the macro).
# One TAP line per header, offenders listed by line; then a negative control: the fixture
# tests/doc-coverage/fixture.h holds commented, internal, declared-only and two uncommented
# public functions, and the check must flag exactly the two.
#
#   scripts/check-doc-coverage.sh            the check plus its negative control
#   scripts/check-doc-coverage.sh FILE...    the named files only (exit 1 if any offender)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

# Print "LINE NAME" for each public function of $1 without a comment right above it.
undocumented() {
	awk '
	# A definition starts at column 0 (macro bodies are indented) and has static and inline
	# before the name, which is on the same line or, after a long return type, the next one.
	# A prototype (a ";" before any "{") is not a definition: its definition has the comment.
	function candidate(line, above, text) {
		match(text, /upcie_[A-Za-z0-9_]+[ \t]*\(/)
		name = substr(text, RSTART, RLENGTH)
		sub(/[ \t]*\($/, "", name)
		cline = line
		cabove = above
	}
	function settle(text) {
		if (name == "")
			return
		if (index(text, "{")) {
			if (name !~ /_$/ && cabove !~ /\*\/[ \t]*$/)
				print cline, name
			name = ""
		} else if (text ~ /;[ \t]*$/)
			name = ""
	}
	pending {
		pending = 0
		if (match($0, /upcie_[A-Za-z0-9_]+[ \t]*\(/))
			candidate(pline, pabove, $0)
	}
	/^([^ \t#\/*].*[^A-Za-z0-9_])?static[ \t]+(.*[ \t])?inline[ \t]/ {
		# a template line sits between a C++ function and its comment
		above = (prev ~ /^template[ \t]*</) ? prev2 : prev
		if (match($0, /upcie_[A-Za-z0-9_]+[ \t]*\(/))
			candidate(NR, above, $0)
		else {
			pending = 1
			pline = NR
			pabove = above
		}
	}
	{
		settle($0)
		prev2 = prev
		prev = $0
	}' "$1"
}

n=0
fail=0
check_files() {
	local h out count
	for h in "$@"; do
		n=$((n + 1))
		out=$(undocumented "$h")
		if [ -z "$out" ]; then
			echo "ok $n - $h"
		else
			count=$(printf '%s\n' "$out" | wc -l)
			echo "not ok $n - $h: $count public function(s) without a comment"
			printf '%s\n' "$out" | sed "s|^\([0-9]*\) \(.*\)|# $h:\1: \2|"
			fail=$((fail + 1))
		fi
	done
}

if [ $# -gt 0 ]; then
	check_files "$@"
	echo "1..$n"
	[ "$fail" -eq 0 ]
	exit
fi

mapfile -t headers < <(find include/upcie -name '*.h' | sort)
check_files "${headers[@]}"

# Negative control: the check must flag the fixture's uncommented functions, and only those.
n=$((n + 1))
fixture=tests/doc-coverage/fixture.h
got=$(undocumented "$fixture" | awk '{print $2}' | sort | tr '\n' ' ')
want="upcie_fixture_long_return upcie_fixture_uncommented "
if [ "$got" = "$want" ]; then
	echo "ok $n - negative control: $fixture's uncommented functions are flagged (${got% })"
else
	echo "not ok $n - negative control: flagged '${got% }', expected '${want% }'"
	fail=$((fail + 1))
fi
echo "1..$n"
[ "$fail" -eq 0 ]
